"""ID statistics shared by the Gaussian and subspace scorers: second moments accumulated in
float64 from float32 blocks, class means, tied covariances and their pseudo-inverse, and the
minimum Mahalanobis distance to the class means, never building an (N, C, D) tensor."""

from __future__ import annotations

import torch

from etn_cli.scorers.base import per_class_rows

MOMENT_ROWS = 16384  # float32 block products summed in float64: fast and accurate


def second_moment(
    x: torch.Tensor, means: torch.Tensor | None = None, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """``sum_i (x_i - m_i)(x_i - m_i)^T`` (D, D) in float64 from float32 products of row
    blocks, with ``m_i = means`` (D,), or ``means[labels[i]]`` for class means (C, D), or 0.
    Centring each block before the product keeps the small eigenvalues that
    ``E[x x^T] - mu mu^T`` would cancel away in float32."""
    total = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device)
    for start in range(0, len(x), MOMENT_ROWS):
        block = x[start : start + MOMENT_ROWS].double()
        if means is not None:
            block = block - (
                means if labels is None else means[labels[start : start + MOMENT_ROWS]]
            )
        block = block.float()
        total += (block.T @ block).double()
    return total


def class_means(h: torch.Tensor, y: torch.Tensor, classes: int, what: str) -> torch.Tensor:
    """Mean feature of each class (C, D) in float64; every class must have rows."""
    rows = per_class_rows(y, classes, what)
    return torch.stack([h[r].double().mean(0) for r in rows])


def tied_covariance(h: torch.Tensor, y: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """Shared covariance of the class-centred features, ``sum_i (h_i - mu_y)(..)^T / N``."""
    return second_moment(h, means, y) / len(h)


def covariance(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (D,) and covariance (D, D), ``/ N``, of all rows, in float64."""
    mean = h.double().mean(0)
    return mean, second_moment(h, mean) / len(h)


def precision(cov: torch.Tensor) -> torch.Tensor:
    """``pinv(cov)`` for a symmetric covariance (OpenOOD's ``EmpiricalCovariance``)."""
    return torch.linalg.pinv(cov, hermitian=True)


def squared_distances(h: torch.Tensor, means: torch.Tensor, prec: torch.Tensor) -> torch.Tensor:
    """``(h - mu_c)^T P (h - mu_c)`` for every row and class (N, C), expanded so that only
    (N, D) and (N, C) tensors are built; float64."""
    h = h.double()
    hp = h @ prec  # (N, D)
    mp = means @ prec  # (C, D)
    return (hp * h).sum(1, keepdim=True) - 2 * hp @ means.T + (mp * means).sum(1)
