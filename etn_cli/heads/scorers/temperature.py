"""Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017).

``p = softmax(z / T)`` with the one temperature ``T > 0`` that minimises the negative
log-likelihood of the adaptation split (never the ``fit`` split: T is a calibration fitted on
held-out labels). The score is MP of the scaled softmax, higher = more ID; the argmax, hence
accuracy, is the backbone's.

The NLL is convex in ``beta = 1 / T`` (``logsumexp(beta z) - beta z_y`` per row), so the fit
is Newton's method on ``beta`` with the exact first and second derivatives (the mean over rows
of ``E_p[z] - z_y`` and of ``Var_p[z]``), with step halving; it converges in a handful of
steps to the global minimum, where the reference's LBFGS on T may stop early.
"""

from __future__ import annotations

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer

NEWTON_STEPS = 100
BETA_MIN, BETA_MAX = 1e-4, 1e4  # T within [1e-4, 1e4]: separable or chance-level data


BLOCK_ROWS = 2048  # rows per pass block: keeps the (rows, C) float64 temporaries small


def evaluate(beta: float, z: torch.Tensor, zy: torch.Tensor, top: torch.Tensor) -> tuple:
    """Mean NLL of ``softmax(beta z)`` for the labels' logits ``zy`` (N,), and its first and
    second derivatives in ``beta``: the means of ``E_p[z] - z_y`` and ``Var_p[z]``, from
    one exponential per logit (``top`` (N,) is each row's largest logit), float64."""
    loss = grad = curvature = 0.0
    for start in range(0, len(z), BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        zb = z[rows]
        e = torch.exp(beta * (zb - top[rows, None]))
        ez = e * zb
        s0, s1, s2 = e.sum(1), ez.sum(1), (ez * zb).sum(1)
        mean = s1 / s0  # E_p[z]
        loss += float((beta * top[rows] + s0.log() - beta * zy[rows]).sum())
        grad += float((mean - zy[rows]).sum())
        curvature += float((s2 / s0 - mean**2).sum())
    return loss / len(z), grad / len(z), curvature / len(z)


def fit_inverse_temperature(z: torch.Tensor, y: torch.Tensor) -> float:
    """``beta = 1 / T`` minimising the NLL of ``softmax(beta z)`` for labels ``y``: Newton
    steps, halved while they raise the NLL; each trial of beta reads the logits once."""
    z = z.double().contiguous()
    zy = z.gather(1, y[:, None])[:, 0]  # (N,)
    top = z.max(1).values
    beta = 1.0
    loss, grad, curvature = evaluate(beta, z, zy, top)
    for _ in range(NEWTON_STEPS):
        step = grad / curvature if curvature > 0 else -grad
        new = min(max(beta - step, BETA_MIN), BETA_MAX)
        new_loss, new_grad, new_curvature = evaluate(new, z, zy, top)
        while new_loss > loss and abs(new - beta) > 1e-12:
            new = beta + (new - beta) / 2
            new_loss, new_grad, new_curvature = evaluate(new, z, zy, top)
        if abs(new - beta) <= 1e-10 * max(1.0, beta):
            return new
        beta, loss, grad, curvature = new, new_loss, new_grad, new_curvature
    return beta


@heads.register("temperature")
class TemperatureScaling(Scorer):
    name = "temperature"
    label = "Temperature scaling"
    score_name = "mp"

    def fit_scorer(self, h, z, y, classifier) -> None:  # noqa: ANN001
        if torch.unique(y).numel() < 2:
            raise EtnError(
                "Temperature scaling needs labelled adaptation samples of 2+ classes, found one. "
                "Use a larger adaptation split."
            )
        self.temperature_ = torch.tensor(1.0 / fit_inverse_temperature(z, y), dtype=torch.float64)

    keeps_argmax = True  # a positive temperature divides every logit

    def scorer_logits(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return z.double() / self.temperature_

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.scorer_logits(h, z), dim=1).max(dim=1).values
