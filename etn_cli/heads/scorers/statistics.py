"""ID statistics shared by the Gaussian and subspace scorers: second moments, class means,
tied covariances and their pseudo-inverse in float64, and the minimum Mahalanobis distance to
the class means, never building an (N, C, D) tensor."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from etn_cli.heads.scorers.base import check_every_class
from etn_cli.heads.scorers.threads import one_thread

DISTANCE_CELLS = 1 << 20  # float64 values of a block of rows in squared_distances
NUMPY_FROM = 1024  # dimensions from which numpy's float64 syrk and eigh beat torch's
MOMENT_CELLS = 1 << 24  # float64 values per block (128 MiB): large blocks keep syrk efficient
SMALL_CELLS = 1 << 21  # float64 values per block (16 MiB) where no syrk reads it: malloc reuses it
PANEL = 128  # columns per product of a moment's upper triangle


def float64_blocks(
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    centres: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    *,
    cells: int = MOMENT_CELLS,
    column_major: bool = False,
) -> Iterator[tuple[slice, torch.Tensor]]:
    """``(rows, block)`` over blocks of about ``cells`` values: ``x[rows]`` in float64, each
    row multiplied by its ``scale`` (N,) when given, then less ``centres`` (D,), or
    ``centres[labels[rows]]`` for class centres (C, D), when given. One buffer serves every
    block (a fresh float64 block per step costs as much as its product in page faults; one of
    up to ``SMALL_CELLS`` values is not even faulted in again on the next call, as malloc
    keeps it), so a block is valid only until the next one. ``column_major``: blocks stored
    column by column, so that ``block.T`` (D, rows) is row-major for :func:`add_upper_gram`."""
    step = max(1, cells // x.shape[1])
    shape = (min(step, len(x)), x.shape[1])
    scratch = None  # the block transposed in its own dtype: two contiguous copies beat one
    if column_major:  # strided cast (0.034 s against 0.054 s at 50,000 x 512 float32)
        buffer = torch.empty(shape[::-1], dtype=torch.float64, device=x.device).T
        scratch = torch.empty(shape[::-1], dtype=x.dtype, device=x.device)
    else:
        buffer = torch.empty(shape, dtype=torch.float64, device=x.device)
    gathered = None if labels is None else torch.empty(shape, dtype=torch.float64, device=x.device)
    if centres is not None:
        centres = centres.to(torch.float64)
    for start in range(0, len(x), step):
        rows = slice(start, min(start + step, len(x)))
        block = buffer[: rows.stop - start]
        with one_thread():  # copies: memory-bound (the caller's products keep the threads)
            centre = centres
            if labels is not None and column_major:  # gathered in the block's layout
                centre = centres.T.index_select(1, labels[rows]).T
            elif labels is not None:
                centre = torch.index_select(centres, 0, labels[rows], out=gathered[: len(block)])
            if scratch is None:
                block.copy_(x[rows])  # then in place: torch's mixed-dtype ops are 4x slower
            else:
                part = scratch[:, : len(block)]
                part.copy_(x[rows].T)
                block.T.copy_(part)
            if scale is not None:
                block.mul_(scale[rows, None])
            if centre is not None:
                block -= centre
        yield rows, block


def second_moment(
    x: torch.Tensor,
    means: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_i (x_i - m_i)(x_i - m_i)^T`` (D, D) with ``m_i = means`` (D,), or
    ``means[labels[i]]`` for class means (C, D), or 0 (rows first multiplied by ``scale``
    (N,) when given): float64 products of centred row blocks. Centring before the product
    keeps the small eigenvalues that ``E[x x^T] - mu mu^T`` would cancel away, and float64
    products keep those that float32 ones blur: the cut of ViM's principal subspace and every
    inverse covariance read them (a float32 product perturbs the moment by about 1e-7 of its
    largest entry, which can exceed the gap at the cut)."""
    total = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device)
    if not by_panels(x):
        for _, block in float64_blocks(x, scale, means, labels):
            total += gram(block)
        return total
    for _, block in float64_blocks(x, scale, means, labels, cells=SMALL_CELLS, column_major=True):
        add_upper_gram(total, block.T)
    return mirrored(total)


def by_panels(x: torch.Tensor) -> bool:
    """Whether :func:`add_upper_gram` makes the moment of ``x``: on the CPU from two panels
    to ``NUMPY_FROM`` dimensions (one panel would be the full product, by another kernel: a
    repeated feature's covariance, exactly singular by :func:`gram`, kept a pivot above
    :func:`precision`'s floor)."""
    return x.device.type == "cpu" and PANEL < x.shape[1] < NUMPY_FROM


