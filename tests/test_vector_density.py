"""The vector ETN's fused training objective (etn_cli.heads.vector_density) against the plain
formula with autograd in float64: density, hand-written gradients, the compiled kernel."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from etn_cli.heads.edl import expected_dirichlet_log_density
from etn_cli.heads.vector_density import _VectorLogDensity, vector_density, vector_log_density

NU = 1e4


def inputs(scale: float, m: int = 20, b: int = 16, c: int = 300, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(b, c, generator=generator) * scale
    labels = torch.randint(0, c, (b,), generator=generator)
    a = torch._standard_gamma(torch.full((m, b, c), 2.0), generator=generator)
    bias = torch.rand(c, generator=generator) + 0.2
    return a.requires_grad_(), z, bias.requires_grad_(), labels


def reference(a, z, b, labels):
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    density = expected_dirichlet_log_density(F.softplus(a64 * z.double()) + b64, labels, NU)
    density.sum().backward()
    return density.detach(), a64.grad, b64.grad


def _check(density, a, b, expected, grad_a, grad_b) -> None:
    assert abs(density.double().mean() / expected.mean() - 1) < 1e-5
    torch.testing.assert_close(density.double(), expected, rtol=1e-4, atol=1e-2)
    scale = grad_a.abs().max()
    torch.testing.assert_close(a.grad.double(), grad_a, rtol=1e-4, atol=1e-4 * scale)
    torch.testing.assert_close(b.grad.double(), grad_b, rtol=1e-4, atol=1e-4 * grad_b.abs().max())


@pytest.mark.parametrize("scale", [0.1, 3.0, 30.0])
def test_fused_vector_density_and_its_hand_written_gradient_match_autograd_in_float64(scale):
    a, z, b, labels = inputs(scale)
    expected, grad_a, grad_b = reference(a, z, b, labels)
    density = _VectorLogDensity.apply(vector_density, a, z, b, labels, NU)  # eager kernel
    density.sum().backward()
    _check(density, a, b, expected, grad_a, grad_b)


def test_compiled_vector_kernel_gives_the_same_loss_and_gradients():
    for batch in (16, 5):
        a, z, b, labels = inputs(3.0, b=batch)
        expected, grad_a, grad_b = reference(a, z, b, labels)
        density = vector_log_density(a, z, b, labels, NU, fused=True)
        assert density.grad_fn.name().endswith("_VectorLogDensityBackward")
        density.sum().backward()
        _check(density, a, b, expected, grad_a, grad_b)
