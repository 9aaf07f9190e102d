"""The ranking metrics against scikit-learn, and OpenOOD v1.5's recipe written out with it.

OpenOOD's ``auc_and_fpr_recall`` (openood/evaluators/metrics.py) takes OOD as positive for
FPR@95 and AUPR-OUT, calls ``roc_curve`` with its default ``drop_intermediate=True``, and
integrates both precision-recall curves with the trapezoid rule; the oracle below is that
recipe, so agreement here means the numbers compare with its leaderboard.
"""

import numpy as np
import pytest
from sklearn import metrics

from etn_cli.metrics.ranking import ranking_values


def openood_oracle(labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """OpenOOD's metrics with scikit-learn: ``labels`` 1 = ID, ``scores`` higher = ID."""
    ood = 1 - labels
    fpr, tpr, _ = metrics.roc_curve(ood, -scores)
    precision_in, recall_in, _ = metrics.precision_recall_curve(labels, scores)
    precision_out, recall_out, _ = metrics.precision_recall_curve(ood, -scores)
    return {
        "auroc": metrics.auc(fpr, tpr),
        "aupr_in": metrics.auc(recall_in, precision_in),
        "aupr_out": metrics.auc(recall_out, precision_out),
        "fpr95": fpr[np.argmax(tpr >= 0.95)],
    }


def id_positive_oracle(labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    fpr, tpr, _ = metrics.roc_curve(labels, scores, drop_intermediate=False)
    return {
        "aupr": metrics.average_precision_score(labels, scores),
        "auroc": metrics.roc_auc_score(labels, scores),
        "fpr95_id": fpr[np.argmax(tpr >= 0.95)],
    }


def cases():
    rng = np.random.default_rng(0)
    for n_id, n_ood, levels in [(40, 25, None), (200, 60, 7), (20, 20, 3), (1000, 10, None)]:
        labels = np.r_[np.ones(n_id, int), np.zeros(n_ood, int)]
        scores = rng.normal(size=n_id + n_ood) + labels
        if levels is not None:  # heavy ties, within and across the classes
            scores = np.round(scores * levels / 4)
        yield labels, scores


@pytest.mark.parametrize("case", list(cases()), ids=lambda c: f"{len(c[0])}-rows")
def test_every_ranking_metric_equals_scikit_learn_and_openood_recipe(case):
    labels, scores = case
    values = ranking_values(labels, scores)
    for name, expected in (
        openood_oracle(labels, scores) | id_positive_oracle(labels, scores)
    ).items():
        assert values[name] == pytest.approx(expected, abs=1e-12), name


def test_a_tied_run_crossing_95_percent_ends_where_roc_curve_drops_collinear_points():
    # OOD and ID alternate in tied pairs: the ROC curve is one diagonal run whose middle points
    # roc_curve(drop_intermediate=True) drops, so OpenOOD's FPR95 is read at the run's end.
    scores = np.repeat(np.arange(20.0), 2)
    labels = np.tile([1, 0], 20)
    values = ranking_values(labels, scores)
    assert values["fpr95"] == pytest.approx(openood_oracle(labels, scores)["fpr95"])
    assert values["fpr95"] == 1.0  # every point between the corners is dropped
    assert values["fpr95_id"] == pytest.approx(19 / 20)


def test_trapezoid_aupr_differs_from_average_precision():
    labels = np.array([1, 0, 1, 0, 1, 1, 0, 0])
    scores = np.array([8.0, 7, 6, 5, 4, 3, 2, 1])
    values = ranking_values(labels, scores)
    assert values["aupr_in"] != pytest.approx(values["aupr"], abs=1e-3)
