"""Post-hoc temperature scaling of any head's predictive probabilities (Guo et al. 2017).

A head with ``calibrate = "temperature"`` learns one temperature ``T`` after its own fit by
minimising the negative log-likelihood of its adaptation-set predictions::

    p_T = softmax(log p / T),    NLL(T) = mean_n [ logsumexp_i(s_ni / T) - s_n,y_n / T ],

with ``s = log p`` (Guo et al. apply it to logits; on probabilities it is the same family,
and any head has probabilities). Dividing one row's log-probabilities by a positive constant
never reorders them, so the predicted class is unchanged; the head's uncertainty scores (MP,
UM, MI, DE, its own) are left exactly as the head computed them, so every ranking metric
(AUPR, AUROC, FPR95) is unchanged too. Only the probabilities, hence ECE, NLL and Brier, move.

In ``beta = 1 / T`` the NLL is convex (its second derivative is a variance), so its minimiser
is the root of the monotone derivative, found by Brent's method on ``log beta``.

**The degenerate case.** When the head classifies every adaptation sample correctly, the NLL
decreases all the way to ``T -> 0`` (no minimiser): every probability would become 0 or 1.
Then ``T`` is set, instead, so that the mean confidence on the adaptation set equals Laplace's
rule of succession ``(n + 1) / (n + 2)`` — the accuracy one can claim after n correct out of
n — and the fit says so in its ``rule`` and with a warning. Every temperature is also kept in
``[T_MIN, T_MAX]``; a fit that lands on a bound records ``rule = "bound"``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from scipy.special import logsumexp, softmax

T_MIN, T_MAX = 1e-2, 1e2
LOG_FLOOR = 1e-300  # log(0) would be -inf; the smallest positive float64 is ~5e-324


def log_probs(probs: np.ndarray) -> np.ndarray:
    """``log p`` in float64 with zeros floored, so a temperature never meets ``-inf``."""
    return np.log(np.clip(np.asarray(probs, dtype=np.float64), LOG_FLOOR, None))  # (N, C)


def apply_temperature(probs: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(log p / T)`` per row (N, C); ``T = 1`` returns the probabilities renormalised."""
    return softmax(log_probs(probs) / temperature, axis=1)


def nll(scores: np.ndarray, labels: np.ndarray, beta: float) -> float:
    """Mean NLL of ``softmax(beta * scores)`` (N, C) at the ``labels`` (N,)."""
    rows = np.arange(len(labels))
    return float((logsumexp(beta * scores, axis=1) - beta * scores[rows, labels]).mean())


def _nll_slope(scores: np.ndarray, labels: np.ndarray, beta: float) -> float:
    """``d NLL / d beta = mean_n (E_{softmax(beta s_n)}[s_n] - s_n,y_n)``, increasing in beta."""
    expected = (softmax(beta * scores, axis=1) * scores).sum(axis=1)  # (N,)
    return float((expected - scores[np.arange(len(labels)), labels]).mean())


def _mean_confidence(scores: np.ndarray, beta: float) -> float:
    return float(softmax(beta * scores, axis=1).max(axis=1).mean())


def fit_temperature(probs: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """The temperature minimising the adaptation NLL of ``probs`` (N, C) at ``labels`` (N,).

    Returns the record kept in the head's provenance: ``temperature``, ``rule`` (``"nll"``,
    ``"bound"`` or ``"perfect-adaptation"``), the adaptation NLL before and after, and ``n``.
    """
    from scipy.optimize import brentq  # on use: most heads are never calibrated

    scores, labels = log_probs(probs), np.asarray(labels, dtype=np.int64)  # (N, C), (N,)
    lo, hi = np.log(1 / T_MAX), np.log(1 / T_MIN)  # in log beta
    correct = scores.argmax(axis=1) == labels  # (N,)
    if correct.all():
        rule, log_beta = "perfect-adaptation", _laplace_log_beta(scores, lo, hi)
    elif _nll_slope(scores, labels, np.exp(lo)) >= 0:
        rule, log_beta = "bound", lo
    elif _nll_slope(scores, labels, np.exp(hi)) <= 0:
        rule, log_beta = "bound", hi
    else:
        slope = lambda u: _nll_slope(scores, labels, np.exp(u))  # noqa: E731
        rule, log_beta = "nll", brentq(slope, lo, hi, xtol=1e-10, rtol=1e-12)
    temperature = float(np.exp(-log_beta))
    record = {
        "method": "temperature",
        "temperature": temperature,
        "rule": rule,
        "adapt_nll_before": nll(scores, labels, 1.0),
        "adapt_nll_after": nll(scores, labels, 1 / temperature),
        "n": int(len(labels)),
    }
    if rule != "nll":
        warnings.warn(describe(record), stacklevel=2)
    return record


def _laplace_log_beta(scores: np.ndarray, lo: float, hi: float) -> float:
    """``log beta`` at which the mean confidence is ``(n + 1) / (n + 2)`` (kept in bounds);
    the mean confidence rises monotonically with beta."""
    from scipy.optimize import brentq

    n = len(scores)
    target = (n + 1) / (n + 2)
    gap = lambda u: _mean_confidence(scores, np.exp(u)) - target  # noqa: E731
    if gap(lo) >= 0:
        return lo
    if gap(hi) <= 0:
        return hi
    return brentq(gap, lo, hi, xtol=1e-10)


def describe(record: dict[str, Any]) -> str:
    """One line on how the temperature was chosen, for warnings and ``-v`` output."""
    t, n = record["temperature"], record["n"]
    if record["rule"] == "perfect-adaptation":
        return (
            f"Temperature scaling: all {n} adaptation samples are classified correctly, so the "
            f"NLL has no minimiser (T -> 0); T = {t:.4g} sets the mean confidence to "
            f"(n + 1) / (n + 2) = {(n + 1) / (n + 2):.4f} instead. Adapt on a larger split "
            "with some errors for a proper fit."
        )
    if record["rule"] == "bound":
        return (
            f"Temperature scaling: the adaptation NLL is minimised at or beyond the bound "
            f"T = {t:.4g} (allowed {T_MIN:g}..{T_MAX:g}); T is kept at the bound."
        )
    return f"Temperature scaling: T = {t:.4g} minimises the adaptation NLL."
