"""DDU (Mukhoti et al., "Deep Deterministic Uncertainty: A New Simple Baseline", CVPR 2023):
Gaussian discriminant analysis on the penultimate features.

Fit (ID statistics): per class c the mean ``mu_c`` and the full covariance
``Sigma_c = sum_{i in c} (h_i - mu_c)(h_i - mu_c)^T / (n_c - 1)`` (the authors'
``centered_cov_torch``), plus the smallest jitter ``eps I`` of the authors' list
(0, the smallest float64, 1e-308, 1e-307, ..., 0.1) that makes every ``Sigma_c + eps I`` positive
definite. Score: the log density of the mixture without class weights, as the authors
compute it, ``ddu = logsumexp_c log N(h; mu_c, Sigma_c + eps I)``, higher = more ID.

"Positive definite" is read with the margin of :func:`~etn_cli.heads.scorers.statistics.precision`:
every pivot of the Cholesky factor above ``D`` float64 epsilons of the class's largest variance.
The authors accept any jitter at which the factorisation succeeds; where a class covariance is
singular (units that never fire for a class, fewer rows than dimensions) that is a pivot at
rounding-noise level, so the jitter and every density then depend on the last bits of the
features (on digits, two machines printed DDU AUROC 90.0 and 92.2). The margin picks the same
jitter as the authors wherever theirs is clear of that noise.

The per-class covariances and their inverse factors take ``2 C D^2`` float64 values; past
``memory_limit_gib`` (ImageNet's 1,000 classes at D = 2,048 need 62.5 GiB) the head refuses
with that figure and suggests the tied-covariance scorers instead, as the matrix ETN refuses
C = 1,000.
"""

from __future__ import annotations

import math

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer, per_class_rows
from etn_cli.heads.scorers.statistics import gram

JITTERS = [0.0, torch.finfo(torch.float64).tiny] + [10.0**e for e in range(-308, 0)]


def smallest_jitter(covariances: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The first jitter of ``JITTERS`` whose ``Sigma_c + eps I`` (C, D, D) all have a Cholesky
    factor with every squared pivot above ``D`` float64 epsilons of the class's largest
    variance, and those factors (C, D, D). Each pivot grows with ``eps`` (it is
    ``1 / [(A_k + eps I)^-1]_kk`` of a leading block), so the first is found by bisection over
    the list: about 9 factorisations instead of up to 310 in turn."""
    dim = covariances.shape[1]
    eye = torch.eye(dim, dtype=covariances.dtype, device=covariances.device)
    largest = covariances.diagonal(dim1=1, dim2=2).abs().amax(1)  # (C,)
    floor = largest * dim * torch.finfo(torch.float64).eps  # (C,)

    def factorised(index: int) -> torch.Tensor | None:
        factors, info = torch.linalg.cholesky_ex(covariances + JITTERS[index] * eye)
        pivots = factors.diagonal(dim1=1, dim2=2).square()  # (C, D)
        return factors if not info.any() and bool((pivots > floor[:, None]).all()) else None

    if (found := factorised(0)) is not None:
        return JITTERS[0], found
    low, high = 0, len(JITTERS) - 1  # factorised(low) fails; high: to be checked
    best = factorised(high)
    if best is None:
        raise EtnError(
            "DDU: the class covariances stay singular with every jitter up to 0.1. Check the "
            "features (constant or duplicated columns)."
        )
    while high - low > 1:
        middle = (low + high) // 2
        if (found := factorised(middle)) is None:
            low = middle
        else:
            high, best = middle, found
    return JITTERS[high], best


@heads.register("ddu")
class DDU(Scorer):
    def fit_scorer(self, h, z, y, classifier) -> None:
        classes, dim = z.shape[1], h.shape[1]
        gib = classes * dim * dim * 8 * 2 / 2**30  # covariances and their inverse factors
        if gib > self.config.memory_limit_gib:
            raise EtnError(
                f"DDU keeps a {dim} x {dim} covariance per class: {classes} classes need "
                f"{gib:.1f} GiB (memory_limit_gib = {self.config.memory_limit_gib:g}). Use "
                "mahalanobis, mahalanobis_pp or rmds (one tied covariance) at this many classes."
            )
        rows = per_class_rows(y, classes, "DDU")
        h = h.double()
        self.means_ = torch.stack([h[r].mean(0) for r in rows])  # (C, D)
        centred = [h[r] - m for r, m in zip(rows, self.means_, strict=True)]
        covs = torch.stack([gram(c) / max(len(c) - 1, 1) for c in centred])  # (C, D, D)
        eps, factors = smallest_jitter(covs)
        self.jitter_ = torch.tensor(eps, dtype=torch.float64)
        eye = torch.eye(dim, dtype=torch.float64, device=h.device).expand_as(factors)
        self.whiteners_ = torch.linalg.solve_triangular(factors, eye, upper=False)  # L_c^-1
        log_det = 2 * torch.log(torch.diagonal(factors, dim1=1, dim2=2)).sum(1)  # (C,)
        self.log_norm_ = -0.5 * (log_det + dim * math.log(2 * math.pi))

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = h.double()
        log_probs = torch.stack(
            [
                -0.5 * ((h - mean) @ whitener.T).pow(2).sum(1) + norm
                for mean, whitener, norm in zip(
                    self.means_, self.whiteners_, self.log_norm_, strict=True
                )
            ],
            dim=1,
        )  # (N, C)
        return torch.logsumexp(log_probs, dim=1)
