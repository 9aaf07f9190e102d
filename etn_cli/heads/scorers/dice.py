"""DICE (Sun & Li, "DICE: Leveraging Sparsification for Out-of-Distribution Detection",
ECCV 2022).

Fit (ID statistics and the classifier): the contribution of unit j to class c is
``V_cj = W_cj * mean_ID(h_j)``; the weights whose contribution exceeds the ``sparsity``-th
percentile of all C x D contributions are kept, the others set to 0. Score:
``dice = logsumexp(W_masked h + b)``, higher = more ID; the probabilities are the softmax of
the sparsified logits. ``sparsity = 90`` is the paper's CIFAR setting and OpenOOD's default;
the paper uses 70 on ImageNet (``pipelines/openood_imagenet.toml`` sets it).
"""

from __future__ import annotations

import numpy as np
import torch

from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer, linear
from etn_cli.heads.scorers.statistics import column_mean


@heads.register("dice")
class DICE(Scorer):
    energy_of_logits = True

    def fit_scorer(self, h, z, y, classifier) -> None:
        weight = classifier["weight"]  # (C, D)
        contribution = weight * column_mean(h).float()  # (C, D)
        threshold = np.percentile(contribution.cpu().numpy(), self.config.sparsity)
        self.weight_ = torch.where(contribution > float(threshold), weight, 0.0)
        self.bias_ = classifier["bias"]

    def scorer_logits(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return linear(h, self.weight_, self.bias_)
