"""The vector ETN's training objective as one compiled CPU kernel, like the scalar one
(:mod:`etn_cli.heads.scalar_density`).

The vector variant draws one ``a_i`` per class (M, B, C) and has one ``b_i`` per class (C,).
Paper Eq. 8's expected log density and its gradient are::

    alpha_i = softplus(a_i z_i) + b_i,   k = digamma(alpha_0) + c_other
    E = lgamma(alpha_0) - sum_i lgamma(alpha_i) + c_other (alpha_0 - C)
        + (c_y - c_other)(alpha_y - 1)
    dE/da_i = (k - digamma(alpha_i) + (c_y - c_other) [i = y]) s_i z_i,   s_i = sigmoid(a_i z_i)
    dE/db_i = sum over draws and rows of (k - digamma(alpha_i) + (c_y - c_other) [i = y])

:func:`vector_density` evaluates ``alpha``, ``lgamma`` and ``digamma`` (sharing one evaluation)
in one compiled pass and keeps ``digamma(alpha_i)`` and ``s_i z_i`` for the backward pass, which
is three elementwise operations. Used where the scalar kernel is (:func:`use_fused`); the result
equals the plain formula to float32 precision (``tests/test_vector_density.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.nn import functional as F

from etn_cli.heads.edl import expected_dirichlet_log_density, target_log_pi
from etn_cli.heads.gamma_sampling import quantile_table, table_gamma
from etn_cli.heads.scalar_density import LARGEST, lgamma_digamma, softplus_from_sigmoid

log = logging.getLogger(__name__)


def vector_density(
    a: torch.Tensor, z: torch.Tensor, b: torch.Tensor, onehot: torch.Tensor, c_y: float,
    c_other: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The expected log density (M, B), ``alpha_0`` (M, B), ``digamma(alpha)`` and ``s z``
    (M, B, C) for draws ``a`` (M, B, C), logits ``z`` (B, C), ``b`` (C,) and one-hot labels."""
    num_classes = z.shape[-1]
    u = a * z
    s = torch.sigmoid(u)
    alpha = softplus_from_sigmoid(u, s) + b
    lgamma, digamma = lgamma_digamma(alpha)
    alpha0 = alpha.sum(-1)
    alpha_y = (alpha * onehot).sum(-1)
    cross = c_other * (alpha0 - num_classes) + (c_y - c_other) * (alpha_y - 1)
    density = torch.lgamma(alpha0) - lgamma.sum(-1) + cross
    return density, alpha0, digamma, s * z


class _VectorLogDensity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel, a, z, b, labels, nu):
        c_y, c_other = target_log_pi(z.shape[-1], nu)
        onehot = F.one_hot(labels, z.shape[-1]).to(z.dtype)  # (B, C)
        density, alpha0, digamma, sz = kernel(a, z, b, onehot, c_y, c_other)
        ctx.save_for_backward(alpha0, digamma, sz, onehot)
        ctx.constants = (c_y - c_other, c_other)
        return density

    @staticmethod
    def backward(ctx, grad):
        alpha0, digamma, sz, onehot = ctx.saved_tensors
        gap, c_other = ctx.constants
        k = torch.digamma(alpha0) + c_other  # (M, B)
        per_class = grad.unsqueeze(-1) * (k.unsqueeze(-1) - digamma + gap * onehot)  # (M, B, C)
        return None, per_class * sz, None, per_class.sum((0, 1)), None, None


_compiled: dict[str, Callable] = {}


def compiled_once(key: str, function: Callable) -> Callable:
    """``function`` compiled by ``torch.compile`` on first use, once per process."""
    if key not in _compiled:
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        _compiled[key] = torch.compile(function, dynamic=True)
    return _compiled[key]


def _kernel() -> Callable:
    return compiled_once("kernel", vector_density)


def vector_log_density(
    a: torch.Tensor, z: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, nu: float,
    *, fused: bool = False,
) -> torch.Tensor:  # fmt: skip
    """:func:`~etn_cli.heads.edl.expected_dirichlet_log_density` of ``alpha = softplus(a z) +
    b`` (M, B) for draws ``a`` (M, B, C), logits ``z`` (B, C) and ``b`` (C,); with ``fused``, by
    the compiled kernel where the inputs allow it (float32, no overflow)."""
    if fused and a.dtype == torch.float32 and "failed" not in _compiled:
        bound = float(a.detach().max()) * float(z.abs().max()) + float(b.detach().max()) + 1
        if bound < LARGEST:
            try:
                return _VectorLogDensity.apply(_kernel(), a, z, b, labels, nu)
            except Exception as error:
                log.warning("ETN: compiling the fused vector loss failed (%s); eager.", error)
                _compiled["failed"] = True
    return expected_dirichlet_log_density(F.softplus(a * z) + b, labels, nu)


