"""Activation shaping per sample, with nothing to fit: ASH-P, ASH-B, ASH-S (Djurisic et al.,
"Extremely Simple Activation Shaping for Out-of-Distribution Detection", ICLR 2023) and SCALE
(Xu et al., "Scaling for Training Time and Post-hoc Out-of-distribution Detection
Enhancement", ICLR 2024).

Each keeps a row's ``k = D - round(D * percentile / 100)`` largest activations (ties broken by
``torch.topk``), shapes the row, and scores the energy of the backbone's final layer on it,
``logsumexp(W h' + b)``, higher = more ID; the probabilities are the softmax of those logits.
With ``s1`` the row's sum and ``s2`` the sum of its kept values:

* ASH-P: the others set to 0.
* ASH-B: the kept ones set to ``s1 / k``, the others to 0.
* ASH-S: the kept ones multiplied by ``exp(s1 / s2)``, the others set to 0.
* SCALE: the whole row multiplied by ``exp(s1 / s2)``, nothing pruned.

ASH acts on the penultimate activations after global pooling, as the authors' ResNet code
and OpenOOD apply it, so the cached features serve. Default percentiles are the papers'
ImageNet ResNet-50 settings (ASH paper, Table 1: ASH-P 60, ASH-B 65, ASH-S 90; SCALE paper:
85); the ASH paper uses larger ones on CIFAR (90, 90, 95), which
``pipelines/openood_cifar10.toml`` sets. OpenOOD differs for ASH: its ``ash`` postprocessor
shapes with ASH-B at percentile 90 (``ash.yml``; here ``ash_b`` with ``percentile = 90``, and
the alias ``ash``); its SCALE uses 85, as the paper.
"""

from __future__ import annotations

import torch

from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer, linear


def kept_count(dim: int, percentile: float) -> int:
    """How many activations of a row of ``dim`` survive pruning at ``percentile``."""
    return max(1, dim - int(round(dim * percentile / 100.0)))


def top_activations(h: torch.Tensor, percentile: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices of each row's kept activations, each (N, k), unsorted: the same set
    as a sorted ``topk`` (ties at zero included) at about 0.6x its cost."""
    return h.topk(kept_count(h.shape[1], percentile), dim=1, sorted=False)


def ash_p(h: torch.Tensor, percentile: float) -> torch.Tensor:
    values, index = top_activations(h, percentile)
    return torch.zeros_like(h).scatter_(1, index, values)


def ash_b(h: torch.Tensor, percentile: float) -> torch.Tensor:
    values, index = top_activations(h, percentile)
    fill = (h.sum(1, keepdim=True) / values.shape[1]).expand_as(values)
    return torch.zeros_like(h).scatter_(1, index, fill)


def kept_sum(values: torch.Tensor) -> torch.Tensor:
    """``s2``, the sum of each row's kept values (N, 1), added in descending order as a sorted
    ``topk`` returns them (the same float32 sum, bit for bit; sorting k values is cheap)."""
    return values.sort(dim=1, descending=True).values.sum(1, keepdim=True)


def ash_s(h: torch.Tensor, percentile: float) -> torch.Tensor:
    values, index = top_activations(h, percentile)
    ratio = h.sum(1, keepdim=True) / kept_sum(values)
    return torch.zeros_like(h).scatter_(1, index, values * torch.exp(ratio))


def scale(h: torch.Tensor, percentile: float) -> torch.Tensor:
    values, _ = top_activations(h, percentile)
    return h * torch.exp(h.sum(1, keepdim=True) / kept_sum(values))


class Shaping(Scorer):
    """A shaping function of a row and the percentile, then the energy of the final layer."""

    energy_of_logits = True
    shape_rows = staticmethod(ash_s)

    def fit_scorer(self, h, z, y, classifier) -> None:
        self.weight_, self.bias_ = classifier["weight"], classifier["bias"]

    def scorer_logits(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return linear(self.shape_rows(h, self.config.percentile), self.weight_, self.bias_)


@heads.register("ash_p")
class ASHP(Shaping):
    shape_rows = staticmethod(ash_p)


@heads.register("ash_b")
class ASHB(Shaping):
    shape_rows = staticmethod(ash_b)


@heads.register("ash_s")
class ASHS(Shaping):
    shape_rows = staticmethod(ash_s)


@heads.register("scale")
class SCALE(Shaping):
    shape_rows = staticmethod(scale)
