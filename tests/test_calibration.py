"""Post-hoc temperature scaling (``calibrate = "temperature"``, Guo et al. 2017): the fitted
temperature against an independent 1-D optimisation, the argmax and every score unchanged,
the fallback where the NLL has no finite optimum, and the save/load round trip."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from etn_cli.errors import EtnError
from etn_cli.heads import Head, heads
from etn_cli.heads.calibration import (
    T_MAX,
    T_MIN,
    apply_temperature,
    fallback,
    fit_scores_temperature,
    fit_temperature,
)
from etn_cli.metrics.evaluation import classification_metrics


def _probs(n: int, c: int, seed: int, errors: float) -> tuple[np.ndarray, np.ndarray]:
    """Under-confident Dirichlet probabilities whose argmax is wrong on ``errors`` of rows."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(c), size=n)  # (N, C)
    labels = probs.argmax(axis=1)
    wrong = rng.random(n) < errors
    labels[wrong] = (labels[wrong] + rng.integers(1, c, wrong.sum())) % c
    return probs, labels


def _torch_nll(probs: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """The adaptation NLL of ``softmax(log p / T)`` computed independently, with torch."""
    logits = torch.log(torch.as_tensor(probs, dtype=torch.float64)) / temperature
    return float(torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels)))


@pytest.mark.parametrize(("seed", "errors"), [(0, 0.1), (1, 0.3), (2, 0.02)])
def test_temperature_equals_an_independent_bounded_1d_minimisation_of_the_nll(seed, errors):
    probs, labels = _probs(300, 5, seed, errors)
    record = fit_temperature(probs, labels)
    found = minimize_scalar(
        lambda t: _torch_nll(probs, labels, t),
        bounds=(T_MIN, T_MAX),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert record["rule"] == "nll"
    assert record["temperature"] == pytest.approx(found.x, rel=1e-5)
    assert record["adapt_nll_after"] == pytest.approx(found.fun, rel=1e-9)
    assert record["adapt_nll_before"] == pytest.approx(_torch_nll(probs, labels, 1.0))


def test_temperature_sharpens_under_confident_probabilities_and_lowers_their_ece():
    probs, labels = _probs(400, 4, 3, 0.05)
    record = fit_temperature(probs, labels)
    calibrated = apply_temperature(probs, record["temperature"])
    before = {m.metric: m.value for m in classification_metrics(probs, labels)}
    after = {m.metric: m.value for m in classification_metrics(calibrated, labels)}
    assert record["temperature"] < 1
    assert after["nll"] < before["nll"] and after["ece"] < before["ece"] / 2
    np.testing.assert_array_equal(calibrated.argmax(1), probs.argmax(1))


def test_a_perfectly_classified_adaptation_set_falls_back_to_laplaces_rule_and_says_so():
    probs, _ = _probs(50, 4, 4, 0.0)
    labels = probs.argmax(axis=1)  # every prediction right: the NLL falls all the way to T -> 0
    with pytest.warns(UserWarning, match=r"no minimiser \(50 of 50 .*Laplace's rule") as caught:
        record = fit_temperature(probs, labels)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)  # one line
    calibrated = apply_temperature(probs, record["temperature"])
    assert record["rule"] == "laplace" and record["correct"] == 50
    assert T_MIN <= record["temperature"] <= T_MAX
    assert calibrated.max(axis=1).mean() == pytest.approx(51 / 52, abs=1e-8)
    assert calibrated.max(axis=1).min() < 0.99  # not every probability pushed to 0 or 1
    assert fallback(record) == "T by Laplace's rule"


def test_errors_too_small_to_stop_the_nll_before_t_min_fall_back_with_their_count():
    probs, _ = _probs(60, 4, 6, 0.0)
    labels = probs.argmax(axis=1)
    second = np.argsort(probs, axis=1)[:, -2]
    probs[0, second[0]] = probs[0, labels[0]] * (1 + 1e-9)  # one error, by a hair
    with pytest.warns(UserWarning, match=r"59 of 60"):
        record = fit_temperature(probs, labels)
    calibrated = apply_temperature(probs, record["temperature"])
    assert record["rule"] == "laplace"
    assert calibrated.max(axis=1).mean() == pytest.approx(60 / 62, abs=1e-8)


