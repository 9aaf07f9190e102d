"""Evaluation metrics: accuracy, calibration, confidence and OOD detection (DESIGN §3).

Confidence estimation scores prediction correctness (correct = positive) on the ID test set;
OOD detection scores ID test samples (positive) against OOD samples (negative), as in the
paper's section "Uncertainty Metrics". Every score is first oriented with :func:`id_score` so
that higher always means more confident / more ID. A metric that is undefined (one class
only) is reported as ``value=None`` with a note, never as a silent 0 or NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.metrics.ranking import RANKING_METRICS, ranking_values
from etn_cli.metrics.scores import id_score
from etn_cli.metrics.selective import SELECTIVE_METRICS, selective_values

ECE_BINS = 15
NLL_FLOOR = 1e-12


@dataclass(frozen=True)
class MetricValue:
    """One metric value; ``score`` names the uncertainty score it ranks by (None if none)."""

    metric: str
    score: str | None
    value: float | None
    note: str | None = None


def _check_probs(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return float64 probabilities (N, C) and int labels (N,), or raise an EtnError."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    if probs.ndim != 2 or labels.shape != (probs.shape[0],) or probs.shape[0] == 0:
        raise EtnError(
            f"Expected probs (N, C) and labels (N,) with N >= 1, got {probs.shape} and "
            f"{labels.shape}. Pass one label per row of probabilities."
        )
    if labels.min() < 0 or labels.max() >= probs.shape[1]:
        raise EtnError(
            f"Expected labels in 0..{probs.shape[1] - 1}, found {labels.min()}..{labels.max()}. "
            "Check that the head and the dataset use the same class list."
        )
    return probs, labels.astype(np.int64)


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray) -> float:
    """ECE with 15 equal-width bins (lo, hi]: ``sum_b n_b / N * |acc_b - conf_b|``."""
    bins = np.clip(np.ceil(confidence * ECE_BINS).astype(np.int64) - 1, 0, ECE_BINS - 1)  # (N,)
    # n_b / N * |acc_b - conf_b| equals |sum of correct - sum of confidence| / N within bin b.
    conf_sum = np.bincount(bins, weights=confidence, minlength=ECE_BINS)  # (B,)
    acc_sum = np.bincount(bins, weights=correct.astype(np.float64), minlength=ECE_BINS)  # (B,)
    return float(np.abs(acc_sum - conf_sum).sum() / confidence.size)


def classification_metrics(
    probs: np.ndarray, labels: np.ndarray, predictions: np.ndarray | None = None
) -> list[MetricValue]:
    """Accuracy, ECE, NLL and Brier score of predictive probabilities.

    ``predictions`` (N,) overrides ``probs.argmax`` for accuracy (heads break exact ties in
    the probabilities by the logits, see :class:`etn_cli.heads.base.Prediction`).

    ``nll = mean_n -log max(p_{n,y_n}, 1e-12)``;
    ``brier = mean_n sum_i (p_{n,i} - [i = y_n])^2``.
    """
    probs, labels = _check_probs(probs, labels)  # (N, C), (N,)
    rows = np.arange(labels.size)
    predicted = probs.argmax(axis=1) if predictions is None else np.asarray(predictions)
    correct = predicted == labels  # (N,)
    onehot = np.zeros_like(probs)
    onehot[rows, labels] = 1.0
    nll = -np.log(np.clip(probs[rows, labels], NLL_FLOOR, None)).mean()
    brier = ((probs - onehot) ** 2).sum(axis=1).mean()
    ece = expected_calibration_error(probs.max(axis=1), correct)
    values = {"acc": correct.mean(), "ece": ece, "nll": nll, "brier": brier}
    return [MetricValue(name, None, float(value)) for name, value in values.items()]


def ranking_metrics(labels: np.ndarray, scores: np.ndarray, score: str) -> list[MetricValue]:
    """Every metric of :data:`RANKING_METRICS` of ``scores`` (higher = more ID-like) against
    binary ``labels`` (1 = ID-like); see :mod:`etn_cli.metrics.ranking` for each definition."""
    values = ranking_values(labels, scores)
    return [MetricValue(name, score, values[name]) for name in RANKING_METRICS]


def _undefined(score: str, note: str) -> list[MetricValue]:
    """The ranking metrics of ``score`` marked undefined, with the reason."""
    return [MetricValue(name, score, None, f"undefined: {note}") for name in RANKING_METRICS]


def _oriented(name: str, values: np.ndarray, size: int, what: str) -> np.ndarray:
    """Score ``name`` oriented higher = more ID, checked to be finite with ``size`` entries."""
    oriented = id_score(name, values)  # (N,)
    if oriented.shape != (size,):
        raise EtnError(
            f"Score '{name}' on the {what} has shape {oriented.shape}, expected ({size},). "
            "Pass one score per sample."
        )
    if not np.isfinite(oriented).all():
        count = int((~np.isfinite(oriented)).sum())
        raise EtnError(
            f"Score '{name}' on the {what} contains {count} non-finite values. "
            "Check the head's outputs (alpha overflow or NaN logits)."
        )
    return oriented


def confidence_metrics(scores: dict[str, np.ndarray], correct: np.ndarray) -> list[MetricValue]:
    """The ranking metrics of each score at telling correct (ID-like: the positive class of
    ``aupr``, ``aupr_in`` and ``fpr95_id``) from wrong predictions (positive for ``aupr_out``
    and ``fpr95``, OpenOOD's reading)."""
    correct = np.asarray(correct, dtype=bool)  # (N,)
    n_right = int(correct.sum())
    note = None
    if correct.size == 0:
        note = "no predictions to score"
    elif n_right in (0, correct.size):
        note = f"all {correct.size} predictions are {'correct' if n_right else 'wrong'}"
    results: list[MetricValue] = []
    for name, values in scores.items():
        oriented = _oriented(name, values, correct.size, "ID test set")
        if note is not None:
            results += _undefined(name, note)
        else:
            results += ranking_metrics(correct.astype(np.int64), oriented, name)
    return results


def selective_metrics(scores: dict[str, np.ndarray], correct: np.ndarray) -> list[MetricValue]:
    """AURC, E-AURC and the risk at 80/90/95% coverage of each score used as the confidence
    of selective prediction (:mod:`etn_cli.metrics.selective`)."""
    correct = np.asarray(correct, dtype=bool)  # (N,)
    results: list[MetricValue] = []
    for name, values in scores.items():
        if correct.size == 0:
            results += [MetricValue(m, name, None, "undefined: no predictions to score")
                        for m in SELECTIVE_METRICS]  # fmt: skip
            continue
        found = selective_values(_oriented(name, values, correct.size, "ID test set"), correct)
        results += [MetricValue(m, name, float(found[m][0])) for m in SELECTIVE_METRICS]
    return results


def ood_metrics(
    id_scores: dict[str, np.ndarray], ood_scores: dict[str, np.ndarray]
) -> list[MetricValue]:
    """The ranking metrics of each score shared by both sets: ID is the positive class of the
    paper's ``aupr``, ``aupr_in`` and ``fpr95_id``; OOD is positive for ``aupr_out`` and
    OpenOOD's ``fpr95`` (ID rejected at 95% OOD recall)."""
    shared = [name for name in id_scores if name in ood_scores]
    results: list[MetricValue] = []
    for name in shared:
        id_values = np.asarray(id_scores[name]).reshape(-1)  # (N_id,)
        ood_values = np.asarray(ood_scores[name]).reshape(-1)  # (N_ood,)
        if ood_values.size == 0:
            raise EtnError(
                f"The OOD set has no samples (score '{name}'). "
                "Check the OOD split name or re-run extract for it."
            )
        if id_values.size == 0:
            results += _undefined(name, "the ID test set has no samples")
            continue
        values = np.concatenate(
            [
                _oriented(name, id_values, id_values.size, "ID test set"),
                _oriented(name, ood_values, ood_values.size, "OOD set"),
            ]
        )  # (N_id + N_ood,)
        labels = np.r_[np.ones(id_values.size), np.zeros(ood_values.size)].astype(np.int64)
        results += ranking_metrics(labels, values, name)
    return results
