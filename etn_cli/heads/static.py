"""Static scaling: one learned, sample-independent transformation of the logits plus ``b``,
trained with the reverse-KL EDL loss (Guo et al. 2017's temperature, as the paper's
"static scaling" baseline, Supp. "Baselines").

``alpha = softplus(a * z) + b`` with ``a > 0`` a scalar (one ``b``: argmax unchanged) or a
vector (per-class ``a`` and ``b``), or ``alpha = softplus(A z) + b`` with one C x C matrix ``A``
(softplus on its diagonal, off-diagonals free, per-class ``b``, ODIR on the off-diagonals as in
Kull et al. 2019's matrix scaling); loss ``KL(Dir(alpha) || Dir(1 + (nu - 1) e_y))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from etn_cli.heads.base import Head, HeadConfig, Prediction, heads
from etn_cli.heads.edl import dirichlet_kl_to_target, evidence, inverse_softplus
from etn_cli.heads.matrix import apply_softplus_diagonal, odir_penalty
from etn_cli.heads.training import fit_module
from etn_cli.metrics.scores import dirichlet_scores


@dataclass(frozen=True)
class StaticConfig(HeadConfig):
    variant: Literal["scalar", "vector", "matrix"] = "scalar"
    nu: float = 1e4
    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-2
    a_init: float = 1.0
    b_init: float = 1.0
    odir_weight: float = 1.0  # matrix variant only


class StaticScale(nn.Module):
    def __init__(self, n_scale: int, cfg: StaticConfig):
        super().__init__()
        self.log_a = nn.Parameter(torch.full((n_scale,), float(torch.tensor(cfg.a_init).log())))
        self.b_raw = nn.Parameter(torch.full((n_scale,), inverse_softplus(cfg.b_init)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return evidence(self.log_a.exp() * z, F.softplus(self.b_raw))  # (B, C)


class StaticMatrix(nn.Module):
    """One C x C matrix, starting at ``a_init * I``; softplus keeps its diagonal positive."""

    def __init__(self, n_classes: int, cfg: StaticConfig):
        super().__init__()
        start = torch.eye(n_classes) * inverse_softplus(cfg.a_init)
        self.a_raw = nn.Parameter(start)  # (C, C)
        self.b_raw = nn.Parameter(torch.full((n_classes,), inverse_softplus(cfg.b_init)))

    def matrix(self) -> torch.Tensor:
        return apply_softplus_diagonal(self.a_raw)  # (C, C)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return evidence(z @ self.matrix().T, F.softplus(self.b_raw))  # (B, C)


@heads.register("static")
class Static(Head):
    name = "static"
    label = "Static scaling"
    family = "evidential"
    Config = StaticConfig

    def _build(self, n_classes: int) -> None:
        if self.config.variant == "matrix":
            self.module_ = StaticMatrix(n_classes, self.config)
        else:
            self.module_ = StaticScale(
                1 if self.config.variant == "scalar" else n_classes, self.config
            )

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:  # noqa: ANN001
        cfg = self.config
        self._build(z.shape[1])

        def loss(z_: torch.Tensor, y_: torch.Tensor) -> torch.Tensor:
            kl = dirichlet_kl_to_target(self.module_(z_), y_, cfg.nu)  # (B,)
            if cfg.variant == "matrix":
                return kl + cfg.odir_weight * odir_penalty(self.module_.a_raw)
            return kl

        fit_module(
            self.module_, loss, (z, y), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            seed=cfg.seed, device=device, desc="static",
        )  # fmt: skip
        self.module_.cpu()

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:  # noqa: ANN001
        if self.config.variant == "matrix":
            a = apply_softplus_diagonal(self.module_.a_raw.double())  # (C, C)
            b = F.softplus(self.module_.b_raw.double())
            alpha = evidence(z.double() @ a.T, b).numpy()
        else:
            scale, b = self.module_.log_a.double().exp(), F.softplus(self.module_.b_raw.double())
            alpha = evidence(scale * z.double(), b).numpy()  # float64: no early underflow
        return Prediction(alpha / alpha.sum(1, keepdims=True), dirichlet_scores(alpha), alpha)

    def _state(self) -> dict[str, torch.Tensor]:
        return dict(self.module_.state_dict())

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._build(self.n_classes_)
        self.module_.load_state_dict(tensors)