def add_upper_gram(total: torch.Tensor, columns: torch.Tensor) -> None:
    """Add the upper triangle (with the diagonal) of ``columns columns^T`` to ``total``
    (D, D), for float64 ``columns`` (D, rows), by panels of ``PANEL`` rows: 0.6 of a full
    product's work. Measured at 32,768 x 512 on this project's machine (2 threads, idle):
    the full float64 product 211 ms, panels of a row-major (rows, D) block 168 ms, panels of
    a row-major (D, rows) block 121 ms (numpy's ``dsyrk`` 117 ms, float32 ``mm`` 90 ms)."""
    for start in range(0, len(columns), PANEL):
        panel = slice(start, start + PANEL)
        total[panel, start:].addmm_(columns[panel], columns[start:].T)


def mirrored(upper: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix whose upper triangle ``upper`` holds."""
    return upper.triu() + upper.triu(1).T


def gram(block: torch.Tensor) -> torch.Tensor:
    """``block^T block`` (D, D) of a float64 block. From ``NUMPY_FROM`` dimensions on the
    CPU through numpy, whose ``a.T @ a`` is one symmetric rank-k update (``dsyrk``: half the
    products of a general one; at D = 2,048 about a float32 ``torch.mm`` of the same block
    on this project's machine, where torch's float64 product takes 2x as long); below, by
    :func:`add_upper_gram` where :func:`by_panels` says so (numpy's thread pool beside
    torch's stalls a 2-core machine under load: ViM at D = 512 took 2.3 s against 1.0 s with
    torch), else torch's one product."""
    if block.device.type == "cpu" and block.shape[1] >= NUMPY_FROM:
        rows = block.numpy()
        return torch.from_numpy(rows.T @ rows)
    if not by_panels(block):
        return block.T @ block
    upper = torch.zeros(block.shape[1], block.shape[1], dtype=block.dtype)
    add_upper_gram(upper, block.T)
    return mirrored(upper)


def column_mean(h: torch.Tensor) -> torch.Tensor:
    """Mean of the rows (D,) in float64, summed by blocks of :func:`float64_blocks`:
    ``h.double().mean(0)`` (and ``h.sum(0, dtype=torch.float64)``, which makes the same copy)
    faults in a float64 copy of every row, 0.14 s at 50,000 x 512 against 0.02 s, for the same
    sum."""
    total = torch.zeros(h.shape[1], dtype=torch.float64, device=h.device)
    for _, block in float64_blocks(h, cells=SMALL_CELLS):
        with one_thread():
            total += block.sum(0)
    return total / len(h)


def class_means(
    h: torch.Tensor, y: torch.Tensor, classes: int, what: str, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean feature of each class (C, D) in float64 (rows multiplied by ``scale`` (N,) when
    given); every class must have rows."""
    check_every_class(y, classes, what)
    sums = torch.zeros(classes, h.shape[1], dtype=torch.float64, device=h.device)
    for rows, block in float64_blocks(h, scale, cells=SMALL_CELLS):
        with one_thread():
            sums.index_add_(0, y[rows], block)
    return sums / torch.bincount(y, minlength=classes).double()[:, None]


def tied_covariance(
    h: torch.Tensor, y: torch.Tensor, means: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Shared covariance of the class-centred features, ``sum_i (h_i - mu_y)(..)^T / N``."""
    return second_moment(h, means, y, scale) / len(h)


def covariance(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (D,) and covariance (D, D), ``/ N``, of all rows, in float64."""
    mean = h.sum(0, dtype=torch.float64) / len(h)
    return mean, second_moment(h, mean) / len(h)


def precision(cov: torch.Tensor) -> torch.Tensor:
    """``pinv(cov)`` of a symmetric covariance (OpenOOD's ``EmpiricalCovariance``): the
    inverse from a Cholesky factor when ``cov`` is positive definite (the usual case with more
    rows than dimensions; 0.5 s at D = 2,048 where an eigendecomposition takes 10-40 s on this
    project's machine), else (a failed factorisation, or a pivot below D eps of the largest
    variance: numerically singular, where the inverse would be rounding noise) numpy's
    eigenvalue-based pseudo-inverse."""
    factor, info = torch.linalg.cholesky_ex(cov)
    pivots = factor.diagonal().square()
    scale = cov.diagonal().abs().max() * len(cov) * torch.finfo(cov.dtype).eps
    if int(info) == 0 and bool((pivots > scale).all()):  # else numerically singular
        return torch.cholesky_inverse(factor).contiguous()
    return torch.from_numpy(np.linalg.pinv(cov.cpu().numpy(), hermitian=True)).to(cov.device)


def symmetric_eigenvectors(matrix: torch.Tensor) -> torch.Tensor:
    """Eigenvectors (columns, ascending eigenvalues) of a symmetric matrix in float64: numpy's
    ``eigh`` from ``NUMPY_FROM`` dimensions on the CPU, torch's below (see :func:`gram`).
    Measured side by side at D = 2,048 on this project's machine (ViM's second moment of
    128,000 ResNet-50-shaped rows): numpy float64 7.3 s, numpy float32 7.7-12.9 s, SciPy's
    float32 ``syevd`` 6.4 s, torch float32 6.3 s, torch float64 11-13 s; the residual norms on
    the 1,048 trailing eigenvectors differ from torch float64's by 2e-14 (numpy float64), 5e-7
    (numpy float32) and 2e-4 (SciPy's and torch's float32) relative: float64 costs nothing
    here and keeps the subspace exact where the spectrum is nearly degenerate at the cut."""
    if matrix.device.type != "cpu" or matrix.shape[0] < NUMPY_FROM:
        return torch.linalg.eigh(matrix.double())[1]
    _, vectors = np.linalg.eigh(matrix.double().numpy())
    return torch.from_numpy(vectors)


def min_norm_solution(weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``pinv(W) t`` for W (C, D) with C <= D, in float64, from the QR factors of
    ``W^T = Q R``: ``Q R^-T t``, as accurate as the SVD (an error of about cond(W) eps, where
    the normal equations ``W^T (W W^T)^-1 t`` lose cond(W)^2 eps: the whole origin of ViM on
    a nearly rank-deficient layer) and a small fraction of its cost (the SVD of W at C = 1,000,
    D = 2,048 takes 70 s on this project's machine). A rank-deficient W (a diagonal entry of R
    below C eps of the largest) takes numpy's SVD-based ``pinv``."""
    weight, target = weight.double(), target.double()
    q, r = torch.linalg.qr(weight.T)  # (D, C), (C, C)
    pivots = r.diagonal().abs()
    if bool((pivots > pivots.max() * len(pivots) * torch.finfo(torch.float64).eps).all()):
        return q @ torch.linalg.solve_triangular(r.T, target[:, None], upper=False)[:, 0]
    pinv = np.linalg.pinv(weight.cpu().numpy())
    return torch.from_numpy(pinv @ target.cpu().numpy()).to(weight.device)


def between_class_scatter(means: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Overall mean (D,) and ``sum_c n_c (mu_c - mu)(mu_c - mu)^T`` (D, D) of class means
    (C, D) with row counts (C,), float64: with the within-class scatter
    (:func:`second_moment` about the class means) it gives the covariance of all rows,
    ``(S_within + S_between) / N``, without a second pass over the rows."""
    counts = counts.double()
    mean = (counts[:, None] * means).sum(0) / counts.sum()
    centred = means - mean
    return mean, (centred * counts[:, None]).T @ centred


def whitener(prec: torch.Tensor) -> torch.Tensor:
    """``G`` (D, r) with ``G G^T = prec``, so that ``x^T prec x = ||x G||^2``: the Cholesky
    factor of a positive definite precision, else ``V sqrt(lambda)`` over its positive
    eigenvalues (a pseudo-inverse's range); float64."""
    factor, info = torch.linalg.cholesky_ex(prec.double())
    if int(info) == 0:
        return factor
    values, vectors = torch.linalg.eigh(prec.double())
    keep = values > values.abs().max() * len(values) * torch.finfo(values.dtype).eps
    return vectors[:, keep] * values[keep].sqrt()


def whitened_means(means: torch.Tensor, prec: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What :func:`squared_distances` needs from the fitted state, computed once, float64: the
    centre ``c`` (the mean of the class means, D), the whitener ``G`` (D, r), the whitened
    means ``(mu_c - c) G`` (C, r) and their squared norms (C,)."""
    means = means.double()
    centre = means.mean(0)
    g = whitener(prec)
    moved = (means - centre) @ g
    return centre, g, moved, moved.square().sum(1)


def squared_distances(
    h: torch.Tensor,
    means: torch.Tensor,
    prec: torch.Tensor,
    parts: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """``(h - mu_c)^T P (h - mu_c)`` for every row and class (N, C) in float64, with only
    (N, D) and (N, C) tensors built: ``||w||^2 - 2 w . m_c + ||m_c||^2`` with the whitened
    rows ``w = (h - c) G`` and means ``m_c = (mu_c - c) G`` (``G G^T = P``,
    :func:`whitened_means`; pass its result as ``parts`` to reuse it). Float64 throughout: on
    a nearly singular covariance ``G`` has large entries of opposite signs on correlated
    units, and a float32 product loses their difference (1e-4 of the distance at a condition
    number of 4e6, where float64 keeps 1e-9)."""
    centre, g, moved, moved_sq = whitened_means(means, prec) if parts is None else parts
    out = torch.empty(len(h), len(moved), dtype=torch.float64, device=h.device)
    step = max(1, DISTANCE_CELLS // g.shape[0])  # small blocks reuse freed memory
    for s in range(0, len(h), step):
        w = (h[s : s + step].double() - centre) @ g  # (rows, r)
        out[s : s + step] = w.square().sum(1, keepdim=True) - 2 * (w @ moved.T) + moved_sq
    return out
