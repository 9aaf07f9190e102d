"""Every registered head honours the Head contract; ETN and the baselines behave as the paper and
DESIGN §2–4 say, checked against independent computations on tiny seeded features."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from etn_cli.errors import EtnError
from etn_cli.heads import Head, Prediction, heads
from etn_cli.heads import etn as etn_module
from etn_cli.heads.etn import ETN
from etn_cli.heads.mahalanobis import Mahalanobis
from etn_cli.heads.static import Static
from etn_cli.metrics.scores import HIGHER_MEANS_ID

# Few epochs, and for the two heads whose default width is the cost (SNGP's 1,024 random
# features, AdaTS's 1024-512-512 encoder) a narrow one: the contract holds at any size.
FAST = {"epochs": 3, "random_features": 64, "widths": (64, 32)}


def _settings(name: str, **extra) -> dict:
    """Few epochs for heads that train, nothing for heads that do not."""
    fields = {f.name for f in dataclasses.fields(heads.get(name).Config)}
    return {k: v for k, v in (FAST | extra).items() if k in fields}


def _fit(name: str, data, **settings) -> Head:
    head = heads.get(name)(**_settings(name, **settings))
    classifier = None
    if head.needs_classifier:
        classifier = {k: torch.from_numpy(v) for k, v in data.classifier.items()}
    return head.fit(
        data.hidden, data.logits, data.labels, classifier=classifier, layers=data.layers
    )


def _predict(head: Head, data, rows: slice = slice(None), hidden=None) -> Prediction:
    """``head.predict`` on ``rows`` of ``data``, with its pooled layers."""
    hidden = data.hidden if hidden is None else hidden
    layers = {name: a[rows] for name, a in data.layers.items()}
    return head.predict(hidden[rows], data.logits[rows], layers=layers)


def _assert_same(a: Prediction, b: Prediction) -> None:
    np.testing.assert_array_equal(a.probs, b.probs)
    assert a.scores.keys() == b.scores.keys()
    for name in a.scores:
        np.testing.assert_array_equal(a.scores[name], b.scores[name], err_msg=name)
    if a.alpha is None:
        assert b.alpha is None
    else:
        np.testing.assert_array_equal(a.alpha, b.alpha)


# ----------------------------------------------------------------------------- the contract
@pytest.fixture(scope="module")
def data(features_factory):
    return features_factory(n=200, d=16, c=4, seed=0)


@pytest.fixture(scope="module", params=heads.names())
def fitted(request, data) -> Head:
    return _fit(request.param, data)


def test_every_head_predicts_probabilities_that_sum_to_one(fitted, data):
    pred = _predict(fitted, data)
    assert pred.probs.shape == (200, 4)
    assert np.isfinite(pred.probs).all()
    assert (pred.probs >= 0).all()
    np.testing.assert_allclose(pred.probs.sum(1), 1.0, atol=1e-6)


def test_every_head_reports_finite_known_scores_of_one_value_per_sample(fitted, data):
    pred = _predict(fitted, data)
    assert pred.scores, "a head must report at least one score"
    for name, values in pred.scores.items():
        assert name in HIGHER_MEANS_ID, name
        assert np.shape(values) == (200,), name
        assert np.isfinite(values).all(), name


def test_every_dirichlet_head_has_positive_alpha_of_shape_n_by_c(fitted, data):
    pred = _predict(fitted, data)
    if pred.alpha is None:
        pytest.skip(f"{fitted.name} has no Dirichlet")
    assert pred.alpha.shape == (200, 4)
    assert (pred.alpha > 0).all()


def test_every_head_saved_and_loaded_predicts_exactly_the_same(fitted, data, tmp_path):
    fitted.save(tmp_path)
    loaded = Head.load(tmp_path)
    assert type(loaded) is type(fitted)
    assert loaded.config == fitted.config
    _assert_same(_predict(loaded, data), _predict(fitted, data))


def test_every_head_fitted_twice_with_the_same_seed_predicts_the_same(fitted, data):
    # Only the head's seed may matter, not the global RNG state before the fit.
    torch.manual_seed(1)
    first = _fit(fitted.name, data)
    torch.manual_seed(2)
    second = _fit(fitted.name, data)
    _assert_same(_predict(first, data), _predict(second, data))


def test_every_head_predicts_a_sample_the_same_whatever_its_batch(fitted, data):
    whole = _predict(fitted, data)
    first = _predict(fitted, data, slice(None, 77))
    second = _predict(fitted, data, slice(77, None))
    np.testing.assert_allclose(
        np.concatenate([first.probs, second.probs]), whole.probs, rtol=1e-6, atol=1e-9
    )
    for name in whole.scores:
        np.testing.assert_allclose(
            np.concatenate([first.scores[name], second.scores[name]]),
            whole.scores[name],
            rtol=1e-6,
            atol=1e-9,
            err_msg=name,
        )


@pytest.mark.parametrize("name", heads.names())
def test_every_head_refuses_to_predict_before_it_is_fitted(name, data):
    with pytest.raises(EtnError, match="not fitted"):
        _predict(heads.get(name)(), data)


def test_every_head_refuses_features_of_another_hidden_size(fitted, data):
    with pytest.raises(EtnError, match="hidden size"):
        _predict(fitted, data, hidden=data.hidden[:, :8])


# ----------------------------------------------------------------------------- argmax
def _random_logits(seed: int, huge: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hidden states unrelated to the logits, and logits that are nearly tied, have large
    margins of either sign, or are all negative (with ``huge``: around -1000)."""
    rng = np.random.default_rng(seed)
    n, d, c = 120, 8, 5
    hidden = rng.normal(size=(n, d)).astype(np.float32)
    logits = rng.normal(size=(n, c))
    logits[:30] *= 1e-4  # nearly tied
    logits[30:60] *= 40  # large margins, large negative entries
    logits[60:90] = logits[60:90] - 2  # every class negative
    if huge:
        logits[90:] = logits[90:] * 100 - 1000
    else:  # huge margins: the top class at +50, the others down to about -3000
        logits[90:] = 1e3 * (logits[90:] - logits[90:].max(1, keepdims=True)) + 50
    labels = rng.integers(0, c, size=n)
    return hidden, logits.astype(np.float32), labels


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("head_cls", [ETN, Static])
def test_scalar_evidential_heads_never_change_the_argmax(head_cls, seed):
    hidden, logits, labels = _random_logits(seed, huge=False)
    head = head_cls(variant="scalar", epochs=5, seed=seed).fit(hidden, logits, labels)
    pred = head.predict(hidden, logits)
    np.testing.assert_array_equal(pred.predictions, logits.argmax(1))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("head_cls", [ETN, Static])
