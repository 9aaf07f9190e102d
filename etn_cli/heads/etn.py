"""The Evidential Transformation Network (ETN), the paper's method (Sec. 4, Alg. 1).

A tiny network reads the backbone's last hidden state ``h`` and predicts a Gamma variational
distribution over the transformation ``a`` of the logits ``z``; each draw gives a Dirichlet
``alpha = softplus(a * z) + b``. Training minimises the ELBO-based loss (paper Eq. 8)::

    L = -(1/M) sum_m [ lgamma(alpha_m0) - sum_i lgamma(alpha_mi)
                       + sum_i (alpha_mi - 1) E_{Dir(alpha^y)}[log pi_i] ]
        + lambda * KL(Gamma(k(h), r(h)) || Gamma(s, t))

with ``alpha^y = 1 + (nu - 1) e_y`` and the prior's shape/rate set from its mode and variance.
The prediction is the MC marginal ``p' = (1/M) sum_m alpha_m / alpha_m0``. With the scalar
variant and one ``b`` shared by all classes the argmax, hence accuracy, never changes.

Variants (paper Supp. "Modeling Transformation Parameterizations"): ``scalar`` (one Gamma, one
``b``), ``vector`` (a Gamma per class, a ``b`` per class) and ``matrix``: a per-sample Gaussian
``vec(A) ~ N(mu, B (x) D)`` with ``B = L_B L_B^T``, ``D = L_D L_D^T``, softplus on the diagonal of
each sampled A, ``alpha = softplus(A z) + b`` with a ``b`` per class, the closed-form KL to a
Gaussian prior with the Gamma prior's mode and variance, and ODIR on ``mu``
(:mod:`etn_cli.heads.matrix`).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from scipy.special import gammaincinv
from torch import nn
from torch.nn import functional as F

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.edl import (
    evidence,
    expected_dirichlet_log_density,
    gamma_kl,
    gamma_prior,
    inverse_softplus,
)
from etn_cli.heads.gamma_sampling import LevelGamma, level_quantiles
from etn_cli.heads.matrix import (
    apply_softplus_diagonal,
    check_matrix_feasible,
    gaussian_prior_from_mode_variance,
    lower_triangular_factor,
    matrix_normal_kl,
    odir_penalty,
    sample_matrix_normal,
    transform_logits,
)
from etn_cli.heads.scalar_density import scalar_log_density, use_fused
from etn_cli.heads.settings import ETNConfig
from etn_cli.heads.training import fit_module
from etn_cli.heads.vector_density import vector_gamma_log_density
from etn_cli.metrics.scores import dirichlet_scores

EPS = 1e-4


class GammaNet(nn.Module):
    """Two independent MLP modules predicting the Gamma shape ``k(h)`` and rate ``r(h)``."""

    def __init__(self, n_features: int, out_dim: int, cfg: ETNConfig):
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.shape_net = mlp(n_features, cfg.width, cfg.depth, out_dim)
        self.rate_net = mlp(n_features, cfg.width, cfg.depth, out_dim)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = (h - self.mean) / self.std
        return F.softplus(self.shape_net(x)) + EPS, F.softplus(self.rate_net(x)) + EPS


class MatrixNet(nn.Module):
    """Two MLP modules for the matrix variant: one predicts ``mu`` (C, C), the other the raw
    Cholesky factors of ``B`` and ``D`` (2, C, C), made lower triangular with a positive
    diagonal by :func:`lower_triangular_factor`."""

    def __init__(self, n_features: int, n_classes: int, cfg: ETNConfig):
        super().__init__()
        self.n_classes = n_classes
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.mean_net = mlp(n_features, cfg.width, cfg.depth, n_classes**2)
        self.factor_net = mlp(n_features, cfg.width, cfg.depth, 2 * n_classes**2)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.n_classes
        x = (h - self.mean) / self.std
        mu = self.mean_net(x).view(-1, c, c)  # (B, C, C)
        raw = self.factor_net(x).view(-1, 2, c, c)  # (B, 2, C, C)
        return mu, lower_triangular_factor(raw[:, 0]), lower_triangular_factor(raw[:, 1])


def memory_limit_bytes(cfg: ETNConfig, device: torch.device) -> int:
    """The matrix variant's memory budget: the setting, else the device's free memory."""
    if cfg.memory_limit_gib is not None:
        return int(cfg.memory_limit_gib * 2**30)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def mlp(n_in: int, width: int, depth: int, n_out: int) -> nn.Sequential:
    """``depth`` linear layers with ReLU between, PyTorch's default initialisation (the paper
    specifies none; starting every sample at the prior was tried and generalised worse to
    OOD inputs on the digits default)."""
    sizes = [n_in] + [width] * (depth - 1) + [n_out]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < depth - 1 else [])
    return nn.Sequential(*layers)


@heads.register("etn")
class ETN(Head):
    fused_ = False  # fit with the compiled objective (etn_cli.heads.scalar_density, vector_density)

    @property
    def is_matrix(self) -> bool:
        return self.config.variant == "matrix"

    @property
    def keeps_argmax(self) -> bool:
        """The scalar variant scales every logit by the same positive draw (DESIGN §2)."""
        return self.config.variant == "scalar"

    def _build(self, n_features: int, n_classes: int) -> None:
        cfg = self.config
        n_b = 1 if cfg.variant == "scalar" else n_classes
        if self.is_matrix:
            self.prior_ = gaussian_prior_from_mode_variance(cfg.prior_mode, cfg.prior_variance)
        else:
            self.prior_ = gamma_prior(cfg.prior_mode, cfg.prior_variance)
        with torch.random.fork_rng(devices=[]):  # the head's seed fixes the initial weights
            torch.manual_seed(cfg.seed)
            if self.is_matrix:
                self.net_ = MatrixNet(n_features, n_classes, cfg)
            else:
                self.net_ = GammaNet(n_features, 1 if cfg.variant == "scalar" else n_classes, cfg)
        self.b_raw_ = nn.Parameter(torch.full((n_b,), inverse_softplus(cfg.b_init)))

    @property
    def b_(self) -> torch.Tensor:
        """The learnable prior-belief term, kept positive with a softplus."""
        return F.softplus(self.b_raw_) + EPS

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        if self.is_matrix:
            limit = memory_limit_bytes(cfg, device)
            batch = min(cfg.batch_size, len(z))
            check_matrix_feasible(z.shape[1], batch, cfg.mc_samples, limit, width=cfg.width)
        self._build(h.shape[1], z.shape[1])
        work = cfg.mc_samples * z.numel() * cfg.epochs
        self.fused_ = cfg.variant in ("scalar", "vector") and use_fused(device, work)
        if cfg.standardize:
            self.net_.mean.copy_(h.mean(0))
            self.net_.std.copy_(h.std(0).clamp_min(1e-6))
        module = nn.ModuleDict({"net": self.net_})
        module.register_parameter("b_raw", self.b_raw_)
        training = fit_module(
            module, self.loss, (h, z, y), epochs=cfg.epochs, batch_size=cfg.batch_size,
            lr=cfg.lr, seed=cfg.seed, device=device, schedule=cfg.schedule,
            warmup_fraction=cfg.warmup_fraction, desc="etn", select=cfg.select,
            class_scores=self.class_scores,
        )  # fmt: skip
        self.history_ = training.losses  # the mean adaptation loss per epoch
        self.selection_ = training.record()

    def loss(self, h: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample ETN loss (B,): MC expected negative log density + lambda * KL
        (+ the ODIR penalty on ``mu`` for the matrix variant)."""
        cfg = self.config
        if self.is_matrix:
            mu, l_b, l_d = self.net_(h)  # (B, C, C) each
            a = apply_softplus_diagonal(sample_matrix_normal(mu, l_b, l_d, cfg.mc_samples))
            alpha = evidence(transform_logits(a, z), self.b_)  # (M, B, C)
            kl = matrix_normal_kl(mu, l_b, l_d, *self.prior_)  # (B,)
            penalty = cfg.odir_weight * odir_penalty(mu)  # (B,)
        else:
            shape, rate = self.net_(h)  # (B, K)
            if cfg.variant == "vector":  # drawn inside the loss: compiled with it when fused
                density = vector_gamma_log_density(
                    shape, rate, z, self.b_, y, cfg.nu, cfg.mc_samples, fused=self.fused_
                )  # (B,)
                return -density + cfg.kl_weight * gamma_kl(shape, rate, *self.prior_).sum(-1)
            # the net's softplus keeps shape and rate positive: skip the per-step argument checks
            gamma = torch.distributions.Gamma(shape, rate, validate_args=False)
            a = gamma.rsample((cfg.mc_samples,))  # (M, B, K)
            kl = gamma_kl(shape, rate, *self.prior_).sum(-1)  # (B,)
            density = scalar_log_density(a, z, self.b_, y, cfg.nu, fused=self.fused_)
            nll = -density.mean(0)  # (B,)
            return nll + cfg.kl_weight * kl
        nll = -expected_dirichlet_log_density(alpha, y, cfg.nu).mean(0)  # (B,)
        return nll + cfg.kl_weight * kl + penalty

    def class_scores(self, h: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Scores whose argmax is the predicted class (B, C), for ``select = "accuracy"``: the
        logits for the scalar variant (its argmax never changes), else the Dirichlet of the
        mean transformation (Gamma means ``k / r``; the matrix mean ``mu``)."""
        if self.config.variant == "scalar":
            return z
        if self.is_matrix:
            mu = apply_softplus_diagonal(self.net_(h)[0])  # (B, C, C)
            return evidence(transform_logits(mu.unsqueeze(0), z)[0], self.b_)
        shape, rate = self.net_(h)  # (B, C)
        return evidence(shape / rate * z, self.b_)

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        if self.config.variant == "vector":  # one draw at a time: large blocks, few operations
            per_row = z.shape[1]
        else:
            per_row = self.config.mc_samples * z.shape[1] * (z.shape[1] if self.is_matrix else 1)
        rows = max(1, 2**22 // per_row)
        parts = [
            self._predict_chunk(h[i : i + rows], z[i : i + rows]) for i in range(0, len(h), rows)
        ]
        probs = np.concatenate([p for p, _ in parts])  # (N, C)
        alpha = np.concatenate([a for _, a in parts])  # (N, C)
        scores = dirichlet_scores(alpha)
        scores["mp"] = probs.max(axis=1)
        return Prediction(probs=probs, scores=scores, alpha=alpha)

    def _predict_chunk(self, h: torch.Tensor, z: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        if self.is_matrix:
            mu, l_b, l_d = (t.double() for t in self.net_(h))  # (n, C, C) each
            noise = self.fixed_noise().to(mu.device)
            a = apply_softplus_diagonal(mu + l_d @ noise[:, None] @ l_b.mT)
            alpha = evidence(transform_logits(a, z.double()), self.b_.double())  # (M, n, C)
        elif self.config.variant == "vector":
            return self._predict_vector_chunk(h, z)
        else:
            shape, rate = self.net_(h)  # (n, K)
            a = self.quantile_draws(shape.double().cpu().numpy(), rate.double().cpu().numpy())
            a = torch.from_numpy(a).to(z.device)  # scipy's quantiles, computed on the host
            alpha = evidence(a * z.double(), self.b_.double())  # (M, n, C)
        probs = (alpha / alpha.sum(-1, keepdim=True)).mean(0)
        return probs.cpu().numpy(), alpha.mean(0).cpu().numpy()

    def _predict_vector_chunk(self, h: torch.Tensor, z: torch.Tensor) -> tuple[np.ndarray, ...]:
        """The vector variant's draws of :meth:`quantile_draws`, from a table of the Gamma
        quantile function at the M levels (1e-8 relative, :class:`LevelGamma`), one draw at a
        time: ``(1/M) sum_m alpha_m / alpha_m0`` and ``(1/M) sum_m alpha_m`` (n, C) accumulate
        without an (M, n, C) array."""
        shape, rate = self.net_(h)  # (n, C)
        quantiles = LevelGamma(shape, self.config.mc_samples)
        scale = z.double() / rate.double()
        b = self.b_.double()
        probs = torch.zeros_like(scale)
        total = torch.zeros_like(scale)
        for level in torch.from_numpy(self.level_order()).to(scale.device):  # (C,) per draw
            alpha = evidence(quantiles(level).mul_(scale), b)  # (n, C)
            total += alpha
            probs.addcmul_(alpha, 1 / alpha.sum(-1, keepdim=True))
        m = self.config.mc_samples
        return (probs / m).cpu().numpy(), (total / m).cpu().numpy()

    def quantile_draws(self, shape: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """M draws of ``a`` per row at the stratified quantiles ``(m - 1/2) / M`` (M, n, K).

        Inference uses these deterministic, row-wise draws instead of pseudo-random ones: the
        MC marginal has lower variance, and a sample's prediction does not depend on which
        other samples share its batch. Vector variants pair the per-class quantiles through
        fixed random permutations (Latin hypercube), keeping the classes independent.
        """
        u = level_quantiles(self.config.mc_samples)[self.level_order(shape.shape[1])]  # (M, K)
        return gammaincinv(shape[None], u[:, None, :]) / rate[None]  # (M, n, K)

    def level_order(self, n_gammas: int | None = None) -> np.ndarray:
        """Which of the M levels each draw of each Gamma takes (M, K): the draw's index for the
        scalar variant, fixed random permutations per class for the vector variant."""
        m, k = self.config.mc_samples, n_gammas or self.n_classes_
        if k == 1:
            return np.arange(m)[:, None]
        rng = np.random.default_rng(self.config.seed)
        return rng.permuted(np.tile(np.arange(m), (k, 1)), axis=1).T

    def fixed_noise(self) -> torch.Tensor:
        """The matrix variant's M standard-normal draws ``E`` (M, C, C), fixed by the seed and
        shared by every row, so a prediction does not depend on its batch (common random
        numbers; ``A = mu + L_D E L_B^T`` per row)."""
        c = self.n_classes_
        generator = torch.Generator().manual_seed(self.config.seed)
        shape = (self.config.mc_samples, c, c)
        return torch.randn(shape, generator=generator, dtype=torch.float64)

    def _state(self) -> dict[str, torch.Tensor]:
        state = {f"net.{k}": v for k, v in self.net_.state_dict().items()}
        return state | {"b_raw": self.b_raw_.detach()}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._build(self.n_features_, self.n_classes_)
        net = {k.removeprefix("net."): v for k, v in tensors.items() if k.startswith("net.")}
        self.net_.load_state_dict(net)
        if tensors["b_raw"].shape != self.b_raw_.shape:
            raise RuntimeError(f"b_raw has shape {tuple(tensors['b_raw'].shape)}")
        self.b_raw_ = nn.Parameter(tensors["b_raw"])