def gamma_density(
    shape: torch.Tensor, rate: torch.Tensor, normal: torch.Tensor, table: torch.Tensor,
    z: torch.Tensor, b: torch.Tensor, onehot: torch.Tensor, c_y: float, c_other: float,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Draws ``a = x / r``, ``x ~ Gamma(k, 1)`` from standard normals (M, B, C) by
    :func:`~etn_cli.heads.gamma_sampling.table_gamma`, and the MC mean (B,) of the expected log
    density with the (B, C) sums over draws its gradient needs: ``sum_m g dx/dk``, ``sum_m g x``
    and ``sum_m (k - digamma(alpha) + (c_y - c_other) [i = y])``, ``g`` being dE/da."""
    x, dxdk = table_gamma(shape, normal, table)
    a = x / rate
    density, alpha0, digamma, sz = vector_density(a, z, b, onehot, c_y, c_other)
    gap = c_y - c_other
    per_class = (torch.digamma(alpha0) + c_other).unsqueeze(-1) - digamma + gap * onehot
    g = per_class * sz  # dE/da (M, B, C)
    return density.mean(0), (g * dxdk).sum(0), (g * x).sum(0), per_class.sum(0)


class _GammaLogDensity(torch.autograd.Function):
    """The MC mean of the expected log density over Gamma draws, differentiable in the Gamma's
    shape and rate (implicit reparameterisation) and in ``b``."""

    @staticmethod
    def forward(ctx, kernel, shape, rate, normal, z, b, labels, nu):
        c_y, c_other = target_log_pi(z.shape[-1], nu)
        onehot = F.one_hot(labels, z.shape[-1]).to(z.dtype)  # (B, C)
        table = quantile_table()
        density, g_dxdk, g_x, g_b = kernel(shape, rate, normal, table, z, b, onehot, c_y, c_other)
        draws = normal.shape[0]
        ctx.save_for_backward(rate, g_dxdk / draws, g_x / draws, g_b / draws)
        return density

    @staticmethod
    def backward(ctx, grad):
        rate, g_dxdk, g_x, g_b = ctx.saved_tensors
        grad = grad.unsqueeze(-1)  # (B, 1)
        grad_shape = grad * g_dxdk / rate
        grad_rate = -grad * g_x / (rate * rate)
        return None, grad_shape, grad_rate, None, None, (grad * g_b).sum(0), None, None


def _gamma_kernel() -> Callable:
    return compiled_once("gamma", gamma_density)


def vector_gamma_log_density(
    shape: torch.Tensor, rate: torch.Tensor, z: torch.Tensor, b: torch.Tensor,
    labels: torch.Tensor, nu: float, draws: int, *, fused: bool = False,
) -> torch.Tensor:  # fmt: skip
    """The MC mean (B,) over ``draws`` of the expected log density of ``alpha = softplus(a z) +
    b``, ``a ~ Gamma(shape, rate)`` (B, C) per class; with ``fused``, drawn and evaluated by one
    compiled kernel (:func:`gamma_density`), else ``Gamma.rsample`` and the plain formula."""
    if fused and shape.dtype == torch.float32 and "failed" not in _compiled:
        normal = torch.randn((draws, *shape.shape))
        # a <= quantile at the largest normal drawn: a bound without drawing first
        top = float(normal.max()) + 1
        k_max, r_min = float(shape.detach().max()), float(rate.detach().min())
        a_max = (k_max + 3 * top * (k_max**0.5 + 1) + top * top) / r_min
        if a_max * float(z.abs().max()) + float(b.detach().max()) + 1 < LARGEST:
            try:
                return _GammaLogDensity.apply(
                    _gamma_kernel(), shape, rate, normal, z, b, labels, nu
                )
            except Exception as error:
                log.warning("ETN: compiling the fused vector loss failed (%s); eager.", error)
                _compiled["failed"] = True
    gamma = torch.distributions.Gamma(shape, rate, validate_args=False)
    a = gamma.rsample((draws,))  # (M, B, C)
    return vector_log_density(a, z, b, labels, nu, fused=fused).mean(0)