def test_scalar_evidential_heads_never_rank_a_lower_logit_above_a_higher_one(head_cls, seed):
    # Around -1000 every class's evidence underflows to 0 in float64, so classes may tie at
    # alpha = b; a class with a lower logit must still never get a higher probability.
    hidden, logits, labels = _random_logits(seed, huge=True)
    head = head_cls(variant="scalar", epochs=5, seed=seed).fit(hidden, logits, labels)
    probs = head.predict(hidden, logits).probs
    higher_logit = logits[:, :, None] > logits[:, None, :]  # (N, C, C): z_i > z_j
    assert (probs[:, :, None] >= probs[:, None, :])[higher_logit].all()
    rows = np.arange(len(logits))
    np.testing.assert_array_equal(probs[rows, logits.argmax(1)], probs.max(1))


@pytest.mark.parametrize("head_cls", [ETN, Static])
def test_scalar_evidential_heads_keep_the_predicted_class_where_probabilities_tie(head_cls):
    hidden, logits, labels = _random_logits(0, huge=True)
    head = head_cls(variant="scalar", epochs=5).fit(hidden, logits, labels)
    np.testing.assert_array_equal(head.predict(hidden, logits).predictions, logits.argmax(1))


# ----------------------------------------------------------------------------- ETN training
def test_etn_training_reduces_its_loss(data, monkeypatch):
    seen: dict[str, object] = {}
    real_fit_module = etn_module.fit_module

    def mean_loss(loss_fn, tensors) -> float:
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(7)  # the same MC draws before and after
            return loss_fn(*tensors).mean().item()

    def recording_fit_module(module, loss_fn, tensors, **kwargs):
        seen["before"] = mean_loss(loss_fn, tensors)
        seen["history"] = real_fit_module(module, loss_fn, tensors, **kwargs)
        seen["after"] = mean_loss(loss_fn, tensors)
        return seen["history"]

    monkeypatch.setattr(etn_module, "fit_module", recording_fit_module)
    head = ETN(epochs=30, batch_size=64).fit(data.hidden, data.logits, data.labels)
    history = seen["history"].losses
    assert len(history) == 30
    assert history[-1] < history[0]
    assert seen["after"] < seen["before"]
    # the fitted head's own loss is the one that went down
    h, z, y = (torch.from_numpy(a) for a in (data.hidden, data.logits, data.labels))
    assert mean_loss(head.loss, (h, z, y)) == pytest.approx(seen["after"], rel=1e-5)


