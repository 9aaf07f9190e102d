"""The scalar ETN's training objective as one compiled CPU kernel, for large class counts.

At ImageNet shape (M = 20 draws, batches of 64, C = 1,000 classes) the elementwise ``softplus``,
``lgamma`` and (in the backward pass) ``digamma`` over (M, B, C) dominate ETN's training on a
CPU: PyTorch evaluates the latter two one scalar at a time and each eager operation makes its
own pass over memory. For the scalar variant every draw ``a`` (M, B, 1) scales all C logits of
its row and one ``b`` is shared by all classes, so the gradient of paper Eq. 8's expected log
density reduces to a few sums over classes::

    alpha_i = softplus(a z_i) + b,   alpha_0 = sum_i alpha_i,   k = digamma(alpha_0) + c_other
    dE/da = k sum_i s_i z_i - sum_i digamma(alpha_i) s_i z_i + (c_y - c_other) s_y z_y
    dE/db = k C - sum_i digamma(alpha_i) + (c_y - c_other)

with ``s_i = sigmoid(a z_i)``. :func:`density_and_sums` computes the density and these sums in
one pass: ``lgamma`` and ``digamma`` share one evaluation (the recurrence up to ``x + 4`` and
Stirling's series), and ``torch.compile`` fuses the whole function into a vectorised loop. The
backward pass then only touches (M, B) tensors. The result equals the straightforward formula
to float32 precision (``tests/test_scalar_density.py``); ``benchmarks/bench_heads.py --shape
imagenet`` measures the difference.

The fused path is used on CPU when a fit evaluates at least :data:`MIN_WORK` Dirichlet
parameters (compiling takes seconds, once per process, cached on disk by PyTorch) and
``ETN_COMPILE`` is not ``0``; ``ETN_COMPILE=1`` forces it. Anywhere else, or if compilation
fails (no C++ compiler), the plain formula with autograd is used.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

import torch
from torch.nn import functional as F

from etn_cli.heads.edl import expected_dirichlet_log_density, target_log_pi

log = logging.getLogger(__name__)

# Compiling costs 5-25 s once per process (less with PyTorch's on-disk cache) and saves about
# 10 ns per Dirichlet parameter evaluated: worth it from about 1e9 (ImageNet shape: 1e10;
# CIFAR-100 shape: 2.5e8; CIFAR-10 shape: 2.5e7).
MIN_WORK = 10**9
LARGEST = 1e8  # above this the recurrence's product x^4 could overflow float32
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
C12, C120, C252, C360, C1260 = 1 / 12, 1 / 120, 1 / 252, 1 / 360, 1 / 1260


def lgamma_digamma(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lgamma(x), digamma(x))`` for ``0 < x <= 1e8``, elementwise, sharing their work.

    With ``y = x + 4`` and ``p = x (x+1) (x+2) (x+3) = t (t + 2)``, ``t = x (x + 3)``:
    ``lgamma(x) = lgamma(y) - log p`` and ``digamma(x) = digamma(y) - p'/p`` with
    ``p'/p = 1/x + 1/(x+1) + 1/(x+2) + 1/(x+3) = 2 (t + 1)(2x + 3) / p``. ``lgamma(y)`` and
    ``digamma(y)`` are Stirling's series to the ``y^-5`` and ``y^-6`` terms; for ``y >= 4`` the
    truncation error is below 1e-7, float32's resolution.
    """
    t = x * (x + 3)
    p = t * (t + 2)
    y = x + 4
    inverse = 1 / (y * p)  # one division for both 1/y and 1/p
    r = p * inverse
    log_y = torch.log(y)
    r2 = r * r
    lgamma_y = (y - 0.5) * log_y - y + HALF_LOG_2PI + r * (C12 - r2 * (C360 - r2 * C1260))
    digamma_y = log_y - 0.5 * r - r2 * (C12 - r2 * (C120 - r2 * C252))
    return lgamma_y - torch.log(p), digamma_y - 2 * (t + 1) * (2 * x + 3) * y * inverse


