"""The matrix-variant math of etn_cli/heads/matrix.py against explicit Kronecker covariances,
torch.distributions and Monte Carlo (paper supplementary, "Modeling Transformation
Parameterizations")."""

import numpy as np
import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from etn_cli.errors import EtnError
from etn_cli.heads.matrix import (
    GIB,
    apply_softplus_diagonal,
    check_matrix_feasible,
    gaussian_prior_from_mode_variance,
    lower_triangular_factor,
    matrix_memory_bytes,
    matrix_normal_kl,
    odir_penalty,
    sample_matrix_normal,
    transform_logits,
)

F64 = torch.float64


def _random_factors(seed: int, batch: int, c: int) -> tuple[torch.Tensor, ...]:
    """Random ``mu`` and lower-triangular ``L_B``, ``L_D`` with positive diagonal (B, C, C)."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(batch, c, c, generator=g, dtype=F64)
    l_b = lower_triangular_factor(torch.randn(batch, c, c, generator=g, dtype=F64))
    l_d = lower_triangular_factor(torch.randn(batch, c, c, generator=g, dtype=F64))
    return mu, l_b, l_d


def _vec(a: np.ndarray) -> np.ndarray:
    """Column-stacking ``vec`` of the last two axes (Fortran order), (..., C, C) -> (..., C^2)."""
    return np.stack([x.reshape(-1, order="F") for x in a.reshape(-1, *a.shape[-2:])]).reshape(
        *a.shape[:-2], -1
    )


# ----------------------------------------------------------------------------- sampling
def test_samples_of_vec_a_have_mean_mu_and_covariance_b_kron_d():
    c = 3
    mu = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, 1.0], [-1.0, 0.2, 2.0]], dtype=F64)
    l_b = torch.tensor([[1.5, 0.0, 0.0], [0.8, 0.6, 0.0], [-0.4, 0.3, 0.9]], dtype=F64)
    l_d = torch.tensor([[0.5, 0.0, 0.0], [-0.2, 1.2, 0.0], [0.7, 0.1, 0.4]], dtype=F64)
    g = torch.Generator().manual_seed(0)
    draws = sample_matrix_normal(mu[None], l_b[None], l_d[None], 200_000, generator=g)
    assert draws.shape == (200_000, 1, c, c)

    vecs = _vec(draws[:, 0].numpy())  # (n, C^2)
    b, d = (l_b @ l_b.T).numpy(), (l_d @ l_d.T).numpy()
    expected = np.kron(b, d)
    empirical = np.cov(vecs, rowvar=False)
    np.testing.assert_allclose(vecs.mean(0), _vec(mu.numpy()), atol=0.02)
    np.testing.assert_allclose(empirical, expected, atol=0.05 * np.abs(expected).max())
    # The other Kronecker order is far off, so the test does pin the convention down.
    assert np.abs(empirical - np.kron(d, b)).max() > 0.5


def test_gradients_flow_to_mu_and_both_cholesky_factors_through_the_samples():
    mu, l_b, l_d = (t.clone().requires_grad_() for t in _random_factors(1, batch=2, c=3))
    z = torch.randn(2, 3, dtype=F64)
    a = apply_softplus_diagonal(sample_matrix_normal(mu, l_b, l_d, 5))
    transform_logits(a, z).square().sum().backward()
    for tensor in (mu, l_b, l_d):
        assert tensor.grad is not None and tensor.grad.abs().sum() > 0


def test_transform_logits_multiplies_every_draw_by_its_rows_logits():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 3, 5, 5, generator=g, dtype=F64)
    z = torch.randn(3, 5, generator=g, dtype=F64)
    out = transform_logits(a, z)
    assert out.shape == (4, 3, 5)
    expected = np.einsum("mbij,bj->mbi", a.numpy(), z.numpy())
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)


def test_softplus_diagonal_makes_the_diagonal_positive_and_keeps_off_diagonals():
    g = torch.Generator().manual_seed(3)
    a = 5 * torch.randn(4, 2, 6, 6, generator=g, dtype=F64)
    out = apply_softplus_diagonal(a)
    diag = out.diagonal(dim1=-2, dim2=-1)
    assert (diag > 0).all()
    np.testing.assert_allclose(diag.numpy(), np.log1p(np.exp(np.diagonal(a.numpy(), 0, -2, -1))))
    off = ~torch.eye(6, dtype=torch.bool)
    assert torch.equal(out[..., off], a[..., off])


def test_lower_triangular_factor_is_lower_triangular_with_positive_diagonal():
    raw = -10 * torch.ones(2, 4, 4, dtype=F64)
    factor = lower_triangular_factor(raw)
    assert torch.equal(factor, torch.tril(factor))
    assert (factor.diagonal(dim1=-2, dim2=-1) > 0).all()


# ----------------------------------------------------------------------------- KL and prior
@pytest.mark.parametrize("c", [2, 3, 4])
def test_matrix_normal_kl_equals_torch_kl_with_the_explicit_kronecker_covariance(c: int):
    mu, l_b, l_d = _random_factors(10 + c, batch=3, c=c)
    prior_mean, prior_var = gaussian_prior_from_mode_variance(10.0, 5.0)
    got = matrix_normal_kl(mu, l_b, l_d, prior_mean, prior_var)
    assert got.shape == (3,)
    prior = MultivariateNormal(
        prior_mean * torch.eye(c, dtype=F64).reshape(-1), prior_var * torch.eye(c * c, dtype=F64)
    )
    for row in range(3):
        cov = torch.kron(l_b[row] @ l_b[row].T, l_d[row] @ l_d[row].T)
        q = MultivariateNormal(torch.from_numpy(_vec(mu[row].numpy())), cov)
        assert got[row].item() == pytest.approx(kl_divergence(q, prior).item(), rel=1e-9)


def test_matrix_normal_kl_is_zero_at_the_prior():
    c, var = 3, 5.0
    eye = torch.eye(c, dtype=F64)[None]
    kl = matrix_normal_kl(10.0 * eye, var**0.5 * eye, eye, prior_mean=10.0, prior_var=var)
    assert kl.item() == pytest.approx(0.0, abs=1e-12)


def test_gaussian_prior_keeps_mode_and_variance_and_rejects_a_non_positive_variance():
    assert gaussian_prior_from_mode_variance(10, 5) == (10.0, 5.0)
    with pytest.raises(ValueError, match="variance"):
        gaussian_prior_from_mode_variance(10, 0)


# ----------------------------------------------------------------------------- ODIR
def test_odir_is_zero_for_a_diagonal_matrix():
    mu = torch.diag_embed(torch.tensor([[1.0, -4.0, 7.0]], dtype=F64))
    assert odir_penalty(mu).item() == 0.0


def test_odir_is_the_mean_squared_off_diagonal_entry():
    mu = torch.tensor([[[9.0, 1.0, -2.0], [0.0, 9.0, 3.0], [0.5, 0.0, 9.0]]], dtype=F64)
    expected = (1 + 4 + 0 + 9 + 0.25 + 0) / 6
    got = odir_penalty(mu)
    assert got.shape == (1,)
    assert got.item() == pytest.approx(expected, rel=1e-12)
    assert got.item() > 0


# ----------------------------------------------------------------------------- feasibility
def test_matrix_variant_is_refused_for_imagenet_at_the_papers_settings():
    with pytest.raises(EtnError, match='variant = "scalar" or "vector"') as info:
        check_matrix_feasible(1000, batch_size=64, mc_samples=20, limit_bytes=16 * GIB)
    assert "C = 1000" in str(info.value) and "\n" not in str(info.value)


def test_matrix_variant_is_allowed_for_ten_classes_at_batch_1024():
    check_matrix_feasible(10, batch_size=1024, mc_samples=20, limit_bytes=16 * GIB)


def test_memory_estimate_exceeds_the_draws_alone_and_grows_with_the_draw_count():
    c, b, m = 7, 3, 5
    draws = torch.zeros(m, b, c, c, dtype=F64)
    one_copy = draws.numel() * draws.element_size()
    assert matrix_memory_bytes(c, b, m, dtype_bytes=8) > 2 * one_copy  # draws and their gradient
    assert matrix_memory_bytes(c, b, 2 * m) > 1.5 * matrix_memory_bytes(c, b, m)
