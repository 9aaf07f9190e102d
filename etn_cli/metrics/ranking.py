"""Ranking metrics of a binary detector, defined once: AUROC, the paper's AUPR, OpenOOD's
AUPR-IN / AUPR-OUT and FPR@95%TPR in both readings.

Everything takes ``labels`` (1 = the *ID-like* class: an ID sample, or a correct prediction)
and ``scores`` oriented so that higher means more ID-like. One sort serves every metric:

* ``auroc``: area under the ROC curve; the same whichever class is called positive.
* ``aupr``: the paper's AUPR, ID-like positive, the step-wise average precision
  ``sum_k (R_k - R_{k-1}) P_k`` of scikit-learn's ``average_precision_score``.
* ``aupr_in`` / ``aupr_out``: OpenOOD v1.5's AUPR-IN (ID-like positive, ranked by the score)
  and AUPR-OUT (the other class positive, ranked by the negated score), each the trapezoid
  under the precision-recall curve (``sklearn.metrics.auc(recall, precision)``), which is
  not the step-wise average precision.
* ``fpr95``: OpenOOD v1.5's FPR@95%TPR, with the *other* class positive (for OOD detection:
  OOD is positive): the share of ID-like samples rejected at the first threshold where 95% of
  the others are caught. As OpenOOD computes it: ``roc_curve(ood, -score)`` (which drops
  collinear points of the curve), TPR as ``tps / tps[-1]`` in floating point and the first
  point with ``tpr >= 0.95``.
* ``fpr95_id``: the other reading, ID-like positive: the share of OOD (or wrong) samples
  accepted at the first threshold where 95% of the ID-like ones are, on every threshold.

Tied scores form one threshold, as in scikit-learn: a tie moves the curve diagonally.
"""

from __future__ import annotations

import numpy as np

RANKING_METRICS = ("aupr", "auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_id")
TPR_LEVEL = 0.95


def threshold_counts(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """True and false positives (each (T,)) at every distinct threshold, highest first, for
    the positive class ``labels == 1`` ranked by ``scores`` (scikit-learn's binary curve)."""
    order = np.argsort(scores, kind="mergesort")[::-1]
    ranked, positive = scores[order], labels[order].astype(np.int64)
    last_of_tie = np.r_[np.flatnonzero(np.diff(ranked)), ranked.size - 1]  # (T,)
    tps = np.cumsum(positive)[last_of_tie]
    return tps, last_of_tie + 1 - tps


def average_precision(tps: np.ndarray, fps: np.ndarray) -> float:
    """``sum_k (R_k - R_{k-1}) P_k`` over the thresholds (``average_precision_score``)."""
    recall = tps / tps[-1]
    precision = tps / (tps + fps)
    return float(max(0.0, np.sum(np.diff(np.r_[0.0, recall]) * precision)))


def trapezoid_pr(tps: np.ndarray, fps: np.ndarray) -> float:
    """Trapezoid area under precision(recall), with the end point (recall 0, precision 1)
    that ``precision_recall_curve`` adds (OpenOOD's ``auc(recall, precision)``)."""
    recall = np.r_[0.0, tps / tps[-1]]
    precision = np.r_[1.0, tps / (tps + fps)]
    return float(np.trapezoid(precision, recall))


def roc_area(tps: np.ndarray, fps: np.ndarray) -> float:
    """Trapezoid area under TPR(FPR) from (0, 0): ``roc_auc_score``."""
    return float(np.trapezoid(np.r_[0.0, tps / tps[-1]], np.r_[0.0, fps / fps[-1]]))


def fpr_at_tpr(tps: np.ndarray, fps: np.ndarray, *, drop_collinear: bool) -> float:
    """FPR at the first threshold whose TPR reaches 95%. ``drop_collinear`` first removes the
    points inside straight runs of the curve, as ``roc_curve(drop_intermediate=True)`` does
    (OpenOOD's call): where a run of ties crosses 95%, that lands on the run's end."""
    if drop_collinear and tps.size > 2:
        keep = np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True]
        tps, fps = tps[keep], fps[keep]
    tpr = np.r_[0, tps] / tps[-1]
    fpr = np.r_[0, fps] / fps[-1]
    return float(fpr[np.argmax(tpr >= TPR_LEVEL)])


def ranking_values(labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Every metric of :data:`RANKING_METRICS` for ``labels`` (1 = ID-like) and ``scores``
    (higher = more ID-like); both classes must be present."""
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    tps, fps = threshold_counts(labels, scores)  # ID-like positive
    tps_out, fps_out = threshold_counts(~labels, -scores)  # the other class positive
    return {
        "aupr": average_precision(tps, fps),
        "auroc": roc_area(tps, fps),
        "aupr_in": trapezoid_pr(tps, fps),
        "aupr_out": trapezoid_pr(tps_out, fps_out),
        "fpr95": fpr_at_tpr(tps_out, fps_out, drop_collinear=True),
        "fpr95_id": fpr_at_tpr(tps, fps, drop_collinear=False),
    }
