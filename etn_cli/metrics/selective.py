"""Selective prediction: the risk–coverage curve of a confidence score, its area (AURC) and
the excess over an oracle's (E-AURC), and the risk at fixed coverages (Geifman & El-Yaniv 2017,
"Selective classification for deep neural networks"; Geifman et al. 2019, "Bias-reduced
uncertainty estimation for deep neural classifiers", which names AURC and E-AURC).

A classifier abstains on its least confident predictions. Ranked by a confidence ``kappa``
(higher = more confident, :func:`etn_cli.metrics.scores.id_score`), accepting the top ``k`` of
``N`` predictions gives coverage ``k / N`` and selective risk ``errors among them / k`` (0/1
loss). Then

* ``aurc = (1/N) sum_{k=1..N} risk(k)``, the area under the risk–coverage curve;
* ``eaurc = aurc - aurc*``, where ``aurc*`` is the area of the oracle that ranks every correct
  prediction first: with ``E`` errors, ``aurc* = (1/N) sum_{k=N-E+1..N} (k - N + E) / k``
  (its large-N limit is Geifman et al.'s ``r + (1 - r) ln(1 - r)``, ``r = E / N``);
* ``risk80`` / ``risk90`` / ``risk95``: the risk at coverage 80 / 90 / 95 %, accepting the top
  ``ceil(c N)`` predictions.

Tied confidences form one threshold: within a tie the errors are counted at their expected
rate (the mean over every order of the tie), so the metrics do not depend on how a sort breaks
ties. Everything takes optional row weights (B, N), the multiplicities of bootstrap resamples,
so that a paired bootstrap computes B replicates at once; integer weights give exactly the
values of the resampled rows.
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma

COVERAGES = {"risk80": 0.80, "risk90": 0.90, "risk95": 0.95}
SELECTIVE_METRICS = ("aurc", "eaurc", *COVERAGES)


def tie_groups(confidence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order that ranks ``confidence`` (N,) from most to least confident and the start of
    each run of tied values in that order (G,)."""
    order = np.argsort(-np.asarray(confidence, dtype=np.float64), kind="mergesort")  # (N,)
    ranked = np.asarray(confidence, dtype=np.float64)[order]
    starts = np.r_[0, np.flatnonzero(np.diff(ranked)) + 1]  # (G,)
    return order, starts


def _group_counts(
    confidence: np.ndarray, wrong: np.ndarray, weights: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per tie group, most confident first: the (weighted) number of predictions and of
    errors, each (B, G) (B = 1 without weights)."""
    order, starts = tie_groups(confidence)
    w = np.ones((1, len(order))) if weights is None else np.atleast_2d(weights)  # (B, N)
    w = w[:, order].astype(np.float64)
    n = np.add.reduceat(w, starts, axis=1)  # (B, G)
    e = np.add.reduceat(w * np.asarray(wrong, np.float64)[order], starts, axis=1)  # (B, G)
    return n, e


def selective_values(
    confidence: np.ndarray, correct: np.ndarray, weights: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Every metric of :data:`SELECTIVE_METRICS`, each (B,) (shape (1,) without weights).

    With ``C`` and ``E`` the predictions and errors up to and including a tie group of ``n``
    predictions with ``e`` errors (``C0``, ``E0`` before it, ``r = e / n``), the group's part
    of ``N aurc`` is ``sum_{j=1..n} (E0 + j r) / (C0 + j) = e + (E0 - r C0)(psi(C + 1) -
    psi(C0 + 1))``, ``psi`` the digamma function (harmonic numbers).
    """
    wrong = ~np.asarray(correct, dtype=bool)  # (N,)
    n, e = _group_counts(confidence, wrong, weights)  # (B, G)
    total, errors = n.cumsum(axis=1), e.cumsum(axis=1)  # (B, G)
    before, errors_before = total - n, errors - e
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(n > 0, e / n, 0.0)  # (B, G)
    harmonic = digamma(total + 1.0) - digamma(before + 1.0)
    size, wrongs = total[:, -1], errors[:, -1]  # (B,)
    aurc = (e + (errors_before - rate * before) * harmonic).sum(axis=1) / size
    right = size - wrongs
    oracle = (wrongs - right * (digamma(size + 1.0) - digamma(right + 1.0))) / size
    values = {"aurc": aurc, "eaurc": aurc - oracle}
    for name, coverage in COVERAGES.items():
        accepted = np.maximum(np.ceil(coverage * size - 1e-9), 1.0)  # (B,)
        group = (total < accepted[:, None]).sum(axis=1)  # (B,) the group holding position k
        rows = np.arange(len(size))
        within = accepted - before[rows, group]
        values[name] = (errors_before[rows, group] + within * rate[rows, group]) / accepted
    return values


def risk_coverage_curve(confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, ...]:
    """Coverage ``k / N`` and selective risk at every ``k = 1..N``, each (N,), ties counted at
    their expected error rate as in :func:`selective_values`."""
    wrong = ~np.asarray(correct, dtype=bool)
    n, e = (a[0] for a in _group_counts(confidence, wrong, None))  # (G,)
    group = np.repeat(np.arange(len(n)), n.astype(np.int64))  # (N,) the group of position k
    k = np.arange(1, len(group) + 1, dtype=np.float64)
    before = (np.cumsum(n) - n)[group]
    errors_before = (np.cumsum(e) - e)[group]
    risk = (errors_before + (k - before) * (e / n)[group]) / k
    return k / len(group), risk
