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
from etn_cli.heads.scorers.softmax_terms import block_rows
from etn_cli.heads.scorers.threads import one_thread


@heads.register("kl_matching")
class KLMatching(Scorer):
    def fit_scorer(self, h, z, y, classifier) -> None:
        classes = z.shape[1]
        predicted = z.argmax(dim=1)  # the softmax's argmax
        sums = torch.zeros(classes, classes, dtype=torch.float64, device=z.device)  # (C, C)
        step = block_rows(z)
        with one_thread():  # float64 softmax in blocks, not of every row at once
            for start in range(0, len(z), step):
                rows = slice(start, start + step)
                sums.index_add_(0, predicted[rows], torch.softmax(z[rows].double(), dim=1))
        counts = torch.bincount(predicted, minlength=classes)
        present = counts > 0
        templates = sums[present] / counts[present, None]  # (K, C)
        tiny = torch.finfo(torch.float64).tiny
        self.log_templates_ = templates.clamp_min(tiny).log()

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``KL(p || d_k) = sum p log p - sum p log d_k``, the cross term of every template at
        once (N, K). Past ``EXACT_TEMPLATES`` templates the float32 product ranks them and the
        ``CANDIDATES`` best are recomputed in float64 (a template left out would have to lie
        within float32's rounding of four better ones: its KL within about 1e-4 of theirs).
        On one thread (:func:`~etn_cli.heads.scorers.threads.one_thread`) but that product."""
        log_templates = self.log_templates_
        exact = len(log_templates) <= EXACT_TEMPLATES
        ranking = None if exact else log_templates.float().T.contiguous()  # (C, K)
        out = torch.empty(len(z), dtype=torch.float64, device=z.device)
        step = block_rows(z)
        for start in range(0, len(z), step):
            with one_thread():
                log_p = torch.log_softmax(z[start : start + step].double(), dim=1)  # (rows, C)
                p = log_p.exp()
            ranked = None if exact else p.float() @ ranking  # (rows, K)
            with one_thread():
                if exact:
                    cross = (p @ log_templates.T).max(dim=1).values
                else:
                    best = ranked.topk(CANDIDATES, dim=1).indices  # (rows, 4)
                    cross = (p[:, None, :] * log_templates[best]).sum(-1).max(dim=1).values
                out[start : start + step] = cross - (p * log_p).sum(dim=1)  # -min_k KL
        return out


EXACT_TEMPLATES = 64  # up to this many templates, every cross term in float64
CANDIDATES = 4
