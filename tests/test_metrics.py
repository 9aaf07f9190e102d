"""Evaluation metrics against hand-computed examples and closed forms (DESIGN §3)."""

import numpy as np
import pytest

from etn_cli.errors import EtnError
from etn_cli.metrics.evaluation import (
    MetricValue,
    classification_metrics,
    confidence_metrics,
    ood_metrics,
)


def _by_name(values: list[MetricValue], score: str | None = None) -> dict[str, MetricValue]:
    return {value.metric: value for value in values if value.score == score}


def test_ece_matches_a_hand_computed_two_bin_example():
    # Bin (0.6, 0.667]: confidences 0.65, 0.65, one of two correct -> |0.5 - 0.65| = 0.15.
    # Bin (0.933, 1]: confidences 0.95, 0.95, both correct -> |1.0 - 0.95| = 0.05.
    probs = np.array([[0.65, 0.35], [0.65, 0.35], [0.95, 0.05], [0.05, 0.95]])
    labels = np.array([0, 1, 0, 1])
    ece = _by_name(classification_metrics(probs, labels))["ece"].value
    assert ece == pytest.approx(0.5 * 0.15 + 0.5 * 0.05)


def test_accuracy_nll_and_brier_match_closed_forms():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    labels = np.array([0, 2, 0])
    metrics = _by_name(classification_metrics(probs, labels))
    assert metrics["acc"].value == pytest.approx(2 / 3)
    assert metrics["nll"].value == pytest.approx(-(np.log(0.7) + np.log(0.3) + np.log(0.5)) / 3)
    brier = ((0.3**2 + 0.2**2 + 0.1**2) + (0.1**2 + 0.6**2 + 0.7**2) + (0.5**2 + 2 * 0.25**2)) / 3
    assert metrics["brier"].value == pytest.approx(brier)
    assert all(value.score is None and value.note is None for value in metrics.values())


def test_nll_clips_a_zero_probability_at_1e_minus_12():
    nll = _by_name(classification_metrics(np.array([[1.0, 0.0]]), np.array([1])))["nll"]
    assert nll.value == pytest.approx(-np.log(1e-12))


def test_perfectly_separating_scores_have_aupr_one_and_fpr95_zero():
    correct = np.array([True, True, False, True, False])
    values = confidence_metrics({"mp": np.where(correct, 0.9, 0.4)}, correct)
    metrics = _by_name(values, "mp")
    assert metrics["aupr"].value == pytest.approx(1.0)
    assert metrics["auroc"].value == pytest.approx(1.0)
    assert metrics["fpr95"].value == pytest.approx(0.0)


def test_fpr95_id_on_a_constructed_example():
    # TPR first reaches 95% (19 of 20 positives) at threshold 2; 8 of 10 negatives lie above it.
    positives = np.arange(1.0, 21.0)
    negatives = np.array([0.5, 1.5, 2.5, 4.5, 6.5, 8.5, 10.5, 12.5, 14.5, 18.5])
    scores = {"mp": np.r_[positives, negatives]}
    correct = np.r_[np.ones(20, bool), np.zeros(10, bool)]
    fpr95 = _by_name(confidence_metrics(scores, correct), "mp")["fpr95_id"].value
    assert fpr95 == pytest.approx(8 / 10)


def test_openood_fpr95_takes_ood_as_positive_and_differs_from_the_id_reading():
    # 20 ID samples (scores 1..20), 10 OOD. Catching 95% of OOD (10 of 10 at 0.95 * 10 = 9.5)
    # needs the threshold at the highest OOD score 18.5: ID samples 1..18 are rejected (18/20).
    positives = np.arange(1.0, 21.0)
    negatives = np.array([0.5, 1.5, 2.5, 4.5, 6.5, 8.5, 10.5, 12.5, 14.5, 18.5])
    values = _by_name(ood_metrics({"mp": positives}, {"mp": negatives}), "mp")
    assert values["fpr95"].value == pytest.approx(18 / 20)
    assert values["fpr95_id"].value == pytest.approx(8 / 10)


def test_scores_where_higher_means_ood_are_flipped_before_ranking():
    correct = np.array([True, True, False, False])
    mi = np.array([0.1, 0.2, 0.8, 0.9])  # high mutual information on the wrong predictions
    assert _by_name(confidence_metrics({"mi": mi}, correct), "mi")["auroc"].value == 1.0


def test_all_correct_predictions_make_ranking_metrics_undefined_with_a_note():
    values = confidence_metrics({"mp": np.linspace(0.5, 1.0, 314)}, np.ones(314, bool))
    assert [value.metric for value in values] == [
        "aupr", "auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_id"
    ]  # fmt: skip
    for value in values:
        assert value.value is None
        assert value.note == "undefined: all 314 predictions are correct"


def test_constant_scores_give_chance_auroc():
    correct = np.array([True, False, True, False])
    assert _by_name(confidence_metrics({"um": np.ones(4)}, correct), "um")["auroc"].value == 0.5


def test_ood_metrics_treat_id_as_positive_for_scores_present_in_both_sets():
    id_scores = {"mp": np.array([0.9, 0.8]), "de": np.array([-3.0, -2.0]), "um": np.ones(2)}
    ood_scores = {"mp": np.array([0.3, 0.4]), "de": np.array([1.0, 2.0])}
    values = ood_metrics(id_scores, ood_scores)
    assert {value.score for value in values} == {"mp", "de"}
    perfect = [v for v in values if not v.metric.startswith("fpr95")]
    assert all(value.value == pytest.approx(1.0) for value in perfect)
    assert all(v.value == 0.0 for v in values if v.metric.startswith("fpr95"))


def test_an_empty_ood_set_raises():
    with pytest.raises(EtnError, match="OOD set has no samples"):
        ood_metrics({"mp": np.array([0.9])}, {"mp": np.array([])})


def test_an_empty_id_set_makes_ood_metrics_undefined():
    values = ood_metrics({"mp": np.array([])}, {"mp": np.array([0.5])})
    assert all(value.value is None and value.note.startswith("undefined") for value in values)


def test_labels_outside_the_class_range_are_rejected():
    with pytest.raises(EtnError, match="Expected labels in 0..1"):
        classification_metrics(np.array([[0.5, 0.5]]), np.array([2]))
