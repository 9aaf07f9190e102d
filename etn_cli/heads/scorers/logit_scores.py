"""Scores read from the logits alone, with nothing to fit: max-logit, entropy and GEN."""

from __future__ import annotations

import torch

from etn_cli.heads.base import heads
from etn_cli.heads.scorers import softmax_terms
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.threads import one_thread


@heads.register("max_logit")
class MaxLogit(Scorer):
    """Maximum logit (MLS; Hendrycks et al., "Scaling Out-of-Distribution Detection for
    Real-World Settings", ICML 2022): ``mls = max_i z_i``, higher = more ID."""

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return z.max(dim=1).values.double()


@heads.register("entropy")
class Entropy(Scorer):
    """Predictive entropy of the backbone's softmax, ``entropy = -sum_i p_i log p_i`` with
    ``0 log 0 = 0``; higher = more OOD (the classic uncertainty baseline that pytorch-ood and
    OpenOOD list beside MSP)."""

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return softmax_terms.entropy(z)


@heads.register("gen")
class GEN(Scorer):
    """Generalized entropy (Liu et al., "GEN: Pushing the Limits of Softmax-Based
    Out-of-Distribution Detection", CVPR 2023): with the M largest probabilities
    ``p_(1) >= ... >= p_(M)`` (``M = min(top_m, C)``),
    ``gen = -sum_{j <= M} p_(j)^gamma (1 - p_(j))^gamma``; higher = more ID. Defaults
    ``gamma = 0.1``, ``M = 100`` are the paper's (and OpenOOD's); no clipping of ``p``
    (pytorch-ood clips to [1e-7, 1 - 1e-7] and averages instead of summing, which ranks alike
    except where it clips)."""

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """In float64 blocks of rows; ``1 - p`` of the top class as ``r / (1 + r)`` (the rest
        ``r`` of :mod:`~etn_cli.heads.scorers.softmax_terms`), exact where ``p`` rounds to 1;
        on one thread (:func:`~etn_cli.heads.scorers.threads.one_thread`)."""
        m, g = min(self.config.top_m, z.shape[1]), self.config.gamma
        rows = softmax_terms.block_rows(z)
        out = torch.empty(len(z), dtype=torch.float64, device=z.device)
        with one_thread():
            for start in range(0, len(z), rows):
                block = z[start : start + rows]
                top, index = block.topk(m, dim=1)  # (rows, M), descending
                top = top.double()
                e = torch.exp(block.double() - top[:, :1]).scatter_(1, index[:, :1], 0.0)
                rest = e.sum(dim=1, keepdim=True)  # without the top logit's own term, 1
                p = torch.exp(top - top[:, :1]) / (1.0 + rest)  # (rows, M)
                q = torch.cat([rest / (1.0 + rest), 1.0 - p[:, 1:]], dim=1)  # 1 - p
                out[start : start + rows] = -(p.pow(g) * q.pow(g)).sum(dim=1)
        return out
