"""IB-EDL: evidential deep learning through an information bottleneck (Li et al., ICLR 2025,
"Calibrating LLMs with information-theoretic evidential deep learning"; reference
sandylaker/ib-edl), as the paper's image baseline: the last layer is doubled to predict a mean
and a standard deviation per class logit (Supp. "Baselines").

The layer reads the hidden state ``h``; its first C outputs start from the backbone's classifier
``(W, c)``, the other C give ``sigma = softplus(.)``. With M reparameterised draws
``e_m ~ N(0, I)`` (M = 20)::

    mu = W h + c,   sigma = softplus(V h + d) + 1e-6,   alpha_m = softplus(mu + sigma * e_m) + b

and the reference's loss per sample (its ``ss`` Bayes risk with the VIB term; the KL
regulariser's weight is 0 in every published IB-EDL config)::

    (1/M) sum_m sum_i [ (y_i - p_mi)^2 + p_mi (1 - p_mi) / (alpha_m0 + 1) ]
    + beta * 1/2 sum_i (mu_i^2 + sigma_i^2 - 2 log sigma_i - 1)

with ``p_m = alpha_m / alpha_m0``; the second line is ``KL(N(mu, sigma^2) || N(0, I))``.

``beta = 1e-5`` is the reference's value for OBQA / Llama-3-8B (its other datasets use 2e-6 to
9e-5). Prediction, as in the reference: the Dirichlet with the mean concentration
``alpha = (1/M) sum_m alpha_m`` and ``p = alpha / alpha_0``; IB-EDL thus yields a Dirichlet,
and its UM, MI and DE are reported in closed form as the paper does. The M standard-normal draws
(M, C) are fixed by the head's seed and shared by every row, so predictions are deterministic
and independent of the batch.

Differs from the reference and the paper: only the last layer is trained (the paper fine-tunes
the backbone; the reference LoRA), and the kept epoch has the lowest adaptation loss. ``b`` is
learnable (the paper makes it so for every EDL baseline; the reference fixes ``b = 1``, which
``learn_b = false`` restores). The standard-deviation rows start at zero weight and
``sigma = sigma_init`` (the prior's 1), as the paper does not say how it initialises them.
Epochs, batch size and learning rate are the paper's adaptation settings; the reference's
weight decay (1e-3), gradient clipping and cosine schedule are not used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.edl import evidence, inverse_softplus
from etn_cli.heads.lastlayer import classifier_tensors
from etn_cli.heads.scalar_density import use_fused
from etn_cli.heads.settings import SIGMA_FLOOR, IBEDLConfig
from etn_cli.heads.training import fit_module
from etn_cli.heads.vector_density import compiled_once
from etn_cli.metrics.scores import dirichlet_scores

EPS = 1e-4  # keeps b > 0
PREDICT_ROWS = 4096


class MeanStdLinear(nn.Module):
    """One linear layer with 2C outputs: logit means ``mu`` and standard deviations ``sigma``."""

    def __init__(self, n_features: int, n_classes: int, cfg: IBEDLConfig):
        super().__init__()
        self.n_classes = n_classes
        self.linear = nn.Linear(n_features, 2 * n_classes)
        self.b_raw = nn.Parameter(
            torch.tensor([inverse_softplus(cfg.b_init)]), requires_grad=cfg.learn_b
        )

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.linear(h)  # (B, 2C)
        return out[:, : self.n_classes], F.softplus(out[:, self.n_classes :]) + SIGMA_FLOOR

    @property
    def b(self) -> torch.Tensor:
        return F.softplus(self.b_raw) + EPS

    def start_from(self, weight: torch.Tensor, bias: torch.Tensor, sigma_init: float) -> None:
        """Mean rows = the backbone's classifier; std rows = zero weight, ``sigma_init``."""
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[: self.n_classes] = weight
            self.linear.bias[: self.n_classes] = bias
            self.linear.bias[self.n_classes :] = inverse_softplus(sigma_init - SIGMA_FLOOR)


def bayes_risk_mse(alpha: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sensoy et al.'s sum-of-squares Bayes risk (the reference's ``ss`` loss) per row (...,).

    ``sum_i (y_i - p_i)^2 + p_i (1 - p_i) / (alpha_0 + 1)`` with ``p = alpha / alpha_0``.
    """
    alpha0 = alpha.sum(-1, keepdim=True)
    p = alpha / alpha0
    y = F.one_hot(labels, alpha.shape[-1]).to(alpha.dtype).expand_as(alpha)
    return ((y - p) ** 2 + p * (1 - p) / (alpha0 + 1)).sum(-1)


def sampled_risk(
    mu: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor, b: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """The Bayes risk averaged over the draws ``alpha_m = softplus(mu + sigma e_m) + b`` (B,)."""
    return bayes_risk_mse(evidence(mu + sigma * noise, b), labels).mean(0)


def risk_and_gradients(
    mu: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor, b: torch.Tensor,
    onehot: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`sampled_risk` (B,) with the per-row gradients of its draws' mean: in ``mu`` and
    ``sigma`` (B, C) and in ``b`` (B,), for one-hot labels (B, C).

    With ``S = alpha_0``, ``Q = sum_i p_i^2`` and ``sum_i p_i = 1`` the risk of a draw is
    ``1 - 2 p_y + Q + (1 - Q) / (S + 1)``, so::

        dR/dalpha_j = 2 (p_y - [j = y]) / S + 2 (p_j - Q) / (S + 1) - (1 - Q) / (S + 1)^2

    and ``dR/dx_j = dR/dalpha_j sigmoid(x_j)`` for ``x = mu + sigma e``. Compiled, the M x B x C
    values are never kept for a backward pass (:class:`_FusedRisk`)."""
    x = mu + sigma * noise  # (M, B, C)
    alpha = F.softplus(x) + b
    total = alpha.sum(-1, keepdim=True)  # (M, B, 1)
    p = alpha / total
    squares = (p * p).sum(-1, keepdim=True)
    p_y = (p * onehot).sum(-1, keepdim=True)
    after = total + 1
    risk = 1 - 2 * p_y + squares + (1 - squares) / after
    d_alpha = (2 * p_y - 2 * onehot) / total + 2 * (p - squares) / after
    d_alpha = d_alpha - (1 - squares) / (after * after)
    d_x = d_alpha * torch.sigmoid(x)
    mean = 1.0 / noise.shape[0]
    return (
        risk.squeeze(-1).mean(0),
        d_x.sum(0) * mean,
        (d_x * noise).sum(0) * mean,
        d_alpha.sum((0, 2)) * mean,
    )


