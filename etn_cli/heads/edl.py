"""The evidential objectives shared by ETN and the EDL baselines (paper Sec. 3.2 and 4.2)."""

from __future__ import annotations

import functools
import math

import torch
from torch.nn import functional as F


@functools.lru_cache(maxsize=64)  # called every training step with the same two numbers
def target_log_pi(num_classes: int, nu: float) -> tuple[float, float]:
    """``E[log pi_i]`` under the target ``Dir(1 + (nu - 1) e_y)``: ``(c_y, c_other)``.

    ``E[log pi_i] = digamma(alpha^y_i) - digamma(alpha^y_0)`` with ``alpha^y_0 = nu + C - 1``,
    so it is ``digamma(nu) - digamma(nu + C - 1)`` for the label and
    ``digamma(1) - digamma(nu + C - 1)`` for every other class.
    """
    total = torch.digamma(torch.tensor(nu + num_classes - 1, dtype=torch.float64))
    c_y = torch.digamma(torch.tensor(nu, dtype=torch.float64)) - total
    c_other = torch.digamma(torch.tensor(1.0, dtype=torch.float64)) - total
    return float(c_y), float(c_other)


def expected_dirichlet_log_density(
    alpha: torch.Tensor, labels: torch.Tensor, nu: float
) -> torch.Tensor:
    """``E_{pi ~ Dir(alpha^y)}[log Dir(pi | alpha)]`` for each row of ``alpha`` (..., B, C).

    ``lgamma(alpha_0) - sum_i lgamma(alpha_i) + sum_i (alpha_i - 1) E[log pi_i]`` (paper Eq. 8),
    with the sum over classes written through ``alpha_0`` and ``alpha_y`` so no (B, C) target
    tensor is built. ``labels`` (B,) broadcasts over leading MC dimensions.
    """
    num_classes = alpha.shape[-1]
    c_y, c_other = target_log_pi(num_classes, nu)
    alpha0 = alpha.sum(-1)  # (..., B)
    alpha_y = alpha.gather(-1, labels.expand(*alpha.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    cross = c_other * (alpha0 - num_classes) + (c_y - c_other) * (alpha_y - 1)
    return torch.lgamma(alpha0) - torch.lgamma(alpha).sum(-1) + cross


def dirichlet_kl_to_target(alpha: torch.Tensor, labels: torch.Tensor, nu: float) -> torch.Tensor:
    """Reverse KL ``KL(Dir(alpha) || Dir(alpha^y))`` per row (B,), the EDL baselines' loss.

    ``lgamma(a0) - sum lgamma(a_i) - lgamma(b0) + sum lgamma(b_i)
    + sum_i (a_i - b_i)(digamma(a_i) - digamma(a0))`` with ``b = 1 + (nu - 1) e_y``.
    """
    num_classes = alpha.shape[-1]
    alpha0 = alpha.sum(-1)
    target = torch.ones_like(alpha).scatter(-1, labels.unsqueeze(-1), nu)
    const = math.lgamma(nu) - math.lgamma(nu + num_classes - 1)
    digamma_gap = torch.digamma(alpha) - torch.digamma(alpha0).unsqueeze(-1)
    return (
        torch.lgamma(alpha0)
        - torch.lgamma(alpha).sum(-1)
        + const
        + ((alpha - target) * digamma_gap).sum(-1)
    )


def gamma_kl(
    shape: torch.Tensor, rate: torch.Tensor, prior_shape: float, prior_rate: float
) -> torch.Tensor:
    """Closed-form ``KL(Gamma(k, r) || Gamma(s, t))`` elementwise (rate parameterisation).

    ``(k - s) digamma(k) - lgamma(k) + lgamma(s) + s (log r - log t) + k (t - r) / r``.
    """
    s, t = prior_shape, prior_rate
    return (
        (shape - s) * torch.digamma(shape)
        - torch.lgamma(shape)
        + math.lgamma(s)
        + s * (torch.log(rate) - math.log(t))
        + shape * (t - rate) / rate
    )


def gamma_prior(mode: float, variance: float) -> tuple[float, float]:
    """Shape and rate of the Gamma with the given mode and variance (paper Sec. 4.3).

    Solving ``(s - 1) / t = mode`` and ``s / t^2 = variance``:
    ``t = (mode + sqrt(mode^2 + 4 variance)) / (2 variance)``, ``s = 1 + mode t``
    (mode 10, variance 5 gives s = 21.954, t = 2.0954).
    """
    if mode <= 0 or variance <= 0:
        raise ValueError(f"prior mode and variance must be positive, got {mode}, {variance}")
    rate = (mode + math.sqrt(mode**2 + 4 * variance)) / (2 * variance)
    return 1 + mode * rate, rate


def evidence(scaled_logits: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dirichlet parameters ``alpha = softplus(A z) + b`` (paper Sec. 4.3: softplus as f)."""
    return F.softplus(scaled_logits) + b


def inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))
