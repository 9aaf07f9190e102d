"""KL matching (Hendrycks et al., "Scaling Out-of-Distribution Detection for Real-World
Settings", ICML 2022).

Fit (ID statistics): for each class k that the backbone predicts on some ID row, the template
``d_k`` = the mean softmax of the ID rows predicted as k. Score:
``klm(x) = -min_k KL(p(x) || d_k)``, higher = more ID. Labels are not used (the templates
follow the predictions, as in the paper and OpenOOD); classes never predicted have no template.
"""

from __future__ import annotations

import torch

from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer


@heads.register("kl_matching")
class KLMatching(Scorer):
    name = "kl_matching"
    label = "KL matching"
    score_name = "klm"
    needs_id_statistics = True

    def fit_scorer(self, h, z, y, classifier) -> None:  # noqa: ANN001
        p = torch.softmax(z.double(), dim=1)  # (N, C)
        predicted = p.argmax(dim=1)
        sums = p.new_zeros(p.shape[1], p.shape[1]).index_add_(0, predicted, p)  # (C, C)
        counts = torch.bincount(predicted, minlength=p.shape[1])
        present = counts > 0
        templates = sums[present] / counts[present, None]  # (K, C)
        tiny = torch.finfo(torch.float64).tiny
        self.log_templates_ = templates.clamp_min(tiny).log()

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(z.double(), dim=1)
        p = log_p.exp()
        # KL(p || d_k) = sum p log p - sum p log d_k, for every template at once: (N, K)
        kl = (p * log_p).sum(1, keepdim=True) - p @ self.log_templates_.T
        return -kl.min(dim=1).values
