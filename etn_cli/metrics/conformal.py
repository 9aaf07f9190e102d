"""Split conformal prediction sets from a head's probabilities (Vovk et al. 2005; the
conventions of Angelopoulos, Bates, Malik & Jordan 2021, "Uncertainty sets for image
classifiers using conformal prediction", RAPS).

A score ``s(x, y)`` says how unusual label ``y`` is for input ``x``. On ``n`` calibration rows
the threshold ``q`` is the ``ceil((n + 1)(1 - alpha))``-th smallest of their scores ``s(x_i,
y_i)`` (infinite when that rank exceeds ``n``: every label is then kept), and the set of a new
``x`` is ``{y : s(x, y) <= q}``. When calibration and test rows are exchangeable the set holds
the true label with probability at least ``1 - alpha``, and, only with scores free of ties
(the randomised ones: with ties, e.g. LAC on probabilities that repeat, it can reach 1), at
most ``1 - alpha + 1 / (n + 1)``.

With the classes sorted by probability, ``p_(1) >= p_(2) >= ...``, and ``r`` the rank of ``y``:

* ``lac`` (least ambiguous set-valued classifier; Sadinle et al. 2019): ``s = 1 - p_y``;
* ``aps`` (adaptive prediction sets; Romano et al. 2020): ``s = sum_{j <= r} p_(j) - u p_(r)``;
* ``raps`` (regularised APS): ``s = sum_{j <= r} p_(j) + lambda (r - k_reg)^+ - u p_(r)``.

``u`` is uniform on [0, 1], one draw per row, shared by every label of the row (the randomised
sets of Angelopoulos et al., which make the coverage exact); without randomisation ``u = 0``.
The defaults ``lambda = 0.01``, ``k_reg = 5`` and empty sets allowed (``allow_zero_sets``)
are those of the authors' ImageNet notebook. Sets are nested in the rank, so each is the
top-``L`` classes.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

METHODS = ("lac", "aps", "raps")


def _ranked(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Class order by falling probability (N, C) and the sorted probabilities (N, C)."""
    order = np.argsort(-probs, axis=1, kind="mergesort")
    return order, np.take_along_axis(probs, order, axis=1)


def rank_scores(
    probs: np.ndarray, method: str, u: np.ndarray, penalty: float, k_reg: int
) -> tuple[np.ndarray, np.ndarray]:
    """The class order (N, C) and the score of the label at each rank (N, C), non-decreasing
    along the ranks for ``aps`` and ``raps``."""
    probs = np.asarray(probs, dtype=np.float64)
    order, ranked = _ranked(probs)
    if method == "lac":
        return order, 1.0 - ranked
    ranks = np.arange(1, probs.shape[1] + 1)  # (C,)
    scores = np.cumsum(ranked, axis=1) - u[:, None] * ranked  # (N, C)
    if method == "raps":
        scores = scores + penalty * np.maximum(ranks - k_reg, 0)
    return order, scores


def label_scores(
    probs: np.ndarray, labels: np.ndarray, method: str, u: np.ndarray, penalty: float, k_reg: int
) -> np.ndarray:
    """``s(x_i, y_i)`` of every calibration row (N,)."""
    order, scores = rank_scores(probs, method, u, penalty, k_reg)
    rank = np.argmax(order == np.asarray(labels)[:, None], axis=1)  # (N,) 0-based
    return scores[np.arange(len(rank)), rank]


def threshold(scores: np.ndarray, alpha: float) -> float:
    """The ``ceil((n + 1)(1 - alpha))``-th smallest score; ``inf`` when n is too small."""
    n = len(scores)
    k = math.ceil((n + 1) * (1 - alpha) - 1e-12)
    return float("inf") if k > n else float(np.sort(scores)[k - 1])


def prediction_sets(
    probs: np.ndarray,
    q: float,
    method: str,
    u: np.ndarray,
    penalty: float,
    k_reg: int,
    allow_zero_sets: bool = True,
) -> np.ndarray:
    """Membership (N, C): ``True`` where class ``c`` is in row ``n``'s set; without
    ``allow_zero_sets`` the top class is in every set (a superset: coverage only rises)."""
    order, scores = rank_scores(probs, method, u, penalty, k_reg)
    kept = scores <= q  # (N, C) by rank
    if not allow_zero_sets:
        kept[:, 0] = True
    member = np.zeros(order.shape, dtype=bool)
    np.put_along_axis(member, order, kept, axis=1)
    return member


def uniforms(rows: np.ndarray, seed: int, name: str) -> np.ndarray:
    """One uniform draw per row (N,), fixed by the seed, the set's name and the row's index,
    so that every head of a pipeline sees the same draws for the same samples."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    width = int(np.max(rows, initial=-1)) + 1
    return rng.random(width)[np.asarray(rows, dtype=np.int64)]
