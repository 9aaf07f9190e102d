"""The scalar, vector and matrix transformations of ETN and static scaling (paper Supp.
"Modeling Transformation Parameterizations"): each variant keeps the head contract, and each does
what it promises, checked against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence
from torch.nn import functional as F

from etn_cli.errors import EtnError
from etn_cli.heads import Head
from etn_cli.heads.edl import expected_dirichlet_log_density
from etn_cli.heads.etn import ETN
from etn_cli.heads.static import Static

VARIANTS = [(cls, v) for cls in (ETN, Static) for v in ("scalar", "vector", "matrix")]


@pytest.fixture(scope="module")
def data(features_factory):
    return features_factory(n=240, d=12, c=4, seed=3)


@pytest.fixture(scope="module")
def test_data(features_factory):
    return features_factory(n=120, d=12, c=4, seed=3, split=1)


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda p: f"{p[0].name}-{p[1]}")
def fitted(request, data) -> Head:
    cls, variant = request.param
    return cls(variant=variant, epochs=4, batch_size=64).fit(data.hidden, data.logits, data.labels)


def test_every_variant_gives_valid_probabilities_and_dirichlet_scores(fitted, test_data):
    pred = fitted.predict(test_data.hidden, test_data.logits)
    assert pred.probs.shape == (120, 4)
    assert (pred.probs >= 0).all()
    np.testing.assert_allclose(pred.probs.sum(1), 1.0, rtol=1e-9)
    assert set(pred.scores) == {"mp", "um", "mi", "de"}
    assert (pred.alpha > 0).all()
    np.testing.assert_allclose(pred.scores["mp"], pred.probs.max(1))


def test_every_variant_round_trips_through_save_and_load(fitted, test_data, tmp_path):
    fitted.save(tmp_path)
    loaded = Head.load(tmp_path)
    assert loaded.variant == fitted.variant
    a = fitted.predict(test_data.hidden, test_data.logits)
    b = loaded.predict(test_data.hidden, test_data.logits)
    np.testing.assert_array_equal(a.probs, b.probs)
    np.testing.assert_array_equal(a.alpha, b.alpha)


def test_every_variant_predicts_a_row_the_same_in_any_batch(fitted, test_data):
    whole = fitted.predict(test_data.hidden, test_data.logits)
    part = fitted.predict(test_data.hidden[50:61], test_data.logits[50:61])
    np.testing.assert_allclose(part.probs, whole.probs[50:61], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(part.scores["mi"], whole.scores["mi"][50:61], rtol=1e-6)


def test_every_variant_is_named_in_reports(fitted):
    label = fitted.display_label
    assert (fitted.variant in label) == (fitted.variant != "scalar")


@pytest.mark.parametrize("cls", [ETN, Static])
def test_vector_and_matrix_variants_learn_one_b_per_class(cls, data):
    for variant, n_b in (("scalar", 1), ("vector", 4), ("matrix", 4)):
        head = cls(variant=variant, epochs=1).fit(data.hidden, data.logits, data.labels)
        b = head.b_raw_ if cls is ETN else head.module_.b_raw
        assert b.shape == (n_b,), variant


def test_vector_etn_predicts_one_gamma_per_class(data):
    head = ETN(variant="vector", epochs=1).fit(data.hidden, data.logits, data.labels)
    shape, rate = head.net_(torch.as_tensor(data.hidden[:5]))
    assert shape.shape == rate.shape == (5, 4)
    assert (shape > 0).all() and (rate > 0).all()


def test_vector_etn_prediction_equals_the_mc_marginal_over_exact_gamma_quantiles(data, test_data):
    """The vector variant's prediction (tabulated quantiles, one draw at a time) against the MC
    marginal over gammaincinv's stratified draws (``quantile_draws``), with the shapes spread
    from 1e-4 to beyond the table (3e7) by the shape net's last bias."""
    head = ETN(variant="vector", epochs=1).fit(data.hidden, data.logits, data.labels)
    with torch.no_grad():
        head.net_.shape_net[-1].bias.copy_(torch.tensor([-20.0, -1.0, 30.0, 3e7]))
    h, z = torch.as_tensor(test_data.hidden), torch.as_tensor(test_data.logits)
    with torch.no_grad():
        shape, rate = head.net_(h)
        draws = head.quantile_draws(shape.double().numpy(), rate.double().numpy())
        alpha = F.softplus(torch.from_numpy(draws) * z.double()) + head.b_.double()
    assert shape.min() < 2e-4 and shape.max() > 1e7
    got = head.predict(test_data.hidden, test_data.logits)
    expected = (alpha / alpha.sum(-1, keepdim=True)).mean(0).numpy()
    np.testing.assert_allclose(got.probs, expected, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(got.alpha, alpha.mean(0).numpy(), rtol=1e-7)


def test_matrix_etn_loss_equals_an_independent_computation_with_the_full_covariance(data):
    """The training loss (MC NLL + KL + ODIR) against torch.distributions with the explicit
    C^2 x C^2 covariance kron(B, D) and the same standard-normal draws."""
    head = ETN(variant="matrix", epochs=1, mc_samples=3, kl_weight=0.7, odir_weight=0.3)
    head.fit(data.hidden, data.logits, data.labels)
    h, z = torch.as_tensor(data.hidden[:6]), torch.as_tensor(data.logits[:6])
    y = torch.as_tensor(data.labels[:6])
    torch.manual_seed(11)
    got = head.loss(h, z, y).detach().double()

    torch.manual_seed(11)
    mu, l_b, l_d = (t.detach().double() for t in head.net_(h))
    noise = torch.randn((3, 6, 4, 4), dtype=torch.float32).double()
    c, (m0, v) = 4, head.prior_
    b = head.b_.detach().double()
    expected = []
    for i in range(6):
        cov = torch.kron(l_b[i] @ l_b[i].T, l_d[i] @ l_d[i].T)  # Cov(vec A), columns stacked
        chol = torch.linalg.cholesky(cov)
        vec_mu = mu[i].T.reshape(-1)  # column-stacking vec
        draws = vec_mu + (chol @ _kron_noise(noise[:, i], l_b[i], l_d[i], chol)).T  # (M, C^2)
        a = draws.reshape(3, c, c).mT  # back from column-stacked vectors
        a = a.diagonal_scatter(F.softplus(a.diagonal(dim1=-2, dim2=-1)), dim1=-2, dim2=-1)
        alpha = F.softplus(a @ z[i].double()) + b  # (M, C)
        nll = -expected_dirichlet_log_density(alpha[:, None], y[i : i + 1], 1e4).mean()
        prior = MultivariateNormal(m0 * torch.eye(c).double().T.reshape(-1), v * torch.eye(c * c))
        kl = kl_divergence(MultivariateNormal(vec_mu, cov), prior)
        off = (mu[i] ** 2).sum() - (mu[i].diagonal() ** 2).sum()
        expected.append(nll + 0.7 * kl + 0.3 * off / (c * (c - 1)))
    torch.testing.assert_close(got, torch.stack(expected), rtol=2e-4, atol=2e-4)


def _kron_noise(e, l_b, l_d, chol):
    """The standard normals that make ``chol @ x`` equal ``vec(L_D E L_B^T)`` for each draw:
    ``x = chol^-1 (L_B (x) L_D) vec(E)``, so both sides use the same randomness."""
    kron = torch.kron(l_b, l_d)
    vec_e = e.mT.reshape(e.shape[0], -1).T  # (C^2, M), column-stacked
    return torch.linalg.solve_triangular(chol, kron @ vec_e, upper=False)


def test_matrix_etn_refuses_up_front_when_it_would_not_fit_in_memory():
    hidden = np.zeros((64, 4), dtype=np.float32)
    logits = np.random.default_rng(0).normal(size=(64, 1000)).astype(np.float32)
    labels = np.arange(64)
    head = ETN(variant="matrix", batch_size=1024, memory_limit_gib=16.0)
    with pytest.raises(EtnError, match=r'GiB for C = 1000.*variant = "scalar" or "vector"'):
        head.fit(hidden, logits, labels)
    assert head.n_classes_ == 1000 and not hasattr(head, "net_")  # nothing was built


def test_matrix_etn_with_a_strong_prior_stays_at_the_prior_mode(data):
    """With lambda large the KL dominates: mu -> prior_mode * I (the scalar's transformation)."""
    head = ETN(variant="matrix", epochs=12, batch_size=64, kl_weight=1e3, prior_mode=3.0, lr=1e-2)
    head.fit(data.hidden, data.logits, data.labels)
    mu, _, _ = head.net_(torch.as_tensor(data.hidden[:20]))
    torch.testing.assert_close(mu.mean(0), 3.0 * torch.eye(4), atol=0.3, rtol=0)


def test_static_matrix_applies_softplus_on_the_diagonal_and_keeps_off_diagonals(data):
    head = Static(variant="matrix", epochs=20, batch_size=64).fit(
        data.hidden, data.logits, data.labels
    )
    raw = head.module_.a_raw.detach().double()
    a = raw.clone()
    a.diagonal().copy_(F.softplus(raw.diagonal()))
    b = F.softplus(head.module_.b_raw.detach().double())
    z = torch.as_tensor(data.logits[:10]).double()
    alpha = F.softplus(z @ a.T) + b
    np.testing.assert_allclose(head.predict(data.hidden[:10], data.logits[:10]).alpha, alpha)
    assert (raw - torch.diag(raw.diagonal())).abs().max() > 0  # off-diagonals were learned


def test_static_matrix_starts_at_a_scaled_identity():
    head = Static(variant="matrix", a_init=2.0)
    head._build(3)
    torch.testing.assert_close(head.module_.matrix().detach(), 2.0 * torch.eye(3))
    assert math.isclose(F.softplus(head.module_.b_raw).mean().item(), 1.0, rel_tol=1e-6)
