"""Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017), the
one fit behind the ``temperature`` scorer (on the backbone's logits) and the
``calibrate = "temperature"`` setting of every head (on the head's log-probabilities)::

    p_T = softmax(s / T),    NLL(T) = mean_n [ logsumexp_i(s_ni / T) - s_n,y_n / T ],

with ``s`` the logits, or ``log p`` for a head's probabilities (Guo et al. apply it to logits;
``softmax(log p / T)`` is the same family, and any head has probabilities). Dividing one row's
scores by a positive constant never reorders them, so the predicted class is unchanged, and a
head's uncertainty scores (MP, UM, MI, DE, its own) stay exactly as the head computed them:
only the probabilities, hence ECE, NLL and Brier, move.

The NLL is convex in ``beta = 1 / T`` (``logsumexp(beta s) - beta s_y`` per row; its second
derivative is a variance), so the fit is Newton's method on ``beta`` with the exact first and
second derivatives, steps halved while they raise the NLL, kept in ``[1 / T_MAX, 1 / T_MIN]``:
a handful of passes over the scores to the global minimum, where pytorch-ood's LBFGS on T
(50 steps, lr 0.01) may stop early.

**No finite optimum.** When the adaptation split is classified with no error (or its errors
have so small a margin that the NLL still falls at ``T = T_MIN``), the NLL decreases all the
way to ``T -> 0`` (with margins so wide that it is exactly 0 in float64 already at ``T = 1``,
its slope underflows too, so this is read from the errors, not from the slope): any stopping
point is arbitrary, and a small one makes nearly every probability exactly 0 or 1 (on a
perfectly classified digits split, T = 0.01 and 0.003, and MSP's AUROC fell to 51-55%). The fit
then falls back to **Laplace's rule of succession**: ``T`` such that the mean confidence on the
adaptation split is ``(k + 1) / (n + 2)``, the accuracy one can claim after ``k`` right out of
``n`` (rule ``"laplace"``). When the NLL still falls at ``T = T_MAX`` (no better than chance),
``T`` stays at that bound (rule ``"bound"``). Either way the fit warns in one line, its record
says so, and the report's footnote names the method.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from scipy.special import softmax

T_MIN, T_MAX = 1e-2, 1e2
LOG_FLOOR = 1e-300  # log(0) would be -inf; the smallest positive float64 is ~5e-324
NEWTON_STEPS = 100
BLOCK_ROWS = 2048  # rows per pass block: keeps the (rows, C) float64 temporaries small
FALLBACKS = ("laplace", "bound", "perfect-adaptation")  # the last: etn 0.x's name of laplace


def log_probs(probs: np.ndarray) -> np.ndarray:
    """``log p`` in float64 with zeros floored, so a temperature never meets ``-inf``."""
    return np.log(np.clip(np.asarray(probs, dtype=np.float64), LOG_FLOOR, None))  # (N, C)


def apply_temperature(probs: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(log p / T)`` per row (N, C); ``T = 1`` returns the probabilities renormalised."""
    return softmax(log_probs(probs) / temperature, axis=1)


