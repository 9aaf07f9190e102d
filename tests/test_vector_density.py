"""The vector ETN's fused training objective (etn_cli.heads.vector_density) against the plain
formula with autograd in float64: density, hand-written gradients, the compiled kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_scalar_density import NU, reference  # the plain formula in float64
from torch.nn import functional as F

from etn_cli.heads.edl import expected_dirichlet_log_density
from etn_cli.heads.vector_density import _VectorLogDensity, vector_density, vector_log_density


def inputs(scale: float, m: int = 20, b: int = 16, c: int = 300, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(b, c, generator=generator) * scale
    labels = torch.randint(0, c, (b,), generator=generator)
    a = torch._standard_gamma(torch.full((m, b, c), 2.0), generator=generator)
    bias = torch.rand(c, generator=generator) + 0.2
    return a.requires_grad_(), z, bias.requires_grad_(), labels


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


def test_table_gamma_draws_have_the_gamma_moments_and_quantiles():
    """Mean k and variance k of Gamma(k, 1), and draws at fixed normals equal scipy's quantiles."""
    from scipy.special import gammaincinv, ndtr

    from etn_cli.heads.gamma_sampling import quantile_table, table_gamma

    generator = torch.Generator().manual_seed(0)
    shape = torch.tensor([0.3, 1.0, 4.0, 30.0, 3e4])
    x, _ = table_gamma(shape, torch.randn(200_000, 5, generator=generator), quantile_table())
    torch.testing.assert_close(x.double().mean(0), shape.double(), rtol=0.01, atol=0)
    torch.testing.assert_close(x.double().var(0), shape.double(), rtol=0.03, atol=0)
    w = torch.linspace(-4, 4, 17)[:, None]
    x, _ = table_gamma(shape, w.expand(17, 5), quantile_table())
    expected = gammaincinv(shape.double().numpy(), ndtr(w.double().numpy()))
    np.testing.assert_allclose(x.double().numpy(), expected, rtol=5e-4)


def test_table_gamma_gradient_is_the_implicit_reparameterisation_gradient():
    """dx/dk at fixed w against central differences of scipy's quantile, and torch's own
    _standard_gamma_grad at the same draws."""
    from scipy.special import gammaincinv, ndtr

    from etn_cli.heads.gamma_sampling import quantile_table, table_gamma

    shape = torch.tensor([0.2, 0.7, 1.0, 2.5, 9.0, 80.0, 2e4])
    w = torch.linspace(-3.5, 3.5, 15)[:, None].expand(15, 7)
    x, dxdk = table_gamma(shape, w, quantile_table())
    k, u, h = shape.double().numpy(), ndtr(w.double().numpy()), 1e-6
    expected = (gammaincinv(k * (1 + h), u) - gammaincinv(k * (1 - h), u)) / (2 * h * k)
    np.testing.assert_allclose(dxdk.double().numpy(), expected, rtol=1e-3, atol=1e-12)
    reference = torch._standard_gamma_grad(shape.expand(15, 7).double(), x.double())
    np.testing.assert_allclose(dxdk.double().numpy(), reference.numpy(), rtol=2e-3, atol=1e-12)


@pytest.mark.parametrize("kernel", ["eager", "compiled"])
def test_fused_gamma_density_gradients_match_float64_autograd_through_the_same_draws(kernel):
    """The fused loss's gradients in shape, rate and b against autograd in float64 of the plain
    formula, with the same draws entering as ``a = (x + dx/dk (k - k.detach())) / r``."""
    from etn_cli.heads import vector_density as vd
    from etn_cli.heads.gamma_sampling import quantile_table, table_gamma

    generator = torch.Generator().manual_seed(1)
    m, b, c = 6, 5, 40
    shape = (torch.rand(b, c, generator=generator) * 5 + 0.3).requires_grad_()
    rate = (torch.rand(b, c, generator=generator) + 0.5).requires_grad_()
    z = torch.randn(b, c, generator=generator) * 3
    bias = (torch.rand(c, generator=generator) + 0.2).requires_grad_()
    labels = torch.randint(0, c, (b,), generator=generator)
    normal = torch.randn(m, b, c, generator=generator)
    weights = torch.rand(b, generator=generator)
    function = vd.gamma_density if kernel == "eager" else vd._gamma_kernel()
    density = vd._GammaLogDensity.apply(function, shape, rate, normal, z, bias, labels, NU)
    (density * weights).sum().backward()

    x, dxdk = (t.double() for t in table_gamma(shape.detach(), normal, quantile_table()))
    k64, r64, b64 = (t.detach().double().requires_grad_() for t in (shape, rate, bias))
    a = (x + dxdk * (k64 - k64.detach())) / r64
    alpha = F.softplus(a * z.double()) + b64
    expected = expected_dirichlet_log_density(alpha, labels, NU).mean(0)
    (expected * weights.double()).sum().backward()
    torch.testing.assert_close(density.double(), expected.detach(), rtol=1e-5, atol=1e-3)
    for got, want in ((shape, k64), (rate, r64), (bias, b64)):
        scale = want.grad.abs().max()
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-4, atol=1e-4 * scale)


def test_table_gamma_gradient_is_unbiased_for_the_mean():
    """The mean over many draws of dx/dk equals d E[x] / dk = 1."""
    from etn_cli.heads.gamma_sampling import quantile_table, table_gamma

    shape = torch.full((4000,), 2.5)
    normal = torch.randn(50, 4000, generator=torch.Generator().manual_seed(2))
    _, dxdk = table_gamma(shape, normal, quantile_table())
    assert abs(dxdk.double().mean().item() - 1.0) < 0.01  # d E[x] / dk = 1


@pytest.mark.parametrize("draws", [20, 7])
def test_level_gamma_equals_scipys_quantiles_at_the_stratified_levels_at_every_shape(draws):
    """The prediction's tabulated quantiles (LevelGamma) against gammaincinv, for shapes from
    5e-5 (below the table, where gammaincinv is called) through the table's ends to 3e7 (above
    it): 1e-7 relative wherever the quantile is a normal float64, below 1e-270 where it
    underflows."""
    from scipy.special import gammaincinv

    from etn_cli.heads import gamma_sampling as gs

    rng = np.random.default_rng(draws)
    ends = np.exp([gs.LEVEL_LOG_K_MIN, gs.LEVEL_LOG_K_MAX])
    edges = [5e-5, ends[0], np.float32(1e-4), 0.01, 0.1, 1.0, 1e4, ends[1], 3e7]
    shape = np.concatenate([np.exp(rng.uniform(np.log(5e-5), np.log(3e7), 3000)), edges])
    shape = shape.reshape(3, -1)  # (n, K)
    level = np.stack([rng.permutation(draws) for _ in range(shape.shape[1])], 1)  # (M, K)
    quantiles = gs.LevelGamma(torch.from_numpy(shape), draws)
    x = torch.stack([quantiles(row) for row in torch.from_numpy(level)]).numpy()
    expected = gammaincinv(shape[None], gs.level_quantiles(draws)[level][:, None])
    assert x.shape == expected.shape == (draws, *shape.shape)
    normal = expected > 1e-280
    assert 0.6 < normal.mean() < 0.95  # both regimes are exercised
    np.testing.assert_allclose(x[normal], expected[normal], rtol=1e-7, atol=0)
    assert (x[~normal] < 1e-270).all() and (x >= 0).all()
    # one draw at a time gives the same values
    one = gs.LevelGamma(torch.from_numpy(shape), draws)(torch.from_numpy(level[3]))
    np.testing.assert_array_equal(one.numpy(), x[3])
