"""Static scaling: one learned, sample-independent transformation of the logits plus ``b``,
trained with the reverse-KL EDL loss (Guo et al. 2017's temperature, as the paper's
"static scaling" baseline, Supp. "Baselines").

``alpha = softplus(a * z) + b`` with ``a > 0`` a scalar (one ``b``: argmax unchanged) or a
vector (per-class ``a`` and ``b``), or ``alpha = softplus(A z) + b`` with one C x C matrix ``A``
(softplus on its diagonal, off-diagonals free, per-class ``b``, ODIR on the off-diagonals as in
Kull et al. 2019's matrix scaling); loss ``KL(Dir(alpha) || Dir(1 + (nu - 1) e_y))``.

The scale is positive and optimised through its logarithm. Its optimum can lie far from 1 (on
the digits default about 1,200: the target's ``nu = 1e4`` asks for large evidence), which Adam's
steps of about ``lr`` in ``log a`` do not reach in the paper's 50 epochs, so with ``init =
"search"`` (the default) training starts from the scalar ``a`` that minimises the same loss
over the adaptation set at ``b = b_init``, found by a 1-D search over ``log a``
(:func:`search_scale`); ``init = "fixed"`` starts at ``a_init``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.edl import dirichlet_kl_to_target, evidence, inverse_softplus
from etn_cli.heads.matrix import apply_softplus_diagonal, odir_penalty
from etn_cli.heads.settings import StaticConfig
from etn_cli.heads.training import fit_module
from etn_cli.metrics.scores import dirichlet_scores

LOG_SCALE_GRID = np.arange(-6.0, 17.0)  # log a from 0.0025 to 2.4e7, one point per e
SEARCH_ROWS = 2048  # the start is searched on at most this many evenly spaced rows


@torch.no_grad()
def search_scale(z: torch.Tensor, y: torch.Tensor, b: float, nu: float) -> float:
    """The scalar ``a`` minimising the mean ``KL(Dir(softplus(a z) + b) || Dir(alpha^y))`` over
    the rows, in float64: a grid over ``log a`` (one point per e), then Brent's bounded search
    between the grid point's neighbours. Above :data:`SEARCH_ROWS` rows, over that many evenly
    spaced ones (training then moves ``a`` from there; at ImageNet shape a full evaluation of
    10,000 x 1,000 costs about a second)."""
    from scipy.optimize import minimize_scalar

    if len(z) > SEARCH_ROWS:
        rows = torch.linspace(0, len(z) - 1, SEARCH_ROWS).round().long()
        z, y = z[rows], y[rows]
    z, b_ = z.double(), torch.tensor(b, dtype=torch.float64)

    def objective(log_a: float) -> float:
        alpha = evidence(math.exp(log_a) * z, b_)
        return float(dirichlet_kl_to_target(alpha, y, nu).mean())

    losses = [objective(float(s)) for s in LOG_SCALE_GRID]
    best = int(np.nanargmin(losses))
    low = LOG_SCALE_GRID[max(best - 1, 0)]
    high = LOG_SCALE_GRID[min(best + 1, len(LOG_SCALE_GRID) - 1)]
    found = minimize_scalar(objective, bounds=(low, high), method="bounded",
                            options={"xatol": 1e-4})  # fmt: skip
    return math.exp(found.x if found.fun <= losses[best] else LOG_SCALE_GRID[best])


class StaticScale(nn.Module):
    def __init__(self, n_scale: int, cfg: StaticConfig, a_start: float):
        super().__init__()
        self.log_a = nn.Parameter(torch.full((n_scale,), math.log(a_start)))
        self.b_raw = nn.Parameter(torch.full((n_scale,), inverse_softplus(cfg.b_init)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return evidence(self.log_a.exp() * z, F.softplus(self.b_raw))  # (B, C)


class StaticMatrix(nn.Module):
    """One C x C matrix, starting at ``a_init * I``; softplus keeps its diagonal positive."""

    def __init__(self, n_classes: int, cfg: StaticConfig, a_start: float):
        super().__init__()
        start = torch.eye(n_classes) * inverse_softplus(a_start)
        self.a_raw = nn.Parameter(start)  # (C, C)
        self.b_raw = nn.Parameter(torch.full((n_classes,), inverse_softplus(cfg.b_init)))

    def matrix(self) -> torch.Tensor:
        return apply_softplus_diagonal(self.a_raw)  # (C, C)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return evidence(z @ self.matrix().T, F.softplus(self.b_raw))  # (B, C)


@heads.register("static")
class Static(Head):
    def _build(self, n_classes: int, a_start: float | None = None) -> None:
        a_start = self.config.a_init if a_start is None else a_start
        if self.config.variant == "matrix":
            self.module_ = StaticMatrix(n_classes, self.config, a_start)
        else:
            n_scale = 1 if self.config.variant == "scalar" else n_classes
            self.module_ = StaticScale(n_scale, self.config, a_start)

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        self.a_start_ = cfg.a_init
        if cfg.init == "search":
            self.a_start_ = search_scale(z, y, cfg.b_init, cfg.nu)
        self._build(z.shape[1], self.a_start_)

        def loss(z_: torch.Tensor, y_: torch.Tensor) -> torch.Tensor:
            kl = dirichlet_kl_to_target(self.module_(z_), y_, cfg.nu)  # (B,)
            if cfg.variant == "matrix":
                return kl + cfg.odir_weight * odir_penalty(self.module_.a_raw)
            return kl

        self.selection_ = fit_module(
            self.module_, loss, (z, y), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            seed=cfg.seed, device=device, desc="static", select=cfg.select,
            class_scores=lambda z_, y_: self.module_(z_),
        ).record()  # fmt: skip
        self.selection_["a_start"] = self.a_start_

    @property
    def keeps_argmax(self) -> bool:
        return self.config.variant == "scalar"  # one positive scale for every logit

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        if self.config.variant == "matrix":
            a = apply_softplus_diagonal(self.module_.a_raw.double())  # (C, C)
            b = F.softplus(self.module_.b_raw.double())
            alpha = evidence(z.double() @ a.T, b).cpu().numpy()
        else:
            scale, b = self.module_.log_a.double().exp(), F.softplus(self.module_.b_raw.double())
            alpha = evidence(scale * z.double(), b).cpu().numpy()  # float64: no early underflow
        return Prediction(alpha / alpha.sum(1, keepdims=True), dirichlet_scores(alpha), alpha)

    def _state(self) -> dict[str, torch.Tensor]:
        return dict(self.module_.state_dict())

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._build(self.n_classes_)
        self.module_.load_state_dict(tensors)
