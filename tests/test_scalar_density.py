"""The scalar ETN's fused training objective (etn_cli.heads.scalar_density) against the
straightforward formula in float64: the shared lgamma/digamma evaluation, the density, the
hand-written gradient, the compiled kernel, and when each path is taken."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from etn_cli.heads import scalar_density
from etn_cli.heads.edl import expected_dirichlet_log_density
from etn_cli.heads.etn import ETN
from etn_cli.heads.scalar_density import (
    _ScalarLogDensity,
    density_and_sums,
    lgamma_digamma,
    scalar_log_density,
    use_fused,
)

NU = 1e4


def inputs(scale: float, m: int = 20, b: int = 16, c: int = 300, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(b, c, generator=generator) * scale
    labels = torch.randint(0, c, (b,), generator=generator)
    shape, rate = torch.full((m, b, 1), 2.0), torch.full((m, b, 1), 1.0)
    a = torch._standard_gamma(shape, generator=generator) / rate
    return a.requires_grad_(), z, torch.tensor([0.7], requires_grad=True), labels


def reference(a, z, b, labels):
    """The plain formula in float64 with autograd: the density (M, B) and its gradients."""
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    density = expected_dirichlet_log_density(F.softplus(a64 * z.double()) + b64, labels, NU)
    density.sum().backward()
    return density.detach(), a64.grad, b64.grad


def test_lgamma_and_digamma_agree_with_torch_in_float64_over_the_whole_range():
    x = torch.cat([torch.logspace(-4, 7.9, 20_000), torch.rand(20_000) * 6 + 1e-4]).float()
    lgamma, digamma = lgamma_digamma(x)
    x64 = x.double()
    scale = torch.lgamma(x64).abs().clamp_min(1)
    assert ((lgamma.double() - torch.lgamma(x64)).abs() / scale).max() < 3e-6
    scale = torch.digamma(x64).abs().clamp_min(1)
    assert ((digamma.double() - torch.digamma(x64)).abs() / scale).max() < 3e-6


@pytest.mark.parametrize("scale", [0.1, 3.0, 30.0])
def test_fused_density_and_its_hand_written_gradient_match_autograd_in_float64(scale):
    a, z, b, labels = inputs(scale)
    expected, grad_a, grad_b = reference(a, z, b, labels)
    density = _ScalarLogDensity.apply(density_and_sums, a, z, b, labels, NU)  # eager kernel
    density.sum().backward()
    assert abs(density.double().mean() / expected.mean() - 1) < 1e-5
    torch.testing.assert_close(density.double(), expected, rtol=1e-4, atol=1e-2)
    torch.testing.assert_close(a.grad.double(), grad_a, rtol=1e-4, atol=1e-4 * grad_a.abs().max())
    torch.testing.assert_close(b.grad.double(), grad_b, rtol=1e-5, atol=0)


def test_compiled_kernel_gives_the_same_loss_and_gradients():
    for batch in (16, 5):  # a second batch size reuses the dynamic-shape kernel
        a, z, b, labels = inputs(3.0, b=batch)
        expected, grad_a, grad_b = reference(a, z, b, labels)
        density = scalar_log_density(a, z, b, labels, NU, fused=True)
        density.sum().backward()
        assert scalar_density._compiled.get("kernel") is not None, "the kernel did not compile"
        assert abs(density.double().mean() / expected.mean() - 1) < 1e-5
        scale = grad_a.abs().max()
        torch.testing.assert_close(a.grad.double(), grad_a, rtol=1e-4, atol=1e-4 * scale)
        torch.testing.assert_close(b.grad.double(), grad_b, rtol=1e-5, atol=0)


def test_the_compiled_path_is_chosen_for_large_cpu_fits_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("ETN_COMPILE", raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    imagenet, cifar = 20 * 10_000 * 1000 * 50, 20 * 2500 * 10 * 50  # draws x rows x C x epochs
    assert use_fused(cpu, imagenet)
    assert not use_fused(cpu, cifar)
    assert not use_fused(cuda, imagenet)  # the GPU's own lgamma/digamma kernels are fast
    monkeypatch.setenv("ETN_COMPILE", "0")
    assert not use_fused(cpu, imagenet)
    monkeypatch.setenv("ETN_COMPILE", "1")
    assert use_fused(cpu, cifar)


def test_values_that_could_overflow_the_recurrence_take_the_plain_formula():
    a, z, b, labels = inputs(1.0, b=4, c=20)
    z = z * 1e9  # alpha up to ~1e9: x^4 would overflow float32
    expected, _, _ = reference(a, z, b, labels)
    density = scalar_log_density(a, z, b, labels, NU, fused=True)
    density.sum().backward()
    assert torch.isfinite(density).all() and torch.isfinite(a.grad).all()
    assert abs(density.double().mean() / expected.mean() - 1) < 1e-5


def test_scalar_etn_trains_the_same_with_and_without_the_compiled_kernel(
    monkeypatch, features_factory
):
    data = features_factory(n=200, d=8, c=40, seed=5)
    histories = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("ETN_COMPILE", setting)
        head = ETN(epochs=3, batch_size=50, seed=1)
        head.fit(data.hidden, data.logits, data.labels)
        assert head.fused_ == (setting == "1")
        histories[setting] = head.history_
    np.testing.assert_allclose(histories["1"], histories["0"], rtol=1e-4)
