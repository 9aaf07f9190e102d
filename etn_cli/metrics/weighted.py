"""The evaluation's metrics under row weights, for B bootstrap replicates at once.

A bootstrap resample of N rows is a vector of multiplicities (how often each row was drawn);
with those as weights, every function here returns exactly the metric of the resampled rows
(ties included: copies of a row tie with it), for a (B, N) matrix of weights in one pass, so a
paired bootstrap over 1,000 replicates costs a few sorts instead of 1,000 per metric. Each
returns a dict of (B,) arrays keyed like :mod:`etn_cli.metrics.evaluation` names its metrics;
a replicate where a metric is undefined (no positive drawn) gives NaN.
"""

from __future__ import annotations

import numpy as np

from etn_cli.metrics.evaluation import ECE_BINS
from etn_cli.metrics.ranking import TPR_LEVEL
from etn_cli.metrics.reliability import confidence_bins


def weighted_calibration(
    correct: np.ndarray,
    confidence: np.ndarray,
    nll: np.ndarray,
    brier: np.ndarray,
    weights: np.ndarray,
) -> dict[str, np.ndarray]:
    """``acc``, ``ece`` (15 bins), ``nll`` and ``brier`` from per-row values (N,) under
    ``weights`` (B, N): weighted means, and ``sum_b |sum of w (correct - conf) in b| / W``."""
    total = weights.sum(axis=1)  # (B,)
    gap = np.asarray(correct, np.float64) - np.asarray(confidence, np.float64)  # (N,)
    member = np.zeros((len(gap), ECE_BINS))
    member[np.arange(len(gap)), confidence_bins(confidence)] = 1.0  # (N, 15)
    return {
        "acc": weights @ np.asarray(correct, np.float64) / total,
        "ece": np.abs((weights * gap) @ member).sum(axis=1) / total,
        "nll": weights @ np.asarray(nll, np.float64) / total,
        "brier": weights @ np.asarray(brier, np.float64) / total,
    }


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``sum_n w_n v_n / sum_n w_n`` per replicate over the rows with a value (NaN marks a
    row without one), (B,)."""
    values = np.asarray(values, np.float64)
    known = np.isfinite(values)
    return weights[:, known] @ values[known] / weights[:, known].sum(axis=1)


def _groups(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted ID-like and other rows in each run of tied ``scores``, highest score first,
    each (B, T): the thresholds of the curves, and each replicate's steps between them."""
    order = np.argsort(scores, kind="mergesort")[::-1]
    starts = np.r_[0, np.flatnonzero(np.diff(scores[order])) + 1]  # (T,)
    w = weights[:, order]
    pos = np.add.reduceat(w * labels[order], starts, axis=1)
    return pos, np.add.reduceat(w, starts, axis=1) - pos


def _ratio(top: np.ndarray, bottom: np.ndarray, empty: float = np.nan) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1.0), empty)


def weighted_ranking(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray
) -> dict[str, np.ndarray]:
    """Every metric of :data:`etn_cli.metrics.ranking.RANKING_METRICS` for ``labels`` (N,;
    1 = ID-like) and ``scores`` (N,; higher = more ID-like) under ``weights`` (B, N), defined
    as :func:`etn_cli.metrics.ranking.ranking_values` defines them.

    Every curve steps once per tie group; a group a replicate did not draw is a step of
    zero, so each area is a sum over groups of its own step: with ``tp``, ``fp`` the
    cumulative counts up to a group and ``p``, ``n`` its own, the recall grows by ``p / P``
    and the point before it is ``(tp - p, fp - n)``.
    """
    labels = np.asarray(labels).astype(np.float64)
    pos, neg = _groups(labels, np.asarray(scores, np.float64), np.asarray(weights, np.float64))
    tp, fp = pos.cumsum(axis=1), neg.cumsum(axis=1)  # (B, T)
    total_pos, total_neg = tp[:, -1:], fp[:, -1:]  # (B, 1)
    precision = _ratio(tp, tp + fp, 0.0)
    before = _ratio(tp - pos, tp - pos + fp - neg, 1.0)  # the curve starts at (0, 1)
    # the other reading ranks from the lowest score, other rows positive: the same groups
    out_tp, out_fp = total_neg - fp + neg, total_pos - tp + pos
    out_precision = _ratio(out_tp, out_tp + out_fp, 0.0)
    out_before = _ratio(out_tp - neg, out_tp - neg + out_fp - pos, 1.0)
    values = {
        "aupr": np.maximum((pos * precision).sum(axis=1) / total_pos[:, 0], 0.0),
        "auroc": (neg * (2 * tp - pos)).sum(axis=1) / (2 * total_pos[:, 0] * total_neg[:, 0]),
        "aupr_in": (pos * (precision + before)).sum(axis=1) / (2 * total_pos[:, 0]),
        "aupr_out": (neg * (out_precision + out_before)).sum(axis=1) / (2 * total_neg[:, 0]),
        "fpr95_id": _first_crossing(tp / total_pos, fp / total_neg),
        "fpr95": _fpr95_collinear_dropped(
            out_tp[:, ::-1], out_fp[:, ::-1], neg[:, ::-1], pos[:, ::-1]
        ),
    }
    undefined = (total_pos[:, 0] == 0) | (total_neg[:, 0] == 0)
    return {name: np.where(undefined, np.nan, v) for name, v in values.items()}


def _first_crossing(tpr: np.ndarray, fpr: np.ndarray, kept: np.ndarray | None = None) -> np.ndarray:
    """The FPR at the first (kept) point whose TPR reaches 95%, per replicate."""
    crossing = tpr >= TPR_LEVEL
    if kept is not None:
        crossing &= kept
    return fpr[np.arange(len(fpr)), np.argmax(crossing, axis=1)]


def _fpr95_collinear_dropped(
    tp: np.ndarray, fp: np.ndarray, step_tp: np.ndarray, step_fp: np.ndarray
) -> np.ndarray:
    """OpenOOD's FPR95 (:func:`etn_cli.metrics.ranking.fpr_at_tpr` with ``drop_collinear``)
    per replicate: among the thresholds a replicate holds, a point whose step equals the next
    point's step lies inside a straight run and is dropped (never the first or last)."""
    held = (step_tp + step_fp) > 0  # (B, T)
    columns = np.arange(held.shape[1])
    last = held.shape[1]
    upcoming = np.minimum.accumulate(np.where(held, columns, last)[:, ::-1], axis=1)[:, ::-1]
    following = np.hstack([upcoming[:, 1:], np.full((len(held), 1), last)])  # next held point
    has_next = following < last
    rows = np.arange(len(held))[:, None]
    safe = np.where(has_next, following, 0)
    same_step = (step_tp[rows, safe] == step_tp) & (step_fp[rows, safe] == step_fp)
    first = columns[None, :] == np.argmax(held, axis=1)[:, None]
    dropped = held & has_next & ~first & same_step & (held.sum(axis=1) > 2)[:, None]
    return _first_crossing(tp / tp[:, -1:], fp / fp[:, -1:], held & ~dropped)