def fit_temperature(probs: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """The temperature of a head's probabilities ``probs`` (N, C) on the adaptation labels
    (N,): :func:`fit_scores_temperature` of ``log p``."""
    return fit_scores_temperature(torch.from_numpy(log_probs(probs)), labels)


def fit_scores_temperature(scores: torch.Tensor, labels: Any) -> dict[str, Any]:
    """The temperature minimising the NLL of ``softmax(scores / T)`` (N, C) at ``labels``
    (N,), or the fallback rule where there is no finite optimum (module docstring).

    Returns the record kept in the head's provenance: ``temperature``, ``rule`` (``"nll"``,
    ``"laplace"`` or ``"bound"``), the NLL before and after, ``n`` and ``correct``."""
    y = torch.as_tensor(np.asarray(labels), dtype=torch.int64).to(scores.device)
    rows = Rows(scores, y)
    beta, loss, grad = newton(rows)
    rule = "nll"
    # no finite optimum: every row right (the NLL falls toward 0 as T -> 0; where it has
    # underflowed to exactly 0 Newton sees a flat slope and stops anywhere), or still falling
    # at T_MIN
    if rows.correct == len(y) or (beta >= 1 / T_MIN and grad < 0):
        rule, beta = "laplace", laplace_beta(rows)
    elif beta <= 1 / T_MAX and grad > 0:  # still falling at T_MAX: no better than chance
        rule = "bound"
    record = {
        "method": "temperature",
        "temperature": 1.0 / beta,
        "rule": rule,
        "adapt_nll_before": rows.evaluate(1.0)[0],
        "adapt_nll_after": loss if rule == "nll" else rows.evaluate(beta)[0],
        "n": len(y),
        "correct": rows.correct,
    }
    if rule != "nll":
        warnings.warn(describe(record), stacklevel=2)
    return record


class Rows:
    """The scores (N, C) with what every pass over them needs: each row's largest score and
    the label's, and how many rows the label alone tops (float64 in blocks of rows, so
    float32 logits are never copied whole)."""

    def __init__(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        self.scores = scores
        self.top = scores.max(1).values.double()  # (N,)
        self.label = scores.gather(1, labels[:, None])[:, 0].double()  # (N,)
        ties = (scores == scores.max(1, keepdim=True).values).sum(1)
        self.correct = int(((self.label == self.top) & (ties == 1)).sum())

    def blocks(self, beta: float):
        """Per block of rows: ``exp(beta (s - top))`` (rows, C), the block's scores shifted
        by their top (rows, C) and the rows' slice, float64."""
        for start in range(0, len(self.scores), BLOCK_ROWS):
            rows = slice(start, start + BLOCK_ROWS)
            shifted = self.scores[rows].double() - self.top[rows, None]
            yield torch.exp(beta * shifted), shifted, rows

    def evaluate(self, beta: float) -> tuple[float, float, float]:
        """Mean NLL of ``softmax(beta s)`` at the labels, and its first and second derivatives
        in ``beta``: the means of ``E_p[s] - s_y`` and ``Var_p[s]``, one exponential per
        score."""
        loss = grad = curvature = 0.0
        for e, shifted, rows in self.blocks(beta):
            es = e * shifted
            s0, s1, s2 = e.sum(1), es.sum(1), (es * shifted).sum(1)
            mean = s1 / s0  # E_p[s] - top
            gap = self.label[rows] - self.top[rows]  # s_y - top <= 0
            loss += float((s0.log() - beta * gap).sum())
            grad += float((mean - gap).sum())
            curvature += float((s2 / s0 - mean**2).sum())
        n = len(self.scores)
        return loss / n, grad / n, curvature / n

    def mean_confidence(self, beta: float) -> float:
        """Mean over rows of ``max_i softmax(beta s)_i = 1 / sum_i exp(beta (s_i - top))``."""
        total = sum(float((1.0 / e.sum(1)).sum()) for e, _, _ in self.blocks(beta))
        return total / len(self.scores)


def newton(rows: Rows) -> tuple[float, float, float]:
    """``beta`` minimising the NLL within ``[1 / T_MAX, 1 / T_MIN]`` from ``beta = 1``:
    Newton steps, halved while they raise the NLL; returns ``beta``, the NLL and its slope
    there (a slope pointing out of the interval at a bound: the minimum lies beyond it)."""
    low, high = 1 / T_MAX, 1 / T_MIN
    beta = 1.0
    loss, grad, curvature = rows.evaluate(beta)
    for _ in range(NEWTON_STEPS):
        step = grad / curvature if curvature > 0 else -grad
        new = min(max(beta - step, low), high)
        new_loss, new_grad, new_curvature = rows.evaluate(new)
        while new_loss > loss and abs(new - beta) > 1e-12:
            new = beta + (new - beta) / 2
            new_loss, new_grad, new_curvature = rows.evaluate(new)
        if abs(new - beta) <= 1e-10 * max(1.0, beta):
            return new, new_loss, new_grad
        beta, loss, grad, curvature = new, new_loss, new_grad, new_curvature
    return beta, loss, grad


def laplace_beta(rows: Rows) -> float:
    """``beta`` at which the mean confidence is ``(k + 1) / (n + 2)`` (k rows right out of
    n), kept in ``[1 / T_MAX, 1 / T_MIN]``; the mean confidence rises monotonically with
    beta, so Brent's method on ``log beta`` finds it."""
    from scipy.optimize import brentq  # on use: most heads are never calibrated

    n = len(rows.scores)
    target = (rows.correct + 1) / (n + 2)
    lo, hi = np.log(1 / T_MAX), np.log(1 / T_MIN)
    gap = lambda u: rows.mean_confidence(float(np.exp(u))) - target  # noqa: E731
    if gap(lo) >= 0:
        return 1 / T_MAX
    if gap(hi) <= 0:
        return 1 / T_MIN
    return float(np.exp(brentq(gap, lo, hi, xtol=1e-10)))


def describe(record: dict[str, Any]) -> str:
    """One line on how the temperature was chosen, for warnings and ``-v`` output."""
    t, n = record["temperature"], record["n"]
    if record["rule"] in ("laplace", "perfect-adaptation"):
        k = record.get("correct", n)
        return (
            f"Temperature scaling: the adaptation NLL has no minimiser ({k} of {n} samples "
            f"classified correctly; it keeps falling as T -> 0), so T = {t:.4g} is set by "
            f"Laplace's rule: mean confidence (k + 1) / (n + 2) = {(k + 1) / (n + 2):.4f}. Adapt "
            "on a larger split with some errors for a proper fit."
        )
    if record["rule"] == "bound":
        return (
            f"Temperature scaling: the adaptation NLL still falls at the bound T = {t:.4g} "
            f"(allowed {T_MIN:g}..{T_MAX:g}; predictions no better than chance); T is kept there."
        )
    return f"Temperature scaling: T = {t:.4g} minimises the adaptation NLL."


def fallback(record: dict[str, Any] | None) -> str | None:
    """The report's short name for a temperature that fell back to a rule, else None."""
    if not record or record.get("rule") not in FALLBACKS:
        return None
    if record["rule"] == "bound":
        return f"T kept at the bound {record['temperature']:.4g}"
    return "T by Laplace's rule"
