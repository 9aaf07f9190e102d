"""Reparameterised standard Gamma draws for the vector ETN's M x B x C draws, by a tabulated
quantile function (:mod:`etn_cli.heads.vector_density`).

PyTorch's CPU ``_standard_gamma`` and ``_standard_gamma_grad`` work one element at a time, and at
ImageNet shape (1.28 M draws a step) they took half of the vector ETN's step. Here a draw is
``x = F_k^-1(Phi(w))`` for one standard normal ``w``, read from a table of the Gamma quantile
function over ``(log k, w)`` with bilinear interpolation, together with its derivative
``dx/dk`` at fixed ``w``: the implicit reparameterisation gradient (Figurnov et al. 2018),
``-(dP(k, x)/dk) / p(x; k)``. There is no rejection step, and both fuse into the compiled loss.

The table holds ``D = k log(x / k)`` and ``D' = dD/d log k`` (smooth in both coordinates for
every shape, also where ``x`` underflows), so ``log x = log k + D / k`` and ``dx/dk = (x / k)
(1 + (D' - D) / k)``. It is built once per process from ``scipy.special.gammaincinv`` (its
derivative by fourth-order differences along ``log k``), for ``1e-4 <= k <= LARGEST_SHAPE`` and
``|w| <= W_MAX``; above ``LARGEST_SHAPE`` the Wilson-Hilferty transformation ``x = k (1 - 1/(9k)
+ w/(3 sqrt k))^3`` is used, and ``w`` is clamped to ``W_MAX`` (a draw in 10^10). Draws and
gradients match the exact ones to 1e-4 relative for k >= 1, 5e-4 for 0.1 <= k < 1 (PyTorch's
own gradient is within 7e-4); below k = 0.1 the draws are tiny and less exact (up to 20% at
x ~ 1e-3). ``tests/test_vector_density.py`` checks moments, quantiles and gradients against
closed forms, finite differences and ``torch._standard_gamma_grad``.

Prediction needs only the M fixed levels ``u_m = (m - 1/2) / M`` (stratified quantiles), so
:class:`LevelGamma` reads them from a second, one-dimensional table per level: a cubic spline in
``log k`` of ``log x - (log u + lgamma(k + 1)) / k``, the gap to the small-shape asymptote ``x ~
(u Gamma(k + 1))^(1/k)`` (about ``x / (k + 1)`` there, ``1 + w / sqrt k`` for large k: smooth and
bounded, so its absolute error is the relative error of ``x`` at every shape). Built from
``gammaincinv`` in float64 in a few hundredths of a second, for ``1e-4 <= k <= 1e7``; it matches
``gammaincinv`` to 1e-8 relative (``tests/test_vector_density.py``), shapes outside the range
fall back to ``gammaincinv`` itself.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.interpolate import CubicSpline
from scipy.special import gammainccinv, gammaincinv, gammaln, ndtr

LOG_K_MIN, LOG_K_MAX, STEP_LOG_K = math.log(1e-4) - 0.05, math.log(1e4), 0.02
W_MAX, STEP_W = 6.5, 0.02
LARGEST_SHAPE = 1e4
TINY = torch.finfo(torch.float32).tiny
LEVEL_LOG_K_MIN, LEVEL_LOG_K_MAX, LEVEL_STEP = math.log(1e-4) - 0.1, math.log(1e7), 0.05

_tables: dict[str, torch.Tensor] = {}
_level_tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def quantile_table() -> torch.Tensor:
    """``(D, D')`` on the grid (2, n_log_k, n_w), float32, built on first use (about a second)."""
    if "table" not in _tables:
        n_k = round((LOG_K_MAX - LOG_K_MIN) / STEP_LOG_K) + 1
        log_k = LOG_K_MIN + STEP_LOG_K * np.arange(-2, n_k + 2)  # two more each side
        w = np.arange(-W_MAX, W_MAX + STEP_W / 2, STEP_W)
        d = _scaled_log_quantile(log_k[:, None], w[None])
        # fourth-order central differences along log k
        d_prime = (d[:-4] - 8 * d[1:-3] + 8 * d[3:-1] - d[4:]) / (12 * STEP_LOG_K)
        table = np.stack([d[2:-2], d_prime])
        _tables["table"] = torch.from_numpy(table.astype(np.float32))
    return _tables["table"]


def _scaled_log_quantile(log_k: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``k log(x / k)`` for the ``Phi(w)`` quantile ``x`` of ``Gamma(k, 1)``, float64; where ``x``
    underflows, from ``P(k, x) = x^k / Gamma(k + 1) (1 + O(x))``."""
    k = np.exp(log_k)
    with np.errstate(divide="ignore"):
        x = np.where(w < 0, gammaincinv(k, ndtr(w)), gammainccinv(k, ndtr(-w)))
        log_x = np.where(x > 1e-300, np.log(x), (np.log(ndtr(w)) + gammaln(k + 1)) / k)
    return k * (log_x - log_k)


def table_gamma(
    shape: torch.Tensor, normal: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard Gamma draws ``x`` (M, B, C) and ``dx/dk`` for shapes ``k`` (B, C) and standard
    normals ``w`` (M, B, C), from :func:`quantile_table`."""
    n_k, n_w = table.shape[1], table.shape[2]
    log_k = torch.log(shape)
    at_k = torch.clamp((log_k - LOG_K_MIN) / STEP_LOG_K, 0, n_k - 1.001)
    at_w = (torch.clamp(normal, -W_MAX, W_MAX) + W_MAX) / STEP_W
    at_w = torch.clamp(at_w, 0, n_w - 1.001)
    i_k, i_w = torch.floor(at_k), torch.floor(at_w)
    f_k, f_w = at_k - i_k, at_w - i_w
    index = (i_k * n_w + i_w).long()
    flat = table.reshape(2, -1)
    d, d_prime = (_bilinear(flat[j], index, n_w, f_k, f_w) for j in range(2))
    x = torch.exp(log_k + d / shape)
    dxdk = x / shape * (1 + (d_prime - d) / shape)
    # Wilson-Hilferty above the table: x = k c^3, c = 1 - 1/(9k) + w / (3 sqrt k)
    root = torch.sqrt(shape)
    c = 1 - 1 / (9 * shape) + normal / (3 * root)
    wilson = shape * c * c * c
    wilson_dk = c * c * c + 3 * shape * c * c * (
        1 / (9 * shape * shape) - normal / (6 * shape * root)
    )
    large = shape > LARGEST_SHAPE
    x = torch.clamp_min(torch.where(large, wilson, x), TINY)
    return x, torch.where(large, wilson_dk, dxdk)


def _bilinear(values, index, n_w, f_k, f_w):
    low = values[index] * (1 - f_w) + values[index + 1] * f_w
    high = values[index + n_w] * (1 - f_w) + values[index + n_w + 1] * f_w
    return low * (1 - f_k) + high * f_k


def level_quantiles(draws: int) -> np.ndarray:
    """The stratified quantile levels ``(m + 1/2) / M``, m = 0 .. M - 1 (M,)."""
    return (np.arange(draws) + 0.5) / draws


def level_table(draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of the ``draws`` levels ``u``: the cubic spline of ``log x - (log u + lgamma(k +
    1)) / k`` over ``log k`` as coefficients of ``f^0 .. f^3`` (4, M * n), ``f`` the position
    within the interval (``n`` intervals per level), and ``log u`` (M,); float64, built on first
    use per M."""
    if draws not in _level_tables:
        n = math.ceil((LEVEL_LOG_K_MAX - LEVEL_LOG_K_MIN) / LEVEL_STEP) + 1
        log_k = LEVEL_LOG_K_MIN + LEVEL_STEP * np.arange(n)
        k = np.exp(log_k)[:, None]  # (n, 1)
        u = level_quantiles(draws)
        x = gammaincinv(k, u)  # (n, M)
        asymptote = (np.log(u) + gammaln(k + 1)) / k
        # below 1e-290 (k < 0.01) x underflows or loses digits; there log(x / asymptote) is
        # x / (k + 1) + O(x^2), i.e. 0
        tiny = x < 1e-290
        gap = np.where(tiny, 0.0, np.log(np.where(tiny, 1.0, x)) - asymptote)
        c = CubicSpline(log_k, gap, axis=0).c  # (4, n - 1, M): (log k - knot)^3 .. ^0
        powers = LEVEL_STEP ** np.arange(4)
        coef = c[::-1] * powers[:, None, None]  # f^0 .. f^3
        flat = np.ascontiguousarray(coef.transpose(0, 2, 1)).reshape(4, -1)  # (4, M * (n - 1))
        _level_tables[draws] = (torch.from_numpy(flat), torch.from_numpy(np.log(u)))
    return _level_tables[draws]


class LevelGamma:
    """Standard Gamma quantiles at the levels of :func:`level_quantiles` for fixed shapes ``k``
    (n, K), float64, from :func:`level_table`; shapes outside it by ``gammaincinv``. The parts
    that depend only on ``k`` are computed once; each call gives one draw (n, K) for a level
    index per Gamma (K,), so M draws never need an (M, n, K) array."""

    def __init__(self, shape: torch.Tensor, draws: int):
        self.coef, self.log_u = (t.to(shape.device) for t in level_table(draws))
        self.draws = draws
        self.per_level = self.coef.shape[1] // draws
        self.shape = shape.detach().double()
        at = (torch.log(self.shape) - LEVEL_LOG_K_MIN) / LEVEL_STEP
        knot = torch.clamp(torch.nan_to_num(torch.floor(at)), 0, self.per_level - 1)
        self.f = at - knot
        self.knot = knot.long()
        self.inverse = 1 / self.shape
        self.asymptote = torch.lgamma(self.shape + 1) * self.inverse  # + log(u) / k
        outside = ~((at >= 0) & (at <= self.per_level))  # NaN too
        self.outside = torch.nonzero(outside, as_tuple=True) if bool(outside.any()) else None

    def __call__(self, level: torch.Tensor) -> torch.Tensor:
        """The draw ``x`` (n, K) at levels ``u[level[j]]`` for the j-th Gamma (K,)."""
        index = (self.knot + level * self.per_level).reshape(-1)
        c0, c1, c2, c3 = (self.coef[j].index_select(0, index).view(self.f.shape) for j in range(4))
        f = self.f
        log_x = torch.addcmul(c0, torch.addcmul(c1, torch.addcmul(c2, c3, f, out=c2), f), f)
        log_x += self.asymptote
        log_x.addcmul_(self.log_u[level], self.inverse)
        x = log_x.exp_()
        if self.outside is not None:
            rows, cols = self.outside
            u = level_quantiles(self.draws)[level[cols].cpu().numpy()]
            outside = gammaincinv(self.shape[rows, cols].cpu().numpy(), u)
            x[rows, cols] = torch.from_numpy(outside).to(x.device)
        return x
