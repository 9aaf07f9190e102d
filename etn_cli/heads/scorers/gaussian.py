"""Gaussian scorers on the penultimate features, beside the Mahalanobis head
(``etn_cli/heads/mahalanobis.py``): Mahalanobis++, the relative Mahalanobis distance and DDU.
Covariances are ``/ N`` and inverted with ``pinv``, as OpenOOD's ``EmpiricalCovariance``."""

from __future__ import annotations

import torch

from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.neighbours import NORM_EPS
from etn_cli.heads.scorers.statistics import (
    between_class_scatter,
    class_means,
    precision,
    second_moment,
    squared_distances,
    tied_covariance,
    whitened_means,
)


class Whitened:
    """Caches :func:`whitened_means` of the fitted (or restored) state for the row blocks
    that score calls, keyed by the state tensors themselves."""

    def whitened(self, means: torch.Tensor, prec: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = self.__dict__.setdefault("whitened_cache", {})
        key = (id(means), id(prec))
        if key not in cache or cache[key][0] is not means or cache[key][1] is not prec:
            # fresh (aligned) copies, as in RMDS.relative_parts
            cache[key] = (means, prec, whitened_means(means.clone(), prec.clone()))
        return cache[key][2]


@heads.register("mahalanobis_pp")
class MahalanobisPP(Whitened, Scorer):
    """Mahalanobis++ (Mueller & Hein, "Mahalanobis++: Improving OOD Detection via Feature
    Normalization", ICML 2025): the Mahalanobis score on L2-normalised features,
    ``z = h / ||h||``; class means and one tied covariance of the normalised ID features,
    ``mahalanobis_pp = -min_c (z - mu_c)^T Sigma^-1 (z - mu_c)``, higher = more ID."""

    def fit_scorer(self, h, z, y, classifier) -> None:
        scale = inverse_norms(h)  # float64 unit rows: a float32 one blurs correlated units
        self.means_ = class_means(h, y, z.shape[1], "Mahalanobis++", scale)
        self.precision_ = precision(tied_covariance(h, y, self.means_, scale))

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        parts = self.whitened(self.means_, self.precision_)
        unit = h.double() * inverse_norms(h)[:, None]
        return -squared_distances(unit, self.means_, self.precision_, parts).min(1).values


def inverse_norms(h: torch.Tensor) -> torch.Tensor:
    """``1 / (||h||_2 + 1e-10)`` per row (N,), float64: the KNN authors' normaliser."""
    return 1.0 / (torch.linalg.vector_norm(h, dim=1, dtype=torch.float64) + NORM_EPS)


@heads.register("rmds")
class RMDS(Whitened, Scorer):
    """Relative Mahalanobis distance (Ren et al., "A Simple Fix to Mahalanobis Distance for
    Improving Near-OOD Detection", arXiv 2021): ``MD_c`` with class means and a tied
    covariance, ``MD_0`` with one Gaussian (mean and covariance) of all ID features;
    ``rmds = -min_c (MD_c(h) - MD_0(h))``, higher = more ID. One pass over the rows: the
    covariance of all rows is the within-class scatter plus the between-class scatter of the
    class means, divided by N."""

    def fit_scorer(self, h, z, y, classifier) -> None:
        self.means_ = class_means(h, y, z.shape[1], "RMDS")
        within = second_moment(h, self.means_, y)
        counts = torch.bincount(y, minlength=z.shape[1])
        mean, between = between_class_scatter(self.means_, counts)
        self.precision_ = precision(within / len(h))
        self.background_mean_ = mean[None]
        self.background_precision_ = precision((within + between) / len(h))
        self.class_fractions_ = counts.double() / len(h)

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        low_rank = self.relative_parts()
        if low_rank is None:  # a singular within-class covariance: both distances in full
            parts = self.whitened(self.means_, self.precision_)
            md = squared_distances(h, self.means_, self.precision_, parts)  # (N, C)
            mean, prec = self.background_mean_, self.background_precision_
            md0 = squared_distances(h, mean, prec, self.whitened(mean, prec))  # (N, 1)
            return -(md - md0).min(1).values
        centre, guided, factor, offsets = low_rank
        # float64: the three terms are about 100x the score they add up to
        v = (h.double() - centre) @ guided  # (N, C): u_c^T P x
        quadratic = (v @ factor).square().sum(1)  # v^T K v = x^T (P - P_0) x
        return -(quadratic + (offsets - 2 * v).min(1).values)

    def relative_parts(self) -> tuple[torch.Tensor, ...] | None:
        """``MD_c - MD_0`` without either distance in full. With ``x = h - mu_0``,
        ``u_c = mu_c - mu_0``, ``U`` their rows (C, D) and ``F`` the class fractions, the
        background covariance is ``Sigma + U^T diag(F) U``, so by Woodbury's identity
        ``P_0 = P - P U^T K U P`` with ``K = (diag(1 / F) + U P U^T)^-1`` (C, C), and
        ``MD_c - MD_0 = u_c^T P u_c - 2 v_c + v^T K v`` with ``v = U P x`` (C,): one
        (N, D) x (D, C) and one (N, C) x (C, C) product per block of rows (float64) instead
        of two (N, D) x (D, D) whitenings. None where the within-class covariance is singular
        (``pinv``: no Woodbury identity) or the state predates ``class_fractions``."""
        fractions = getattr(self, "class_fractions_", None)
        if fractions is None:
            return None
        cache = self.__dict__.setdefault("relative_cache", {})
        if cache.get("key") is not self.precision_:
            # fresh (aligned) copies: a restored checkpoint's tensors may sit at other
            # offsets, and BLAS results can depend on alignment in the last bit
            prec = self.precision_.double().clone()
            mean = self.background_mean_.double()[0].clone()
            fractions = fractions.double().clone()
            parts = None
            if int(torch.linalg.cholesky_ex(prec)[1]) == 0:
                u = self.means_.double() - mean  # (C, D)
                guided = prec @ u.T.contiguous()  # (D, C)
                gram = u @ guided  # U P U^T (C, C)
                inverse = torch.diag(1.0 / fractions) + gram
                factor, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(
                    torch.linalg.cholesky(inverse)))  # fmt: skip
                if int(info) == 0:
                    parts = (mean, guided, factor, gram.diagonal())
            cache["key"], cache["parts"] = self.precision_, parts
        return cache["parts"]
