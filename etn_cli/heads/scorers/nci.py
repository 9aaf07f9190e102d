"""NCI (Liu & Qin, "Detecting Out-of-Distribution Through the Lens of Neural Collapse", CVPR
2025): under neural collapse an ID feature, centred on the global mean of the ID features,
points along its predicted class's weight vector, and lies far from the origin.

Fit (ID statistics): the global mean ``mu_G`` of the ID features. Score, ``k`` the predicted
class (the argmax of the cached logits): ``nci = w_k^T (h - mu_G) / ||h - mu_G|| +
norm_weight ||h||_1``, higher = more ID. The first term is the paper's proximity score without
dividing by ``||w_k||`` (nearly the same for every class under neural collapse), as pytorch-ood
computes it; ``norm_weight`` (the paper's alpha) weighs the feature norm: 0 by default
(pytorch-ood's; the paper tunes it per benchmark on held-out OOD data).
"""

from __future__ import annotations

import torch

from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer


@heads.register("nci")
class NCI(Scorer):
    def fit_scorer(self, h, z, y, classifier) -> None:
        self.mean_ = h.double().mean(0)  # mu_G (D,)
        self.weight_ = classifier["weight"]  # (C, D)

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Float32 elementwise terms (as the float32 features), float64 result."""
        centred = h - self.mean_.float()
        along = (centred * self.weight_[z.argmax(dim=1)]).sum(1).double()
        score = along / centred.norm(dim=1).double().clamp_min(1e-12)
        if self.config.norm_weight:
            score += self.config.norm_weight * h.abs().sum(1).double()
        return score
