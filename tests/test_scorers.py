"""Every post-hoc scorer against an independent computation on small arrays: numpy written
out from each paper's formula (loops where the scorer vectorises), and closed forms where
they exist. pytorch-ood runs beside them in tests/test_scorers_pytorch_ood.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, softmax

from etn_cli.errors import EtnError
from etn_cli.heads import Head, heads
from etn_cli.heads.scorers.base import Scorer
from tests.scorer_data import make_scorer_data

SCORERS = sorted(n for n in heads.names() if issubclass(heads.get(n), Scorer))


@pytest.fixture(scope="module")
def data():
    return make_scorer_data()


def fitted(name: str, data, **settings):
    return heads.get(name)(**settings).fit(
        data.h_fit, data.z_fit, data.y_fit, classifier=data.classifier
    )


def own(name: str, data, **settings) -> np.ndarray:
    head = fitted(name, data, **settings)
    return head.predict(data.h_test, data.z_test).scores[head.own_score]


def energy(logits: np.ndarray) -> np.ndarray:
    return logsumexp(logits.astype(np.float64), axis=1)


def logits_of(h: np.ndarray, data) -> np.ndarray:
    return h.astype(np.float64) @ data.weight.T.astype(np.float64) + data.bias


def assert_close(actual, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def test_every_scorer_is_a_posthoc_head_with_a_documented_direction():
    assert len(SCORERS) >= 23
    for name in SCORERS:
        cls = heads.get(name)
        assert cls.family == "posthoc" and cls.seed_free
        doc = (cls.__doc__ or "") + (sys.modules[cls.__module__].__doc__ or "")
        assert "higher = more" in " ".join(doc.split()), name


def test_logit_only_scores(data):
    z = data.z_test.astype(np.float64)
    p = softmax(z, axis=1)
    assert_close(own("max_logit", data), z.max(1))
    assert_close(own("entropy", data), -(p * np.log(p)).sum(1))
    top = -np.sort(-p, axis=1)[:, :2]
    assert_close(own("gen", data, gamma=0.3, top_m=2), -(top**0.3 * (1 - top) ** 0.3).sum(1))
    assert_close(own("gradnorm", data), np.abs(p - 0.25).sum(1) * np.abs(data.h_test).sum(1))


def test_gen_and_entropy_of_confident_rows_keep_the_other_classes_mass():
    # p_max rounds to 1 in float64: 1 - p_max must come from the other classes' mass
    z = np.array([[40.0, 0.0, -1.0, 2.0], [45.0, 3.0, 1.0, -3.0]], np.float32)
    h = np.ones((2, 3), np.float32)
    d = z.astype(np.float64) - z.max(1, keepdims=True)
    e = np.exp(d)
    p = e / e.sum(1, keepdims=True)
    rest = np.sort(e, axis=1)[:, :-1].sum(1)  # the non-top terms, without 1 + r - 1
    q = np.where(d == 0, (rest / (1 + rest))[:, None], 1.0 - p)  # 1 - p, top class exactly
    gen = -(p**0.1 * q**0.1).sum(1)
    entropy = np.log1p(rest) - (e * d).sum(1) / (1 + rest)
    fitted = {n: heads.get(n)().fit(h, z, np.array([0, 0])) for n in ("gen", "entropy")}
    assert_close(fitted["gen"].score(h, z), gen, rtol=1e-12, atol=0)
    assert_close(fitted["entropy"].score(h, z), entropy, rtol=1e-12, atol=0)
    assert ((1.0 - p.max(1)) == 0).all()  # the naive formula would give gen's top term 0


@pytest.mark.parametrize("temperature", [1.0, 0.25, 1000.0])
def test_softmax_terms_of_far_apart_logits_equal_plain_exponentials(temperature):
    # entries whose exponential is subnormal or 0 in float32 (below -87.3), some just above
    # the clamp (-86.3), rows with every other entry far below, and a row of equal logits
    from etn_cli.heads.scorers import softmax_terms

    generator = torch.Generator().manual_seed(0)
    z = torch.randn(300, 1000, generator=generator) * 60
    z[:50, 1:] -= 400.0
    z[50:60] = 0.0
    z[60:70, 1] = z[60:70, 0] - 86.8  # between log(tiny) and the clamp
    z[70, 0] = 0.0  # largest logit exactly 0, the rest underflowing
    z[70, 1:] = -500.0

    def plain(dtype):  # the same terms with torch's exp on every entry
        block = z.to(dtype)
        m, index = block.max(dim=1, keepdim=True)
        rest = torch.exp((block - m) / temperature).scatter_(1, index, 0.0).sum(dim=1)
        return m[:, 0].double(), rest.double()

    top, rest = plain(torch.float32)
    assert torch.equal(softmax_terms.max_probability(z, temperature), 1.0 / (1.0 + rest))
    energy, plain_energy = (
        softmax_terms.energy(z, temperature),
        top + temperature * torch.log1p(rest),
    )
    others = torch.arange(len(z)) != 70
    assert torch.equal(energy[others], plain_energy[others])
    if temperature <= 1:  # a largest logit of exactly 0 shows the clamped entries' mass
        assert plain_energy[70] == 0.0 and 0.0 < energy[70] < 1e-34  # 999 x 3.2e-38 at most
    else:  # nothing underflows in row 70
        assert energy[70] == plain_energy[70]
    _, rest64 = plain(torch.float64)
    probability = softmax_terms.max_probability(z, temperature, torch.float64)
    assert torch.equal(probability, 1.0 / (1.0 + rest64))
    reference = softmax(z.double().numpy() / temperature, axis=1).max(1)
    assert_close(probability.numpy(), reference, rtol=1e-12, atol=0)
    reference = temperature * logsumexp(z.double().numpy() / temperature, axis=1)
    assert_close(energy.numpy(), reference, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("name", ["map", "energy", "max_logit", "entropy", "gen", "temperature"])
def test_a_logit_only_head_neither_reads_nor_scans_the_hidden_states(name, data):
    unread = np.full_like(data.h_fit, np.nan)  # a NaN here would be refused if it were read
    head = heads.get(name)().fit(unread, data.z_fit, data.y_fit)
    plain = heads.get(name)().fit(data.h_fit, data.z_fit, data.y_fit)
    test_unread = np.full_like(data.h_test, np.nan)
    np.testing.assert_array_equal(
        head.score(test_unread, data.z_test), plain.score(data.h_test, data.z_test)
    )


def test_temperature_minimises_the_adaptation_nll(data):
    head = fitted("temperature", data)
    t = float(head.temperature_)

    def nll(temp: float) -> float:
        logp = np.log(softmax(data.z_fit / temp, axis=1))
        return -logp[np.arange(len(data.y_fit)), data.y_fit].mean()

    assert nll(t) <= min(nll(t * 1.001), nll(t / 1.001))
    grid = np.exp(np.linspace(-3, 3, 2001))
    assert nll(t) <= min(nll(g) for g in grid) + 1e-9
    scaled = softmax(data.z_test / t, axis=1)
    prediction = head.predict(data.h_test, data.z_test)
    assert_close(prediction.probs, scaled)
    assert (prediction.predictions == data.z_test.argmax(1)).all()


def test_temperature_on_a_perfectly_classified_split_falls_back_to_laplaces_rule(data, tmp_path):
    y = data.z_fit.argmax(1)  # every adaptation row right: the NLL falls all the way to T -> 0
    with pytest.warns(UserWarning, match="Laplace's rule"):
        head = heads.get("temperature")().fit(data.h_fit, data.z_fit, y)
    t, n = head.temperature_, len(y)
    confidence = softmax(data.z_fit.astype(np.float64) / t, axis=1).max(1).mean()
    assert head.calibration_["rule"] == "laplace"
    assert confidence == pytest.approx((n + 1) / (n + 2), abs=1e-8)
    expected = softmax(data.z_test.astype(np.float64) / t, axis=1).max(1)
    assert_close(head.score(data.h_test, data.z_test), expected, rtol=1e-6, atol=0)
    head.save(tmp_path)
    loaded = Head.load(tmp_path)
    assert loaded.calibration_ == head.calibration_
    assert_close(loaded.predict(data.h_test, data.z_test).probs, softmax(data.z_test / t, axis=1))


def test_kl_matching_against_templates_of_predicted_classes(data):
    p_fit = softmax(data.z_fit.astype(np.float64), axis=1)
    predicted = p_fit.argmax(1)
    templates = [p_fit[predicted == k].mean(0) for k in np.unique(predicted)]
    p = softmax(data.z_test.astype(np.float64), axis=1)
    kl = [[np.sum(row * np.log(row / d)) for d in templates] for row in p]
    assert_close(own("kl_matching", data), -np.min(kl, axis=1))


def test_react_and_vra_rectify_with_pooled_percentiles(data):
    c = np.percentile(data.h_fit, 90)
    assert_close(own("react", data), energy(logits_of(np.minimum(data.h_test, c), data)))
    lo, hi = np.percentile(data.h_fit, [60, 90])
    h = data.h_test.astype(np.float64)
    g = np.where(h < lo, 0.0, np.where(h > hi, hi, h + 0.25))
    assert_close(own("vra", data, gamma=0.25), energy(logits_of(g, data)))


def shaped(h: np.ndarray, percentile: float, kind: str) -> np.ndarray:
    out = np.zeros_like(h, dtype=np.float64)
    k = h.shape[1] - int(round(h.shape[1] * percentile / 100))
    for i, row in enumerate(h.astype(np.float64)):
        keep = np.argsort(-row, kind="stable")[:k]
        s1, s2 = row.sum(), row[keep].sum()
        if kind == "scale":
            out[i] = row * np.exp(s1 / s2)
        elif kind == "b":
            out[i, keep] = s1 / k
        else:
            out[i, keep] = row[keep] * (np.exp(s1 / s2) if kind == "s" else 1.0)
    return out


@pytest.mark.parametrize(
    "name,kind", [("ash_p", "p"), ("ash_b", "b"), ("ash_s", "s"), ("scale", "scale")]
)
def test_activation_shaping_per_row(data, name, kind):
    expected = energy(logits_of(shaped(data.h_test, 70, kind), data))
    assert_close(own(name, data, percentile=70), expected, rtol=1e-4)


def test_dice_keeps_the_largest_contributions(data):
    contribution = data.weight * data.h_fit.mean(0)
    mask = contribution > np.percentile(contribution, 75)
    masked = np.where(mask, data.weight, 0.0)
    expected = energy(data.h_test.astype(np.float64) @ masked.T + data.bias)
    assert_close(own("dice", data, sparsity=75), expected)


def test_knn_and_nnguide_by_brute_force(data):
    def unit(x):
        return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-10)

    bank, queries = unit(data.h_fit.astype(np.float64)), unit(data.h_test.astype(np.float64))
    distances = np.linalg.norm(queries[:, None] - bank[None], axis=2)
    assert_close(own("knn", data, k=7), -(np.sort(distances, axis=1)[:, 6] ** 2), rtol=1e-4)
    guide = bank * energy(data.z_fit)[:, None]
    top = -np.sort(-(queries @ guide.T), axis=1)[:, :9]
    assert_close(own("nnguide", data, k=9), energy(data.z_test) * top.mean(1), rtol=1e-4)


def test_knn_ranks_by_distance_on_two_gaussian_classes():
    rng = np.random.default_rng(3)
    bank = np.r_[rng.normal(size=(200, 2)) + [4, 0], rng.normal(size=(200, 2)) + [0, 4]]
    h = np.abs(bank).astype(np.float32)
    z = np.c_[h[:, 0], h[:, 1]].astype(np.float32)
    y = (z[:, 1] > z[:, 0]).astype(int)
    head = heads.get("knn")(k=1).fit(h, z, y)
    direction = np.array([[1.0, 0.02]], np.float32)  # close to the first class's directions
    far = np.array([[1.0, 1.0]], np.float32)  # at 45 degrees, between the classes
    assert head.score(direction, direction) > head.score(far, far)


def test_vim_and_residual_against_an_eigendecomposition(data):
    w, b = data.weight.astype(np.float64), data.bias.astype(np.float64)
    u = -np.linalg.pinv(w) @ b
    x = data.h_fit - u
    values, vectors = np.linalg.eigh(x.T @ x / len(x))
    basis = vectors[:, np.argsort(-values)[5:]]  # complement of the 5 leading directions
    residual = np.linalg.norm((data.h_test - u) @ basis, axis=1)
    alpha = data.z_fit.max(1).mean() / np.linalg.norm(x @ basis, axis=1).mean()
    assert_close(own("residual", data, dim=5), -residual, rtol=1e-4)
    assert_close(own("vim", data, dim=5), energy(data.z_test) - alpha * residual, atol=1e-4)


def gaussian_parts(h: np.ndarray, y: np.ndarray, classes: int):
    means = np.stack([h[y == c].mean(0) for c in range(classes)])
    centred = h - means[y]
    return means, np.linalg.pinv(centred.T @ centred / len(h))


def mahalanobis(h: np.ndarray, means: np.ndarray, prec: np.ndarray) -> np.ndarray:
    return np.array([[(r - m) @ prec @ (r - m) for m in means] for r in h])


def test_gaussian_scores_against_explicit_quadratic_forms(data):
    h_fit, h = data.h_fit.astype(np.float64), data.h_test.astype(np.float64)
    means, prec = gaussian_parts(h_fit, data.y_fit, 4)
    md = fitted("mahalanobis", data).predict(data.h_test, data.z_test).scores["md"]
    assert_close(md, -mahalanobis(h, means, prec).min(1), rtol=1e-4)
    mean0 = h_fit.mean(0)
    prec0 = np.linalg.pinv((h_fit - mean0).T @ (h_fit - mean0) / len(h_fit))
    relative = mahalanobis(h, means, prec) - mahalanobis(h, mean0[None], prec0)
    assert_close(own("rmds", data), -relative.min(1), rtol=1e-4, atol=1e-4)
    unit = h_fit / np.linalg.norm(h_fit, axis=1, keepdims=True)
    means_u, prec_u = gaussian_parts(unit, data.y_fit, 4)
    test_u = h / np.linalg.norm(h, axis=1, keepdims=True)
    assert_close(
        own("mahalanobis_pp", data), -mahalanobis(test_u, means_u, prec_u).min(1), rtol=1e-4
    )


def test_rmds_low_rank_path_equals_both_distances_in_full(data):
    # the score by Woodbury's identity against MD_c - MD_0 computed in full (the path a
    # checkpoint without class_fractions takes), then a singular covariance (a repeated
    # feature: pinv, no Woodbury identity) against the explicit quadratic forms
    head = fitted("rmds", data)
    assert head.relative_parts() is not None
    low_rank = head.score(data.h_test, data.z_test)
    del head.class_fractions_
    assert_close(low_rank, head.score(data.h_test, data.z_test), rtol=1e-4, atol=1e-4)
    h_fit = np.c_[data.h_fit, data.h_fit[:, :1]].astype(np.float64)
    h = np.c_[data.h_test, data.h_test[:, :1]].astype(np.float64)
    weight = np.c_[data.weight, np.zeros((4, 1), np.float32)]
    head = heads.get("rmds")().fit(
        h_fit.astype(np.float32), data.z_fit, data.y_fit,
        classifier={"weight": torch.from_numpy(weight), "bias": torch.from_numpy(data.bias)},
    )  # fmt: skip
    assert head.relative_parts() is None
    means, prec = gaussian_parts(h_fit, data.y_fit, 4)
    mean0 = h_fit.mean(0)
    prec0 = np.linalg.pinv((h_fit - mean0).T @ (h_fit - mean0) / len(h_fit))
    relative = mahalanobis(h, means, prec) - mahalanobis(h, mean0[None], prec0)
    scores = head.score(h.astype(np.float32), data.z_test)
    assert_close(scores, -relative.min(1), rtol=1e-4, atol=1e-3)


def test_ddu_is_the_log_density_of_class_gaussians(data):
    from scipy.stats import multivariate_normal

    head = fitted("ddu", data)
    h_fit = data.h_fit.astype(np.float64)
    eps = float(head.jitter_)
    densities = []
    for c in range(4):
        rows = h_fit[data.y_fit == c]
        cov = np.cov(rows, rowvar=False) + eps * np.eye(rows.shape[1])
        densities.append(multivariate_normal(rows.mean(0), cov).logpdf(data.h_test))
    expected = logsumexp(np.stack(densities, axis=1), axis=1)
    assert_close(head.predict(data.h_test, data.z_test).scores["ddu"], expected, rtol=1e-6)


def test_ddu_refuses_imagenet_sized_covariances_with_the_figure():
    import torch

    head = heads.get("ddu")(memory_limit_gib=4.0)
    h, z, y = torch.ones(4, 2048), torch.ones(4, 1000), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(EtnError, match=r"1000 classes need 62\.5 GiB"):
        head.fit_scorer(h, z, y, None)


def test_fdbd_and_she_against_loops(data):
    h, z = data.h_test.astype(np.float64), data.z_test.astype(np.float64)
    mean = data.h_fit.mean(0)
    expected_fdbd, expected_she = [], []
    correct = data.z_fit.argmax(1) == data.y_fit
    patterns = np.stack([data.h_fit[correct & (data.y_fit == c)].mean(0) for c in range(4)])
    for row, logit in zip(h, z, strict=True):
        k = logit.argmax()
        gaps = [abs(logit[k] - logit[i]) / np.linalg.norm(data.weight[k] - data.weight[i])
                for i in range(4) if i != k]  # fmt: skip
        expected_fdbd.append(np.mean(gaps) / np.linalg.norm(row - mean))
        expected_she.append(row @ patterns[k])
    assert_close(own("fdbd", data), expected_fdbd, rtol=1e-4)
    assert_close(own("she", data), expected_she, rtol=1e-4)


def test_nci_against_a_loop(data):
    """NCI's proximity to the predicted class's weight vector plus the weighted L1 norm, row by
    row in float64 (the paper's formula, without dividing by the weight vector's norm)."""
    mean = data.h_fit.astype(np.float64).mean(0)
    for alpha in (0.0, 0.1):
        expected = []
        for row, logit in zip(data.h_test.astype(np.float64), data.z_test, strict=True):
            centred = row - mean
            along = data.weight[logit.argmax()] @ centred / np.linalg.norm(centred)
            expected.append(along + alpha * np.abs(row).sum())
        assert_close(own("nci", data, norm_weight=alpha), expected, rtol=1e-4)
    with pytest.raises(EtnError, match="key 'norm_weight' must be a number >= 0"):
        heads.get("nci")(norm_weight=-1.0)


def test_gradnorm_equals_the_autograd_gradient_norm(data):
    import torch

    rows = []
    for h in data.h_test[:5]:
        weight = torch.tensor(data.weight, requires_grad=True)
        logits = torch.tensor(h) @ weight.T + torch.tensor(data.bias)
        loss = -(torch.log_softmax(logits, 0)).mean()  # KL(u || p) up to a constant
        loss.backward()
        rows.append(float(weight.grad.abs().sum()))
    assert_close(own("gradnorm", data)[:5], rows, rtol=1e-5)


@pytest.mark.parametrize("name", SCORERS)
def test_scorer_round_trip_batches_and_fast_score(name, data, tmp_path):
    head = fitted(name, data, **({"k": 20} if name in ("knn", "nnguide") else {}))
    prediction = head.predict(data.h_test, data.z_test)
    head.save(tmp_path)
    loaded = type(head).load(tmp_path)
    again = loaded.predict(data.h_test, data.z_test)
    np.testing.assert_allclose(again.probs, prediction.probs, rtol=1e-12)
    ours = prediction.scores[head.own_score]
    np.testing.assert_allclose(again.scores[head.own_score], ours, rtol=1e-12)
    half = loaded.predict(data.h_test[:37], data.z_test[:37]).scores[head.own_score]
    np.testing.assert_allclose(half, ours[:37], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(head.score(data.h_test, data.z_test), ours, rtol=1e-12)
    assert np.allclose(prediction.probs.sum(1), 1.0)


def test_scorers_that_need_the_classifier_refuse_without_it(data):
    with pytest.raises(EtnError, match="classifier"):
        heads.get("react")().fit(data.h_fit, data.z_fit, data.y_fit)


def test_aliases_find_the_registered_heads():
    assert heads.get("msp") is heads.get("map")
    assert heads.get("ebo") is heads.get("energy")
    assert heads.get("mds") is heads.get("mahalanobis")
    assert heads.aliases_of("ash_b") == ["ash"]
