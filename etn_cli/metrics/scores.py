"""Uncertainty scores shared by every head (paper, section "Uncertainty Metrics"; DESIGN §3).

Dirichlet heads report MP, UM, MI and DE from their concentration ``alpha``; plain softmax heads
report MP; sampling heads (MC dropout, ensembles, Laplace) report MP and MI from their samples.
Everything is computed in float64 because lgamma/digamma lose precision in float32 for the
large concentrations that confident evidential heads produce.
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, gammaln

from etn_cli.errors import EtnError
from etn_cli.metrics.score_names import HIGHER_MEANS_ID as HIGHER_MEANS_ID


def _row_span(rows: np.ndarray) -> str:
    """Describe a sorted set of row indices as ``row 4`` or ``rows 4..6``."""
    return f"row {rows[0]}" if rows.size == 1 else f"rows {rows[0]}..{rows[-1]}"


def _as_matrix(values: np.ndarray, name: str) -> np.ndarray:
    """Return ``values`` as a finite float64 (N, C) array, or raise an EtnError saying where."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2:
        raise EtnError(
            f"Expected {name} of shape (N, C), got shape {array.shape}. "
            "Pass one row per sample and one column per class."
        )
    bad = ~np.isfinite(array)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise EtnError(
            f"{name} contains {int(bad.sum())} non-finite values ({_row_span(rows)}). "
            "Check the head's outputs, or extract in float32 "
            '(dtype = "float32" in [backbone]).'
        )
    return array


def check_alpha(alpha: np.ndarray) -> np.ndarray:
    """Validate a Dirichlet concentration: finite and strictly positive, shape (N, C)."""
    alpha = _as_matrix(alpha, "alpha")  # (N, C)
    bad = alpha <= 0
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise EtnError(
            f"alpha must be > 0 but contains {int(bad.sum())} non-positive values "
            f"({_row_span(rows)}). Use a positive evidence function such as softplus + 1."
        )
    return alpha


def dirichlet_scores(alpha: np.ndarray) -> dict[str, np.ndarray]:
    """MP, UM, MI and DE of Dir(alpha) per sample (paper, section "Uncertainty Metrics").

    With ``alpha_0 = sum_i alpha_i`` and ``p = alpha / alpha_0``:

    * ``mp = max_i p_i``
    * ``um = alpha_0``
    * ``mi = -sum_i p_i (log p_i - digamma(alpha_i + 1) + digamma(alpha_0 + 1))``
    * ``de = sum_i lgamma(alpha_i) - lgamma(alpha_0)
      - sum_i (alpha_i - 1)(digamma(alpha_i) - digamma(alpha_0))``

    Each value has shape (N,).
    """
    alpha = check_alpha(alpha)  # (N, C)
    alpha0 = alpha.sum(axis=1, keepdims=True)  # (N, 1)
    p = alpha / alpha0  # (N, C)
    expected_entropy_gap = np.log(p) - digamma(alpha + 1.0) + digamma(alpha0 + 1.0)  # (N, C)
    mi = -(p * expected_entropy_gap).sum(axis=1)  # (N,)
    log_beta = gammaln(alpha).sum(axis=1) - gammaln(alpha0[:, 0])  # (N,)
    de = log_beta - ((alpha - 1.0) * (digamma(alpha) - digamma(alpha0))).sum(axis=1)  # (N,)
    return {"mp": p.max(axis=1), "um": alpha0[:, 0], "mi": mi, "de": de}


def probability_scores(probs: np.ndarray) -> dict[str, np.ndarray]:
    """Max probability ``mp = max_i p_i`` of a softmax head, shape (N,)."""
    probs = _as_matrix(probs, "probs")  # (N, C)
    return {"mp": probs.max(axis=1)}


def _entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy ``-sum_i p_i log p_i`` over the last axis, with ``0 log 0 = 0``."""
    logs = np.log(np.where(probs > 0, probs, 1.0))
    return -(probs * logs).sum(axis=-1)


def sample_scores(prob_samples: np.ndarray) -> dict[str, np.ndarray]:
    """MP and MI of a sampling head from its S probability samples (paper, eq. for MI).

    ``mp = max_i mean_s p_si`` and ``mi = H[mean_s p_s] - mean_s H[p_s]``, each (N,).
    """
    samples = np.asarray(prob_samples, dtype=np.float64)  # (S, N, C)
    if samples.ndim != 3 or samples.shape[0] == 0:
        raise EtnError(
            f"Expected probability samples of shape (S, N, C) with S >= 1, got {samples.shape}. "
            "Stack the samples along a new first axis."
        )
    _as_matrix(samples.reshape(-1, samples.shape[-1]), "probability samples")
    mean = samples.mean(axis=0)  # (N, C)
    mi = _entropy(mean) - _entropy(samples).mean(axis=0)  # (N,)
    return {"mp": mean.max(axis=1), "mi": np.maximum(mi, 0.0)}


def id_score(name: str, values: np.ndarray) -> np.ndarray:
    """Return ``values`` oriented so that higher means more ID / more confident.

    Scores where higher means more OOD (MI, DE) are negated; the others are returned as float64.
    """
    if name not in HIGHER_MEANS_ID:
        known = ", ".join(sorted(HIGHER_MEANS_ID))
        raise EtnError(f"Unknown score '{name}'. Known scores: {known}.")
    values = np.asarray(values, dtype=np.float64)
    return values if HIGHER_MEANS_ID[name] else -values
