"""SNGP's Gaussian-process output layer (Liu et al., NeurIPS 2020) on cached features.

Random Fourier features approximate an RBF-kernel GP on the centred last hidden state::

    phi(h) = sqrt(2 / M) cos(W (h - mu) / l + b),   W ~ N(0, 1)^(M x D),  b ~ U(0, 2 pi)^M

with the length scale ``l`` set to ``length_scale`` times the median pairwise distance of the
adaptation features. The output layer ``g(h) = beta phi(h)`` is the MAP estimate under the GP
prior ``beta_k ~ N(0, I / ridge)`` (cross-entropy plus ``ridge ||beta||^2 / 2N``). After training,
one pass over the adaptation set accumulates the Laplace posterior precision (paper Eq. 9)::

    Sigma_k^-1 = ridge I + sum_i p_ik (1 - p_ik) phi_i phi_i^T     (covariance = "per_class")
    Sigma^-1   = ridge I + sum_i phi_i phi_i^T                     (covariance = "shared", the
                                                                    reference code's Gaussian
                                                                    likelihood, for many classes)

and the prediction is the mean-field approximation of the posterior-mean softmax,
``p = softmax(g_k / sqrt(1 + lambda var_k))`` with ``var_k = phi^T Sigma_k phi``, lambda = pi/8.

"SNGP (head)": the backbone is frozen, so spectral normalisation of its hidden layers (the
"SN" part, which keeps the feature map distance preserving) is not possible here.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.settings import SNGPConfig
from etn_cli.heads.training import fit_module
from etn_cli.metrics.scores import probability_scores

MAX_COVARIANCE_BYTES = 2**31  # per-class covariances beyond 2 GiB must use "shared"


def median_distance(x: torch.Tensor, seed: int, max_rows: int = 1000) -> float:
    """Median Euclidean distance between distinct rows of (a seeded subsample of) ``x``."""
    generator = torch.Generator().manual_seed(seed)
    rows = x[torch.randperm(len(x), generator=generator)[:max_rows]].double()
    dist = torch.cdist(rows, rows)  # (n, n)
    upper = dist[torch.triu_indices(len(rows), len(rows), offset=1).unbind()]
    return float(upper.median()) if len(upper) else 1.0


class RandomFeatureGP(nn.Module):
    """Fixed random Fourier features and the trainable output layer ``beta`` (C, M)."""

    def __init__(self, n_features: int, n_classes: int, cfg: SNGPConfig) -> None:
        super().__init__()
        m = cfg.random_features
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("inv_length", torch.ones(()))
        self.register_buffer("W", torch.randn(m, n_features))
        self.register_buffer("b", torch.rand(m) * 2 * math.pi)
        self.beta = nn.Linear(m, n_classes, bias=False)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        """``phi(h)`` (B, M) in the dtype of ``h``."""
        x = (h - self.mean.to(h.dtype)) * self.inv_length.to(h.dtype)
        projected = x @ self.W.to(h.dtype).T + self.b.to(h.dtype)
        return math.sqrt(2.0 / self.W.shape[0]) * torch.cos(projected)


@heads.register("sngp")
class SNGP(Head):
    def _build(self, n_features: int, n_classes: int) -> None:
        cfg = self.config
        needed = n_classes * cfg.random_features**2 * 4
        if cfg.covariance == "per_class" and needed > MAX_COVARIANCE_BYTES:
            raise EtnError(
                f"sngp with covariance = 'per_class' needs {needed / 2**30:.1f} GiB for "
                f"{n_classes} classes x {cfg.random_features}^2; set covariance = 'shared' "
                "(one precision matrix, the reference code's choice) or fewer random_features."
            )
        with torch.random.fork_rng(devices=[]):  # the head's seed fixes features and beta
            torch.manual_seed(cfg.seed)
            self.gp_ = RandomFeatureGP(n_features, n_classes, cfg)

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        self._build(h.shape[1], z.shape[1])
        self.gp_.mean.copy_(h.mean(0))
        distance = median_distance(h - h.mean(0), cfg.seed)
        self.gp_.inv_length.fill_(1.0 / (cfg.length_scale * max(distance, 1e-12)))
        phi = self.gp_.features(h).to(device)  # (N, M), fixed: only beta is trained
        beta = self.gp_.beta

        def loss(phi_: torch.Tensor, y_: torch.Tensor) -> torch.Tensor:
            prior = cfg.ridge * beta.weight.pow(2).sum() / (2 * len(phi))
            return F.cross_entropy(beta(phi_), y_, reduction="none") + prior

        self.selection_ = fit_module(
            beta, loss, (phi, y), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            seed=cfg.seed, device=device, desc="sngp", select=cfg.select,
            class_scores=lambda phi_, y_: beta(phi_),
        ).record()  # fmt: skip
        self.covariance_ = self.posterior_covariance(phi.double())

    @torch.no_grad()
    def posterior_covariance(self, phi: torch.Tensor) -> torch.Tensor:
        """``Sigma_k`` (K, M, M) from one pass over the adaptation features, K = C or 1."""
        m = phi.shape[1]
        if self.config.covariance == "shared":
            weights = torch.ones(1, len(phi), dtype=phi.dtype, device=phi.device)  # (1, N)
        else:
            probs = torch.softmax(phi @ self.gp_.beta.weight.double().T, dim=1)  # (N, C)
            weights = (probs * (1 - probs)).T  # (C, N)
        eye = self.config.ridge * torch.eye(m, dtype=phi.dtype, device=phi.device)
        precision = torch.stack([eye + (phi * w[:, None]).T @ phi for w in weights])
        covariance = torch.cholesky_inverse(torch.linalg.cholesky(precision)).float()
        return covariance.contiguous()  # the layout a loaded checkpoint has: same rounding

    @torch.no_grad()
    def predictive_variance(self, h: torch.Tensor) -> torch.Tensor:
        """``var_k(h) = phi^T Sigma_k phi`` (N, K), K = C (per class) or 1 (shared)."""
        phi = self.gp_.features(h.double())  # (N, M)
        return torch.stack([((phi @ cov.double()) * phi).sum(1) for cov in self.covariance_], 1)

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        rows = max(1, 2**22 // self.config.random_features)
        parts = [self._chunk(h[i : i + rows]) for i in range(0, len(h), rows)]
        probs = np.concatenate(parts)  # (N, C)
        return Prediction(probs, probability_scores(probs))

    def _chunk(self, h: torch.Tensor) -> np.ndarray:
        logits = self.gp_.features(h.double()) @ self.gp_.beta.weight.double().T  # (n, C)
        variance = self.predictive_variance(h)  # (n, C) or (n, 1)
        adjusted = logits / torch.sqrt(1 + self.config.mean_field_factor * variance)
        return torch.softmax(adjusted, dim=1).cpu().numpy()

    def _state(self) -> dict[str, torch.Tensor]:
        return dict(self.gp_.state_dict()) | {"covariance": self.covariance_}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._build(self.n_features_, self.n_classes_)
        tensors = dict(tensors)
        self.covariance_ = tensors.pop("covariance")
        self.gp_.load_state_dict(tensors)
