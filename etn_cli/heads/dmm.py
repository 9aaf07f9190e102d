"""Dirichlet meta-model (Shen et al., AAAI 2023, "Post-hoc Uncertainty Learning using a Dirichlet
Meta-Model"; reference maohaos2/PosthocUQ) on pooled hidden states of several layers.

One small module per layer reads that layer's pooled hidden state (standardised with adaptation
statistics) through two linear layers with ReLUs, ``u_l = relu(W2 relu(W1 x_l))`` (C,); a final
linear layer reads their concatenation and gives the Dirichlet concentration
``alpha = exp(V [u_1; ...; u_L] + c)``. Training minimises the reference's belief-matching loss
(its ``BeliefMatchingLoss``, prior 1, coefficient 1e-3)::

    L = -(digamma(alpha_y) - digamma(alpha_0)) + lambda KL(Dir(alpha) || Dir(prior * 1))

Scores are the closed-form Dirichlet MP, UM, MI and DE of ``alpha``. The inputs are every array
in ``layers`` except ODIN's logits, plus the last hidden state (``include_hidden``).
"""

from __future__ import annotations

import copy
import json
import math

import torch
from torch import nn

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.odin import ODIN_LAYER
from etn_cli.heads.training import fit_module
from etn_cli.metrics.scores import dirichlet_scores

HIDDEN = "hidden"  # the input name of the last hidden state
LOG_ALPHA_MAX = 30.0  # alpha in [1e-13, 1e13]: finite digamma and lgamma in float32


class MetaModel(nn.Module):
    """Per-layer two-layer modules and a final linear layer over their concatenated outputs."""

    def __init__(self, widths: list[int], n_classes: int, width: int) -> None:
        super().__init__()
        self.register_buffer("means", torch.zeros(sum(widths)))
        self.register_buffer("stds", torch.ones(sum(widths)))
        self.widths = widths
        self.branches = nn.ModuleList(
            nn.Sequential(nn.Linear(d, width), nn.ReLU(), nn.Linear(width, n_classes), nn.ReLU())
            for d in widths
        )
        self.final = nn.Linear(len(widths) * n_classes, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``log alpha`` (B, C) from the concatenated pooled layers ``x`` (B, sum D_l)."""
        parts = ((x - self.means) / self.stds).split(self.widths, dim=1)
        hidden = torch.cat([branch(p) for branch, p in zip(self.branches, parts, strict=True)], 1)
        return self.final(hidden).clamp(-LOG_ALPHA_MAX, LOG_ALPHA_MAX)


def belief_matching_loss(
    log_alpha: torch.Tensor, y: torch.Tensor, kl_weight: float, prior: float
) -> torch.Tensor:
    """Per-sample loss (B,): ``-(digamma(a_y) - digamma(a_0)) + lambda KL(Dir(a) || Dir(prior))``
    with ``KL = lgamma(a_0) - sum lgamma(a_i) - lgamma(C prior) + C lgamma(prior)
    + sum (a_i - prior)(digamma(a_i) - digamma(a_0))``."""
    alpha = log_alpha.exp()  # (B, C)
    alpha0 = alpha.sum(1)
    n_classes = alpha.shape[1]
    log_likelihood = torch.digamma(alpha.gather(1, y[:, None]).squeeze(1)) - torch.digamma(alpha0)
    kl = (
        torch.lgamma(alpha0)
        - torch.lgamma(alpha).sum(1)
        - math.lgamma(n_classes * prior)
        + n_classes * math.lgamma(prior)
        + ((alpha - prior) * (torch.digamma(alpha) - torch.digamma(alpha0)[:, None])).sum(1)
    )
    return kl_weight * kl - log_likelihood


@heads.register("dmm")
class DMM(Head):
    def _inputs(self, h: torch.Tensor, layers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        found = {k: v for k, v in layers.items() if k != ODIN_LAYER}
        return found | ({HIDDEN: h} if self.config.include_hidden else {})

    def _build(self, names: list[str], widths: list[int], n_classes: int) -> None:
        self.names_, self.widths_ = names, widths
        with torch.random.fork_rng(devices=[]):  # the head's seed fixes the initial weights
            torch.manual_seed(self.config.seed)
            self.net_ = MetaModel(widths, n_classes, self.config.width)

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        inputs = self._inputs(h, layers)
        if len(inputs) - cfg.include_hidden == 0:
            raise EtnError(
                "dmm needs pooled intermediate layers besides ODIN's logits, found none. Ask "
                "extract for them with layers = [...] in the pipeline's [backbone] table."
            )
        names = sorted(inputs)
        self._build(names, [inputs[k].shape[1] for k in names], z.shape[1])
        x = torch.cat([inputs[k] for k in names], 1)  # (N, sum D_l)
        self.net_.means.copy_(x.mean(0))
        self.net_.stds.copy_(x.std(0).clamp_min(1e-6))

        def loss(x_: torch.Tensor, y_: torch.Tensor) -> torch.Tensor:
            return belief_matching_loss(self.net_(x_), y_, cfg.kl_weight, cfg.prior)

        self.selection_ = fit_module(
            self.net_, loss, (x, y), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            seed=cfg.seed, device=device, weight_decay=cfg.weight_decay, desc="dmm",
            select=cfg.select, class_scores=lambda x_, y_: self.net_(x_),
        ).record()  # fmt: skip

    def _gather(self, h: torch.Tensor, layers: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = self._inputs(h, layers)
        missing = [k for k in self.names_ if k not in inputs]
        wrong = [
            f"{k} ({inputs[k].shape[1]} != {d})"
            for k, d in zip(self.names_, self.widths_, strict=True)
            if k in inputs and inputs[k].shape[1] != d
        ]
        if missing or wrong:
            raise EtnError(
                f"dmm was fitted on layers {self.names_}; these features lack {missing} or have "
                f"other widths {wrong}. Extract them with the same layers = [...]."
            )
        return torch.cat([inputs[k] for k in self.names_], 1)

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        net = copy.deepcopy(self.net_).double()  # float64: batch-independent to rounding
        alpha = net(self._gather(h, layers).double()).exp().cpu().numpy()  # (N, C)
        return Prediction(alpha / alpha.sum(1, keepdims=True), dirichlet_scores(alpha), alpha)

    def _state(self) -> dict[str, torch.Tensor]:
        names = json.dumps([self.names_, self.widths_]).encode()
        return dict(self.net_.state_dict()) | {"inputs": torch.tensor(list(names)).byte()}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        tensors = dict(tensors)
        names, widths = json.loads(bytes(tensors.pop("inputs").tolist()).decode())
        self._build(names, widths, self.n_classes_)
        self.net_.load_state_dict(tensors)
