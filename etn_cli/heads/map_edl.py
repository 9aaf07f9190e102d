"""MAP_EDL: the backbone's last layer fine-tuned with the reverse-KL EDL loss (Sensoy et al.
2018's evidential head; the paper's MAP_EDL baseline, Supp. "Baselines").

The layer starts from the backbone's own classifier ``(W, c)``, so at step 0 its logits are the
backbone's, and becomes a Dirichlet head::

    alpha = softplus(W h + c) + b,        b > 0 learnable, one value for all classes

trained on the adaptation set with ``KL(Dir(alpha) || Dir(1 + (nu - 1) e_y))`` (the paper's
reverse-KL form of L_EDL; ``b`` is trainable "for fair comparison to ETN"). Prediction:
``p = alpha / alpha_0`` with UM, MI and DE in closed form.

Differs from the paper: only the last layer is fine-tuned (the paper fine-tunes the whole
backbone, which a feature cache cannot), and the kept epoch is the one with the lowest
adaptation loss (the paper keeps the most accurate one for baselines).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.edl import dirichlet_kl_to_target, evidence, inverse_softplus
from etn_cli.heads.lastlayer import linear_from_classifier
from etn_cli.heads.training import fit_module
from etn_cli.metrics.scores import dirichlet_scores

EPS = 1e-4  # keeps alpha > 0 when softplus underflows in float32


class EvidentialLinear(nn.Module):
    """``alpha = softplus(W h + c) + b`` with ``b = softplus(b_raw) + EPS`` (B, C)."""

    def __init__(self, n_features: int, n_classes: int, b_init: float):
        super().__init__()
        self.linear = nn.Linear(n_features, n_classes)
        self.b_raw = nn.Parameter(torch.tensor([inverse_softplus(b_init)]))

    @property
    def b(self) -> torch.Tensor:
        return F.softplus(self.b_raw) + EPS

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return evidence(self.linear(h), self.b)  # (B, C)


@heads.register("map_edl")
class MapEDL(Head):
    def _build(self, n_features: int, n_classes: int) -> None:
        self.module_ = EvidentialLinear(n_features, n_classes, self.config.b_init)

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        self._build(h.shape[1], z.shape[1])
        self.module_.linear = linear_from_classifier(classifier, h.shape[1], z.shape[1])

        def loss(h_: torch.Tensor, y_: torch.Tensor) -> torch.Tensor:
            return dirichlet_kl_to_target(self.module_(h_), y_, cfg.nu)

        self.selection_ = fit_module(
            self.module_, loss, (h, y), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            seed=cfg.seed, device=device, weight_decay=cfg.weight_decay, desc="map_edl",
            select=cfg.select, class_scores=lambda h_, y_: self.module_(h_),
        ).record()  # fmt: skip

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        lin = self.module_.linear
        logits = F.linear(h.double(), lin.weight.double(), lin.bias.double())  # (N, C)
        alpha = evidence(logits, self.module_.b.double()).cpu().numpy()  # float64: no underflow
        return Prediction(alpha / alpha.sum(1, keepdims=True), dirichlet_scores(alpha), alpha)

    def _state(self) -> dict[str, torch.Tensor]:
        return dict(self.module_.state_dict())

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._build(self.n_features_, self.n_classes_)
        self.module_.load_state_dict(tensors)