def density_and_sums(
    a: torch.Tensor, z: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, c_y: float,
    c_other: float,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """The expected log density (M, B) and the (M, B) sums its gradient needs:
    ``alpha_0``, ``sum_i s_i z_i``, ``sum_i digamma(alpha_i) s_i z_i``,
    ``sum_i digamma(alpha_i)`` and ``s_y z_y``."""
    num_classes = z.shape[-1]
    u = a * z  # (M, B, C)
    s = torch.sigmoid(u)
    alpha = softplus_from_sigmoid(u, s) + b
    lgamma, digamma = lgamma_digamma(alpha)
    alpha0 = alpha.sum(-1)
    sz = s * z
    # the label's terms from (M, B) values, so no (M, B, C) tensor is materialised for a gather
    z_y = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B,)
    u_y = a.squeeze(-1) * z_y  # (M, B)
    s_y = torch.sigmoid(u_y)
    alpha_y = softplus_from_sigmoid(u_y, s_y) + b
    cross = c_other * (alpha0 - num_classes) + (c_y - c_other) * (alpha_y - 1)
    density = torch.lgamma(alpha0) - lgamma.sum(-1) + cross
    sums = (alpha0, sz.sum(-1), (digamma * sz).sum(-1), digamma.sum(-1), s_y * z_y)
    return density, *sums


def softplus_from_sigmoid(u: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``softplus(u)`` given ``s = sigmoid(u)``: ``max(u, 0) - log(sigmoid(|u|))`` with
    ``sigmoid(|u|) = 1/2 + |s - 1/2|``, accurate to float32 resolution at both ends."""
    return torch.clamp_min(u, 0) - torch.log(0.5 + (s - 0.5).abs())


class _ScalarLogDensity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel, a, z, b, labels, nu):
        c_y, c_other = target_log_pi(z.shape[-1], nu)
        density, *sums = kernel(a, z, b, labels, c_y, c_other)
        ctx.save_for_backward(*sums)
        ctx.constants = (z.shape[-1], c_y - c_other, c_other)
        return density

    @staticmethod
    def backward(ctx, grad):
        alpha0, sz_sum, digamma_sz, digamma_sum, sz_y = ctx.saved_tensors
        num_classes, gap, c_other = ctx.constants
        k = torch.digamma(alpha0) + c_other  # (M, B)
        grad_a = grad * (k * sz_sum - digamma_sz + gap * sz_y)
        grad_b = (grad * (k * num_classes - digamma_sum + gap)).sum()
        return None, grad_a.unsqueeze(-1), None, grad_b.reshape(1), None, None


_compiled: dict[str, Callable | None] = {}


def _kernel() -> Callable | None:
    """``density_and_sums`` compiled once per process, or None where compiling fails."""
    if "kernel" not in _compiled:
        # compiling for the CPU, PyTorch warns that it found no CUDA runtime: not news here
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        _compiled["kernel"] = torch.compile(density_and_sums, dynamic=True)
    return _compiled["kernel"]


def use_fused(device: torch.device, work: int) -> bool:
    """Whether a fit whose loss evaluates ``work`` (draws x rows x classes x epochs) Dirichlet
    parameters in all takes the compiled path: on CPU when ``work`` pays for compiling, unless
    ``ETN_COMPILE`` says otherwise (``0`` never, ``1`` always)."""
    setting = os.environ.get("ETN_COMPILE", "auto")
    if setting == "0" or device.type != "cpu":
        return False
    return setting == "1" or work >= MIN_WORK


def scalar_log_density(
    a: torch.Tensor, z: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, nu: float,
    *, fused: bool = False,
) -> torch.Tensor:  # fmt: skip
    """:func:`~etn_cli.heads.edl.expected_dirichlet_log_density` of ``alpha = softplus(a z) +
    b`` (M, B) for draws ``a`` (M, B, 1), logits ``z`` (B, C) and one ``b`` (1,); with
    ``fused``, by the compiled kernel where the inputs allow it (float32, no overflow)."""
    if fused and a.dtype == torch.float32:
        bound = float(a.detach().max()) * float(z.abs().max()) + float(b.detach()) + 1
        kernel = _kernel() if bound < LARGEST else None
        if kernel is not None:
            try:
                return _ScalarLogDensity.apply(kernel, a, z, b, labels, nu)
            except Exception as error:
                log.warning("ETN: compiling the fused loss failed (%s); using eager.", error)
                _compiled["kernel"] = None
    return expected_dirichlet_log_density(F.softplus(a * z) + b, labels, nu)
