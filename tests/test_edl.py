"""The evidential math of etn_cli/heads/edl.py against closed forms, torch.distributions, scipy
and Monte Carlo (DESIGN §2)."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize, special, stats
from torch.distributions import Dirichlet, Gamma, kl_divergence

from etn_cli.heads.edl import (
    dirichlet_kl_to_target,
    expected_dirichlet_log_density,
    gamma_kl,
    gamma_prior,
    target_log_pi,
)

F64 = torch.float64


def _random_alpha(seed: int, shape: tuple[int, ...], low: float = 0.2, high: float = 8.0):
    generator = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(shape, generator=generator, dtype=F64)


def _target(labels: torch.Tensor, num_classes: int, nu: float) -> torch.Tensor:
    """``alpha^y = 1 + (nu - 1) e_y`` built explicitly, row by row (B, C)."""
    target = torch.ones(len(labels), num_classes, dtype=F64)
    for row, label in enumerate(labels.tolist()):
        target[row, label] = nu
    return target


# ----------------------------------------------------------------------------- gamma_prior
def test_gamma_prior_of_mode_10_and_variance_5_matches_the_papers_numbers():
    shape, rate = gamma_prior(10, 5)
    assert shape == pytest.approx(21.954, abs=5e-4)
    assert rate == pytest.approx(2.0954, abs=5e-5)


@pytest.mark.parametrize(("mode", "variance"), [(10, 5), (5, 5), (100, 5), (0.5, 0.1), (3, 40)])
def test_gamma_prior_has_the_requested_mode_and_variance(mode, variance):
    shape, rate = gamma_prior(mode, variance)
    assert (shape - 1) / rate == pytest.approx(mode, rel=1e-12)
    assert shape / rate**2 == pytest.approx(variance, rel=1e-12)
    scipy_gamma = stats.gamma(a=shape, scale=1 / rate)
    assert scipy_gamma.var() == pytest.approx(variance, rel=1e-10)
    # The mode is where the density peaks: find it numerically, independently of the formula.
    peak = optimize.minimize_scalar(
        lambda x: -scipy_gamma.logpdf(x), bounds=(1e-9, 10 * mode + 10), method="bounded",
        options={"xatol": 1e-10},
    )  # fmt: skip
    assert peak.x == pytest.approx(mode, rel=1e-5)


@pytest.mark.parametrize(("mode", "variance"), [(0, 5), (-1, 5), (10, 0)])
def test_gamma_prior_rejects_non_positive_mode_or_variance(mode, variance):
    with pytest.raises(ValueError, match="positive"):
        gamma_prior(mode, variance)


# ----------------------------------------------------------------------------- gamma_kl
def test_gamma_kl_equals_torch_distributions_kl_divergence():
    generator = torch.Generator().manual_seed(0)
    shape = 0.1 + 30 * torch.rand(50, 3, generator=generator, dtype=F64)
    rate = 0.05 + 10 * torch.rand(50, 3, generator=generator, dtype=F64)
    for prior_shape, prior_rate in [gamma_prior(10, 5), gamma_prior(100, 5), (0.7, 3.0)]:
        expected = kl_divergence(
            Gamma(shape, rate),
            Gamma(torch.tensor(prior_shape, dtype=F64), torch.tensor(prior_rate, dtype=F64)),
        )
        got = gamma_kl(shape, rate, prior_shape, prior_rate)
        assert got.shape == shape.shape
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("shape", "rate"), [(3.0, 0.5), (21.954, 2.0954), (1.5, 4.0)])
def test_gamma_kl_matches_a_monte_carlo_estimate(shape, rate):
    prior_shape, prior_rate = gamma_prior(10, 5)
    q = Gamma(torch.tensor(shape, dtype=F64), torch.tensor(rate, dtype=F64))
    p = Gamma(torch.tensor(prior_shape, dtype=F64), torch.tensor(prior_rate, dtype=F64))
    torch.manual_seed(1)
    draws = q.sample((400_000,))
    log_ratio = q.log_prob(draws) - p.log_prob(draws)
    standard_error = log_ratio.std().item() / math.sqrt(len(draws))
    got = gamma_kl(
        torch.tensor(shape, dtype=F64), torch.tensor(rate, dtype=F64), prior_shape, prior_rate
    )
    assert got.item() == pytest.approx(log_ratio.mean().item(), abs=5 * standard_error + 1e-9)


def test_gamma_kl_is_zero_at_the_prior_and_positive_elsewhere():
    prior = gamma_prior(10, 5)
    at_prior = gamma_kl(
        torch.tensor([prior[0]], dtype=F64), torch.tensor([prior[1]], dtype=F64), *prior
    )
    assert at_prior.item() == pytest.approx(0.0, abs=1e-12)
    away = gamma_kl(
        torch.tensor([2.0, 50.0], dtype=F64), torch.tensor([1.0, 2.0], dtype=F64), *prior
    )
    assert (away > 0).all()


# ----------------------------------------------------------------------------- dirichlet KL
@pytest.mark.parametrize("nu", [2.0, 20.0, 1e4])
@pytest.mark.parametrize("num_classes", [2, 5, 10])
def test_dirichlet_kl_to_target_equals_torch_distributions_kl_divergence(nu, num_classes):
    alpha = _random_alpha(num_classes, (32, num_classes), low=0.05, high=50.0)
    labels = torch.arange(32) % num_classes
    expected = kl_divergence(Dirichlet(alpha), Dirichlet(_target(labels, num_classes, nu)))
    got = dirichlet_kl_to_target(alpha, labels, nu)
    assert got.shape == (32,)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-8)


def test_dirichlet_kl_to_target_is_zero_at_the_target():
    labels = torch.tensor([0, 2, 1])
    target = _target(labels, 3, 20.0)
    got = dirichlet_kl_to_target(target, labels, 20.0)
    torch.testing.assert_close(got, torch.zeros(3, dtype=F64), rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------- E[log Dir]
@pytest.mark.parametrize("num_classes", [2, 4])
def test_expected_dirichlet_log_density_matches_a_monte_carlo_average(num_classes):
    nu = 20.0
    alpha = _random_alpha(3, (6, num_classes), low=0.5, high=5.0)
    labels = torch.arange(6) % num_classes
    torch.manual_seed(2)
    pi = Dirichlet(_target(labels, num_classes, nu)).sample((200_000,))  # (S, B, C)
    log_density = Dirichlet(alpha).log_prob(pi)  # (S, B)
    standard_error = log_density.std(0) / math.sqrt(len(pi))
    got = expected_dirichlet_log_density(alpha, labels, nu)
    assert got.shape == (6,)
    assert ((got - log_density.mean(0)).abs() <= 5 * standard_error + 1e-6).all()


@pytest.mark.parametrize("nu", [20.0, 1e4])
def test_expected_dirichlet_log_density_equals_the_explicit_sum_over_classes(nu):
    num_classes = 5
    alpha = _random_alpha(4, (16, num_classes), low=0.01, high=100.0)
    labels = torch.arange(16) % num_classes
    target = _target(labels, num_classes, nu).numpy()
    e_log_pi = special.digamma(target) - special.digamma(target.sum(1, keepdims=True))
    a = alpha.numpy()
    expected = special.gammaln(a.sum(1)) - special.gammaln(a).sum(1) + ((a - 1) * e_log_pi).sum(1)
    got = expected_dirichlet_log_density(alpha, labels, nu).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-9)


def test_expected_dirichlet_log_density_broadcasts_over_a_leading_mc_dimension():
    alpha = _random_alpha(5, (7, 9, 3))  # (M, B, C)
    labels = torch.tensor([0, 1, 2, 2, 1, 0, 0, 1, 2])
    got = expected_dirichlet_log_density(alpha, labels, 1e4)
    assert got.shape == (7, 9)
    for m in range(7):
        torch.testing.assert_close(
            got[m], expected_dirichlet_log_density(alpha[m], labels, 1e4), rtol=0, atol=0
        )


# ----------------------------------------------------------------------------- target_log_pi
@pytest.mark.parametrize("num_classes", [2, 10, 1000])
@pytest.mark.parametrize("nu", [1.0, 20.0, 1e4])
def test_target_log_pi_matches_scipy_digamma(num_classes, nu):
    c_y, c_other = target_log_pi(num_classes, nu)
    total = special.digamma(nu + num_classes - 1)
    assert c_y == pytest.approx(special.digamma(nu) - total, rel=1e-12, abs=1e-12)
    assert c_other == pytest.approx(special.digamma(1.0) - total, rel=1e-12, abs=1e-12)
