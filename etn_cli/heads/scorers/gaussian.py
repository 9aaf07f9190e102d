"""Gaussian scorers on the penultimate features, beside the Mahalanobis head
(``etn_cli/heads/mahalanobis.py``): Mahalanobis++, the relative Mahalanobis distance and DDU.
Covariances are ``/ N`` and inverted with ``pinv``, as OpenOOD's ``EmpiricalCovariance``."""

from __future__ import annotations

import torch

from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.neighbours import normalise
from etn_cli.heads.scorers.statistics import (
    class_means,
    covariance,
    precision,
    squared_distances,
    tied_covariance,
)


@heads.register("mahalanobis_pp")
class MahalanobisPP(Scorer):
    """Mahalanobis++ (Mueller & Hein, "Mahalanobis++: Improving OOD Detection via Feature
    Normalization", ICML 2025): the Mahalanobis score on L2-normalised features,
    ``z = h / ||h||``; class means and one tied covariance of the normalised ID features,
    ``mahalanobis_pp = -min_c (z - mu_c)^T Sigma^-1 (z - mu_c)``, higher = more ID."""

    name = "mahalanobis_pp"
    label = "Mahalanobis++"
    score_name = "mahalanobis_pp"
    needs_id_statistics = True

    def fit_scorer(self, h, z, y, classifier) -> None:  # noqa: ANN001
        unit = normalise(h)
        self.means_ = class_means(unit, y, z.shape[1], "Mahalanobis++")
        self.precision_ = precision(tied_covariance(unit, y, self.means_))

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return -squared_distances(normalise(h), self.means_, self.precision_).min(1).values


@heads.register("rmds")
class RMDS(Scorer):
    """Relative Mahalanobis distance (Ren et al., "A Simple Fix to Mahalanobis Distance for
    Improving Near-OOD Detection", arXiv 2021): ``MD_c`` with class means and a tied
    covariance, ``MD_0`` with one Gaussian (mean and covariance) of all ID features;
    ``rmds = -min_c (MD_c(h) - MD_0(h))``, higher = more ID."""

    name = "rmds"
    label = "RMDS"
    score_name = "rmds"
    needs_id_statistics = True

    def fit_scorer(self, h, z, y, classifier) -> None:  # noqa: ANN001
        self.means_ = class_means(h, y, z.shape[1], "RMDS")
        self.precision_ = precision(tied_covariance(h, y, self.means_))
        mean, cov = covariance(h)
        self.background_mean_, self.background_precision_ = mean[None], precision(cov)

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        md = squared_distances(h, self.means_, self.precision_)  # (N, C)
        md0 = squared_distances(h, self.background_mean_, self.background_precision_)  # (N, 1)
        return -(md - md0).min(1).values
