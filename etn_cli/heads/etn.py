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


class Structure:
    """How ETN transforms the logits: the network, prior, draws, loss (``loss(head, h, z, y)``)
    and prediction of one variant, one subclass per variant (laplace-torch's one class per
    Hessian structure), chosen once from ``variant`` (:data:`STRUCTURES`); the methods read the
    head's fitted state (``net_``, ``b_``, ``prior_``). The base holds what the scalar and vector
    variants share: ``a ~ Gamma(k(h), r(h))``."""

    keeps_argmax = False  # the transformation leaves the predicted class unchanged
    fusable = True  # fitted with a compiled objective where it pays (DESIGN §2)

    def __init__(self, cfg: ETNConfig):
        self.cfg = cfg

    def n_gammas(self, n_classes: int) -> int:  # and ``b`` terms
        return n_classes

    def prior(self) -> tuple[float, float]:
        return gamma_prior(self.cfg.prior_mode, self.cfg.prior_variance)

    def net(self, n_features: int, n_classes: int) -> nn.Module:
        return GammaNet(n_features, self.n_gammas(n_classes), self.cfg)

    def check(self, z: torch.Tensor, device: torch.device) -> None:
        """Refuse a fit that cannot run (only the matrix variant can outgrow memory)."""

    def draws(self, params: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """M draws of the transformation from the net's output (M, B, K); its softplus keeps
        shape and rate positive: no per-step argument checks."""
        gamma = torch.distributions.Gamma(*params, validate_args=False)
        return gamma.rsample((self.cfg.mc_samples,))

    def transform(self, a: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return a * z

    def kl(self, params: tuple[torch.Tensor, ...], prior: tuple[float, float]) -> torch.Tensor:
        return gamma_kl(*params, *prior).sum(-1)  # (B,)

    def class_scores(self, head: ETN, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The Dirichlet of the mean transformation (Gamma means ``k / r``)."""
        shape, rate = head.net_(h)  # (B, C)
        return evidence(shape / rate * z, head.b_)

    def per_row(self, n_classes: int) -> int:  # numbers a row of a prediction holds at once
        return self.cfg.mc_samples * n_classes

    def predict_chunk(self, head: ETN, h: torch.Tensor, z: torch.Tensor) -> tuple[np.ndarray, ...]:
        """The MC marginal ``(1/M) sum_m alpha_m / alpha_m0`` and the mean ``alpha`` (n, C)."""
        alpha = evidence(self.transform(self.fixed_draws(head, h), z.double()), head.b_.double())
        probs = (alpha / alpha.sum(-1, keepdim=True)).mean(0)  # alpha: (M, n, C)
        return probs.cpu().numpy(), alpha.mean(0).cpu().numpy()

    def fixed_draws(self, head: ETN, h: torch.Tensor) -> torch.Tensor:
        """M deterministic draws per row (float64), so a prediction does not depend on its
        batch: the stratified Gamma quantiles of :meth:`ETN.quantile_draws`."""
        shape, rate = head.net_(h)  # (n, K)
        a = head.quantile_draws(shape.double().cpu().numpy(), rate.double().cpu().numpy())
        return torch.from_numpy(a).to(h.device)  # scipy's quantiles, computed on the host


class Scalar(Structure):
    """One Gamma and one ``b`` for all classes: every logit scaled by the same positive draw."""

    keeps_argmax = True

    def n_gammas(self, n_classes: int) -> int:
        return 1

    def loss(self, head, h, z, y):
        cfg, params = self.cfg, head.net_(h)  # (B, 1) each
        a, kl = self.draws(params), self.kl(params, head.prior_)  # (M, B, 1), (B,)
        density = scalar_log_density(a, z, head.b_, y, cfg.nu, fused=head.fused_)
        return -density.mean(0) + cfg.kl_weight * kl

    def class_scores(self, head, h, z):
        return z  # its argmax never changes


class Vector(Structure):
    """A Gamma and a ``b`` per class; the draws are taken inside the loss (compiled with it
    when fused), and a prediction takes one draw at a time: large blocks, few operations."""

    def loss(self, head, h, z, y):
        cfg, params = self.cfg, head.net_(h)  # (B, C) each
        density = vector_gamma_log_density(
            *params, z, head.b_, y, cfg.nu, cfg.mc_samples, fused=head.fused_
        )  # (B,)
        return -density + cfg.kl_weight * self.kl(params, head.prior_)

    def per_row(self, n_classes):
        return n_classes

    def predict_chunk(self, head, h, z):
        """The draws of :meth:`ETN.quantile_draws`, from a table of the Gamma quantile function
        at the M levels (1e-8 relative, :class:`LevelGamma`), one draw at a time: the marginal
        and the mean ``alpha`` (n, C) accumulate without an (M, n, C) array."""
        shape, rate = head.net_(h)  # (n, C)
        quantiles = LevelGamma(shape, self.cfg.mc_samples)
        scale = z.double() / rate.double()
        b = head.b_.double()
        probs = torch.zeros_like(scale)
        total = torch.zeros_like(scale)
        for level in torch.from_numpy(head.level_order()).to(scale.device):  # (C,) per draw
            alpha = evidence(quantiles(level).mul_(scale), b)  # (n, C)
            total += alpha
            probs.addcmul_(alpha, 1 / alpha.sum(-1, keepdim=True))
        m = self.cfg.mc_samples
        return (probs / m).cpu().numpy(), (total / m).cpu().numpy()


class Matrix(Structure):
    """A per-sample Gaussian ``vec(A) ~ N(mu, B (x) D)``, softplus on the diagonal of each
    draw, a ``b`` per class, the closed-form KL to a Gaussian prior and ODIR on ``mu``."""

    fusable = False

    def prior(self):
        return gaussian_prior_from_mode_variance(self.cfg.prior_mode, self.cfg.prior_variance)

    def net(self, n_features, n_classes):
        return MatrixNet(n_features, n_classes, self.cfg)

    def check(self, z, device):
        cfg = self.cfg
        batch = min(cfg.batch_size, len(z))
        limit = memory_limit_bytes(cfg, device)
        check_matrix_feasible(z.shape[1], batch, cfg.mc_samples, limit, width=cfg.width)

    def draws(self, params):
        return apply_softplus_diagonal(sample_matrix_normal(*params, self.cfg.mc_samples))

    def transform(self, a, z):
        return transform_logits(a, z)

    def kl(self, params, prior):
        return matrix_normal_kl(*params, *prior)  # (B,)

    def loss(self, head, h, z, y):
        """MC NLL + lambda * KL + the ODIR penalty on ``mu``."""
        cfg, params = self.cfg, head.net_(h)  # (B, C, C) each
        alpha = evidence(self.transform(self.draws(params), z), head.b_)  # (M, B, C)
        kl, penalty = self.kl(params, head.prior_), odir_penalty(params[0])  # (B,) each
        nll = -expected_dirichlet_log_density(alpha, y, cfg.nu).mean(0)  # (B,)
        return nll + cfg.kl_weight * kl + cfg.odir_weight * penalty

    def class_scores(self, head, h, z):
        mu = apply_softplus_diagonal(head.net_(h)[0])  # the mean transformation (B, C, C)
        return evidence(transform_logits(mu.unsqueeze(0), z)[0], head.b_)

    def per_row(self, n_classes):
        return self.cfg.mc_samples * n_classes * n_classes

    def fixed_draws(self, head, h):
        """``A = mu + L_D E L_B^T`` per row with the M standard-normal draws ``E`` (M, C, C)
        fixed by the seed and shared by every row (common random numbers)."""
        mu, l_b, l_d = (t.double() for t in head.net_(h))  # (n, C, C) each
        c, m = head.n_classes_, self.cfg.mc_samples
        noise = torch.randn((m, c, c), generator=torch.Generator().manual_seed(self.cfg.seed),
                            dtype=torch.float64).to(mu.device)  # fmt: skip
        return apply_softplus_diagonal(mu + l_d @ noise[:, None] @ l_b.mT)


STRUCTURES: dict[str, type[Structure]] = {"scalar": Scalar, "vector": Vector, "matrix": Matrix}


@heads.register("etn")
class ETN(Head):
    fused_ = False  # fit with the compiled objective (etn_cli.heads.scalar_density, vector_density)

    def __init__(self, **settings) -> None:
        super().__init__(**settings)
        self.structure = STRUCTURES[self.config.variant](self.config)

    @property
    def keeps_argmax(self) -> bool:
        return self.structure.keeps_argmax

    def _build(self, n_features: int, n_classes: int) -> None:
        cfg, structure = self.config, self.structure
        self.prior_ = structure.prior()
        with torch.random.fork_rng(devices=[]):  # the head's seed fixes the initial weights
            torch.manual_seed(cfg.seed)
            self.net_ = structure.net(n_features, n_classes)
        n_b = structure.n_gammas(n_classes)
        self.b_raw_ = nn.Parameter(torch.full((n_b,), inverse_softplus(cfg.b_init)))

    @property
    def b_(self) -> torch.Tensor:
        """The learnable prior-belief term, kept positive with a softplus."""
        return F.softplus(self.b_raw_) + EPS

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        self.structure.check(z, device)
        self._build(h.shape[1], z.shape[1])
        work = cfg.mc_samples * z.numel() * cfg.epochs
        self.fused_ = self.structure.fusable and use_fused(device, work)
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
        return self.structure.loss(self, h, z, y)

    def class_scores(self, h: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Scores whose argmax is the predicted class (B, C), for ``select = "accuracy"``."""
        return self.structure.class_scores(self, h, z)

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        rows = max(1, 2**22 // self.structure.per_row(z.shape[1]))
        parts = [
            self._predict_chunk(h[i : i + rows], z[i : i + rows]) for i in range(0, len(h), rows)
        ]
        probs = np.concatenate([p for p, _ in parts])  # (N, C)
        alpha = np.concatenate([a for _, a in parts])  # (N, C)
        scores = dirichlet_scores(alpha)
        scores["mp"] = probs.max(axis=1)
        return Prediction(probs=probs, scores=scores, alpha=alpha)

    def _predict_chunk(self, h: torch.Tensor, z: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        return self.structure.predict_chunk(self, h, z)

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
