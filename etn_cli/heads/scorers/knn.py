"""Nearest-neighbour scorers on L2-normalised penultimate features: KNN and NNGuide."""

from __future__ import annotations

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer, energy
from etn_cli.heads.scorers.neighbours import kth_squared_distance, normalise, top_inner_products


def check_bank(rows: int, k: int, head: str) -> None:
    if rows < k:
        raise EtnError(
            f"{head} needs at least k = {k} ID rows to search, got {rows}. Lower k or give a "
            'larger fit split (fit = "train" in [data]).'
        )


@heads.register("knn")
class KNN(Scorer):
    """KNN (Sun et al., "Out-of-Distribution Detection with Deep Nearest Neighbors", ICML
    2022): the bank is the normalised ID features ``z_i = h_i / ||h_i||``; the score is the
    negative squared distance from the normalised test feature to its ``k``-th nearest bank
    row, ``knn = -||z - z_(k)||^2`` (the authors' and OpenOOD's faiss ``IndexFlatL2`` value),
    higher = more ID. ``k = 50`` is the paper's CIFAR-10 setting (OpenOOD's ``K = 50`` and
    pytorch-ood's default too); on ImageNet the paper uses ``k = 1000`` with the whole training
    set and ``k = 10`` with 1% of it (k scales with the bank: ``fit_rows`` = 10% suggests
    ``k = 100``). Exact search by blocked matrix products."""

    def fit_scorer(self, h, z, y, classifier) -> None:
        check_bank(len(h), self.config.k, "knn")
        self.bank_ = normalise(h)

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return -kth_squared_distance(normalise(h), self.bank_, self.config.k)


@heads.register("nnguide")
class NNGuide(Scorer):
    """NNGuide (Park et al., "Nearest Neighbor Guidance for Out-of-Distribution Detection",
    ICCV 2023): the bank holds the normalised ID features scaled by their energy,
    ``b_i = logsumexp(z_i) h_i / ||h_i||``; the score multiplies the test sample's energy by
    its guidance, the mean of its ``k`` largest inner products with the bank:
    ``nnguide = logsumexp(z) * mean(top_k(h / ||h|| . b))``, higher = more ID.

    ``k = 10`` is the authors' (their code's detector config, ``knn_k: 10``; pytorch-ood's
    default too). OpenOOD uses ``K = 100`` on a bank of 1% of ImageNet's training set
    (``alpha = 0.01``): set ``k = 100`` for its value. The bank here is the whole fit split."""

    def fit_scorer(self, h, z, y, classifier) -> None:
        check_bank(len(h), self.config.k, "nnguide")
        self.bank_ = normalise(h) * energy(z).float()[:, None]

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        guidance = top_inner_products(normalise(h), self.bank_, self.config.k).double().mean(1)
        return energy(z) * guidance
