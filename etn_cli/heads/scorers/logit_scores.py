"""Scores read from the logits alone, with nothing to fit: max-logit, entropy and GEN."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import HeadConfig, heads
from etn_cli.heads.scorers.base import Scorer


@heads.register("max_logit")
class MaxLogit(Scorer):
    """Maximum logit (MLS; Hendrycks et al., "Scaling Out-of-Distribution Detection for
    Real-World Settings", ICML 2022): ``mls = max_i z_i``, higher = more ID."""

    name = "max_logit"
    label = "Max logit"
    score_name = "mls"

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return z.double().max(dim=1).values


@heads.register("entropy")
class Entropy(Scorer):
    """Predictive entropy of the backbone's softmax, ``entropy = -sum_i p_i log p_i`` with
    ``0 log 0 = 0``; higher = more OOD (the classic uncertainty baseline that pytorch-ood and
    OpenOOD list beside MSP)."""

    name = "entropy"
    label = "Entropy"
    score_name = "entropy"
    higher_means_id = False

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(z.double(), dim=1)
        return -(log_p.exp() * log_p).sum(dim=1)


@dataclass(frozen=True)
class GENConfig(HeadConfig):
    gamma: float = 0.1  # the paper's default
    top_m: int = 100  # classes kept; min(top_m, C)

    def __post_init__(self) -> None:
        if not 0 < self.gamma < 1 or self.top_m < 1:
            raise EtnError(
                f"gen expects 0 < gamma < 1 and top_m >= 1, got {self.gamma} and {self.top_m}. "
                "The paper uses gamma = 0.1, top_m = 100."
            )


@heads.register("gen")
class GEN(Scorer):
    """Generalized entropy (Liu et al., "GEN: Pushing the Limits of Softmax-Based
    Out-of-Distribution Detection", CVPR 2023): with the M largest probabilities
    ``p_(1) >= ... >= p_(M)`` (``M = min(top_m, C)``),
    ``gen = -sum_{j <= M} p_(j)^gamma (1 - p_(j))^gamma``; higher = more ID. Defaults
    ``gamma = 0.1``, ``M = 100`` are the paper's (and OpenOOD's); no clipping of ``p``
    (pytorch-ood clips to [1e-7, 1 - 1e-7] and averages instead of summing, which ranks alike
    except where it clips)."""

    name = "gen"
    label = "GEN"
    Config = GENConfig
    score_name = "gen"

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(z.double(), dim=1)
        m = min(self.config.top_m, p.shape[1])
        top = p.topk(m, dim=1).values
        g = self.config.gamma
        return -(top.pow(g) * (1.0 - top).pow(g)).sum(dim=1)