def test_a_temperature_beyond_the_bounds_is_kept_at_the_bound_and_said():
    probs = np.array([[1 - 1e-9, 1e-9], [1 - 1e-9, 1e-9]])
    labels = np.array([0, 1])  # one sure and right, one sure and wrong: wants T -> infinity
    with pytest.warns(UserWarning, match="bound"):
        record = fit_temperature(probs, labels)
    assert record["rule"] == "bound" and record["temperature"] == pytest.approx(T_MAX)
    assert fallback(record) == "T kept at the bound 100"


def _fit_pair(name: str, data) -> tuple[Head, Head]:
    """The head fitted as it is and with temperature scaling, same seed and settings."""
    fitted = []
    fields = {f for f in heads.get(name).Config.__dataclass_fields__}
    settings = {"epochs": 3} if "epochs" in fields else {}
    for calibrate in ("none", "temperature"):
        head = heads.get(name)(calibrate=calibrate, **settings)
        classifier = None
        if head.needs_classifier:
            classifier = {k: torch.from_numpy(v) for k, v in data.classifier.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            head.fit(data.hidden, data.logits, data.labels, classifier=classifier)
        fitted.append(head)
    return fitted[0], fitted[1]


@pytest.fixture(scope="module")
def data(features_factory):
    return features_factory(n=160, d=12, c=4, seed=5, spread=2.0)


@pytest.mark.parametrize("name", ["map", "etn", "map_edl", "mcd", "mahalanobis"])
def test_temperature_scaling_keeps_the_argmax_and_every_score_exactly(name, data):
    plain, scaled = _fit_pair(name, data)
    a, b = plain.predict(data.hidden, data.logits), scaled.predict(data.hidden, data.logits)
    np.testing.assert_array_equal(a.predictions, b.predictions)
    assert a.scores.keys() == b.scores.keys()
    for score in a.scores:  # identical values: identical ranks, AUPR, AUROC and FPR95
        np.testing.assert_array_equal(a.scores[score], b.scores[score], err_msg=score)
    expected = apply_temperature(a.probs, scaled.calibration_["temperature"])
    np.testing.assert_allclose(b.probs, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(b.probs.sum(axis=1), 1.0, atol=1e-9)
    assert plain.calibration_ is None


def test_a_calibrated_head_saved_and_loaded_predicts_the_same_and_keeps_its_temperature(
    data, tmp_path
):
    _, scaled = _fit_pair("etn", data)
    scaled.save(tmp_path)
    meta = json.loads((tmp_path / "head.json").read_text())
    assert meta["calibration"] == scaled.calibration_  # the provenance names the temperature
    assert meta["config"]["calibrate"] == "temperature"
    loaded = Head.load(tmp_path)
    a, b = scaled.predict(data.hidden, data.logits), loaded.predict(data.hidden, data.logits)
    np.testing.assert_array_equal(a.probs, b.probs)
    np.testing.assert_array_equal(a.predictions, b.predictions)
    assert loaded.calibration_ == scaled.calibration_


def test_an_unknown_calibration_is_refused_with_the_allowed_ones():
    with pytest.raises(EtnError, match="'none', 'temperature'"):
        heads.get("etn")(calibrate="platt")


def test_an_all_correct_split_whose_nll_is_exactly_zero_falls_back_and_says_so():
    labels = np.arange(40) % 4
    scores = np.full((40, 4), -800.0)
    scores[np.arange(40), labels] = 0.0  # margins of 800: every exp underflows, NLL(T=1) = 0
    probs = np.exp(scores)  # exactly one-hot: log p is the floor elsewhere
    assert _torch_nll(probs, labels, 1.0) == 0.0
    with pytest.warns(UserWarning, match=r"no minimiser \(40 of 40") as caught:
        record = fit_temperature(probs, labels)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert record["rule"] == "laplace" and fallback(record) == "T by Laplace's rule"
    with pytest.warns(UserWarning, match="Laplace's rule"):  # the temperature scorer's fit
        assert fit_scores_temperature(torch.from_numpy(scores), labels)["rule"] == "laplace"
    head = heads.get("map")(calibrate="temperature")
    with pytest.warns(UserWarning, match="Laplace's rule"):
        head.fit(np.zeros((40, 3), np.float32), np.log(probs + 1e-300), labels)
    assert head.calibration_["rule"] == "laplace"  # saved in head.json with the head