def test_etn_gives_less_evidence_to_ambiguous_samples_than_to_confident_ones(
    data, features_factory
):
    head = ETN(epochs=30, batch_size=64).fit(data.hidden, data.logits, data.labels)
    test = features_factory(n=400, seed=0, split=1)  # held out, same distribution
    um = head.predict(test.hidden, test.logits).scores["um"]
    top2 = np.sort(test.logits, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    order = np.argsort(margin)
    ambiguous, confident = um[order[:40]], um[order[-40:]]
    assert np.median(confident) > np.median(ambiguous)
    # and on the same hidden state, near-zero logits get less evidence than a large margin
    h = np.repeat(test.hidden[:1], 2, axis=0)
    z = np.array([[0.01, -0.01, 0.0, 0.02], [12.0, 0.0, -2.0, -1.0]], dtype=np.float32)
    near_zero, large_margin = head.predict(h, z).scores["um"]
    assert near_zero < large_margin


# ----------------------------------------------------------------------------- baselines
def test_mahalanobis_ranks_points_near_a_class_mean_above_far_away_points(data):
    head = Mahalanobis().fit(data.hidden, data.logits, data.labels)
    rng = np.random.default_rng(3)
    near = data.means + 0.1 * rng.normal(size=data.means.shape)  # (C, D)
    far = data.means + 8.0 * rng.normal(size=data.means.shape)
    hidden = np.concatenate([near, far]).astype(np.float32)
    logits = np.zeros((len(hidden), 4), dtype=np.float32)
    md = head.predict(hidden, logits).scores["md"]
    assert md[:4].min() > md[4:].max()


def test_mahalanobis_score_is_minus_the_smallest_squared_distance_to_a_class_mean(data):
    head = Mahalanobis().fit(data.hidden, data.logits, data.labels)
    h, y = data.hidden.astype(np.float64), data.labels
    means = np.stack([h[y == c].mean(0) for c in range(4)])
    cov = np.cov((h - means[y]).T, bias=True)
    diff = h[:, None, :] - means[None]  # (N, C, D)
    dist = np.einsum("ncd,de,nce->nc", diff, np.linalg.inv(cov), diff)
    md = head.predict(data.hidden, data.logits).scores["md"]
    np.testing.assert_allclose(md, -dist.min(1), rtol=1e-6)


def test_energy_score_equals_logsumexp_of_the_logits(data):
    pred = heads.get("energy")().fit(data.hidden, data.logits, data.labels)
    pred = pred.predict(data.hidden, data.logits)
    expected = torch.logsumexp(torch.from_numpy(data.logits).double(), 1).numpy()
    np.testing.assert_allclose(pred.scores["energy"], expected, rtol=1e-12)


def test_map_probabilities_are_the_softmax_of_the_logits(data):
    pred = heads.get("map")().fit(data.hidden, data.logits, data.labels)
    pred = pred.predict(data.hidden, data.logits)
    z = data.logits.astype(np.float64)
    expected = np.exp(z - z.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(pred.probs, expected, rtol=1e-12)
    np.testing.assert_allclose(pred.scores["mp"], expected.max(1), rtol=1e-12)


# ----------------------------------------------------------------------------- user errors
def test_an_unknown_head_name_suggests_the_closest_one():
    with pytest.raises(EtnError, match="Did you mean: etn"):
        heads.get("etm")


def test_an_unknown_setting_names_the_setting_it_resembles():
    with pytest.raises(EtnError, match="prior_mode"):
        heads.get("etn")(prior_mod=3)


def test_a_setting_of_the_wrong_type_is_refused():
    with pytest.raises(EtnError, match="mc_samples"):
        heads.get("etn")(mc_samples="x")


def test_a_checkpoint_that_does_not_match_its_head_is_refused(data, tmp_path):
    ETN(epochs=1).fit(data.hidden, data.logits, data.labels).save(tmp_path)
    meta = json.loads((tmp_path / "head.json").read_text())
    assert meta["n_features"] == 16
    meta["n_features"] = 8
    (tmp_path / "head.json").write_text(json.dumps(meta))
    with pytest.raises(EtnError, match="does not match"):
        Head.load(tmp_path)


@pytest.mark.parametrize("bad_label", [-1, 4])
def test_fit_refuses_labels_outside_the_classes(data, bad_label):
    labels = data.labels.copy()
    labels[5] = bad_label
    with pytest.raises(EtnError, match="Labels must lie in 0..3"):
        ETN(epochs=1).fit(data.hidden, data.logits, labels)


def test_fit_refuses_nan_logits(data):
    logits = data.logits.copy()
    logits[3, 1] = np.nan
    with pytest.raises(EtnError, match="non-finite"):
        ETN(epochs=1).fit(data.hidden, logits, data.labels)