class _FusedRisk(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel, mu, sigma, noise, b, labels):
        onehot = F.one_hot(labels, mu.shape[-1]).to(mu.dtype)
        risk, d_mu, d_sigma, d_b = kernel(mu, sigma, noise, b, onehot)
        ctx.save_for_backward(d_mu, d_sigma, d_b)
        ctx.b_shape = b.shape
        return risk

    @staticmethod
    def backward(ctx, grad):
        d_mu, d_sigma, d_b = ctx.saved_tensors
        rows = grad.unsqueeze(-1)  # (B, 1)
        grad_b = (grad * d_b).sum().reshape(ctx.b_shape)
        return None, rows * d_mu, rows * d_sigma, None, grad_b, None


def mean_evidence(
    mu: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    """``(1/M) sum_m softplus(mu + sigma * e_m) + b`` (n, C) for fixed draws ``e`` (M, C)."""
    return evidence(mu + sigma * noise[:, None, :], b).mean(0)


def compiled_risk() -> Callable:
    """:func:`sampled_risk` as one compiled pass with its closed-form gradient
    (:func:`risk_and_gradients`), once per process: at ImageNet shape its (M, B, C)
    elementwise work dominates a step."""
    kernel = compiled_once("risk", risk_and_gradients)

    def risk(mu, sigma, noise, b, labels):
        return _FusedRisk.apply(kernel, mu, sigma, noise, b, labels)

    return risk


def information_bottleneck_kl(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """``KL(N(mu, sigma^2) || N(0, I)) = 1/2 sum_i (mu_i^2 + sigma_i^2 - 2 log sigma_i - 1)``."""
    return 0.5 * (mu**2 + sigma**2 - 2 * sigma.log() - 1).sum(-1)


@heads.register("ib_edl")
class IBEDL(Head):
    fused_ = False  # the sampled risk compiled (large CPU fits, as ETN's objective)

    def _build(self, n_features: int, n_classes: int) -> None:
        self.module_ = MeanStdLinear(n_features, n_classes, self.config)
        generator = torch.Generator().manual_seed(self.config.seed)
        self.noise_ = torch.randn(self.config.mc_samples, n_classes, generator=generator)

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        self._build(h.shape[1], z.shape[1])
        weight, bias = classifier_tensors(classifier, h.shape[1], z.shape[1])
        self.module_.start_from(weight, bias, cfg.sigma_init)
        self.fused_ = use_fused(device, cfg.mc_samples * z.numel() * cfg.epochs)
        self.selection_ = fit_module(  # accuracy of the fixed draws' mean alpha, as predicted
            self.module_, self.loss, (h, y), epochs=cfg.epochs, batch_size=cfg.batch_size,
            lr=cfg.lr, seed=cfg.seed, device=device, desc="ib_edl", select=cfg.select,
            class_scores=lambda h_, y_: self._mean_alpha(h_, torch.float32, fused=self.fused_),
        ).record()  # fmt: skip

    def loss(
        self, h: torch.Tensor, y: torch.Tensor, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-sample IB-EDL loss (B,); ``noise`` (M, B, C) defaults to fresh N(0, I) draws."""
        mu, sigma = self.module_(h)  # (B, C)
        if noise is None:
            noise = torch.randn(self.config.mc_samples, *mu.shape, device=mu.device)
        risk_fn = compiled_risk() if self.fused_ else sampled_risk
        risk = risk_fn(mu, sigma, noise, self.module_.b, y)  # (B,)
        return risk + self.config.beta * information_bottleneck_kl(mu, sigma)

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        alpha = (
            torch.cat(
                [self._mean_alpha(h[i : i + PREDICT_ROWS]) for i in range(0, len(h), PREDICT_ROWS)]
            )
            .cpu()
            .numpy()
        )  # (N, C)
        return Prediction(alpha / alpha.sum(1, keepdims=True), dirichlet_scores(alpha), alpha)

    def _mean_alpha(
        self, h: torch.Tensor, dtype: torch.dtype = torch.float64, *, fused: bool = False
    ) -> torch.Tensor:
        """``(1/M) sum_m softplus(mu + sigma * e_m) + b`` with the fixed draws (float64 to
        predict; float32 where training measures its accuracy, compiled with ``fused``)."""
        mu, sigma = (t.to(dtype) for t in self.module_(h))  # (n, C)
        mean = compiled_once("mean", mean_evidence) if fused else mean_evidence
        return mean(mu, sigma, self.noise_.to(mu.device, dtype), self.module_.b.to(dtype))

    def _state(self) -> dict[str, torch.Tensor]:
        return dict(self.module_.state_dict())

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._build(self.n_features_, self.n_classes_)
        self.module_.load_state_dict(tensors)
