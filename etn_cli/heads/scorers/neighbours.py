"""Exact k-nearest-neighbour search by blocked matrix products: the largest inner products of
each query row with a bank, never holding more than a (QUERY_ROWS, BANK_ROWS) block.

Measured against faiss-cpu's exact ``IndexFlatIP`` on this project's 2-core machine
(``benchmarks/bench_heads.py --shape imagenet``, KNN at 128,000 x 2,048): see
``benchmarks/README.md``; both spend their time in the same float32 matrix product.
"""

from __future__ import annotations

import torch

QUERY_ROWS = 4096
BANK_ROWS = 16384
NORM_EPS = 1e-10  # the KNN authors' normaliser: x / (||x|| + 1e-10)


def normalise(h: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit length, ``h / (||h||_2 + 1e-10)`` (N, D)."""
    return h / (h.norm(dim=1, keepdim=True) + NORM_EPS)


def top_inner_products(queries: torch.Tensor, bank: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest values of ``queries @ bank.T`` per row, descending (N, k)."""
    out = []
    for start in range(0, len(queries), QUERY_ROWS):
        q = queries[start : start + QUERY_ROWS]
        best = q.new_full((len(q), 0), float("-inf"))
        for b in range(0, len(bank), BANK_ROWS):
            block = q @ bank[b : b + BANK_ROWS].T  # (rows, BANK_ROWS)
            block = block.topk(min(k, block.shape[1]), dim=1).values
            merged = torch.cat([best, block], dim=1)
            best = merged.topk(min(k, merged.shape[1]), dim=1).values
        out.append(best)
    return torch.cat(out)


def kth_squared_distance(queries: torch.Tensor, bank: torch.Tensor, k: int) -> torch.Tensor:
    """Squared Euclidean distance of each unit-length query to its ``k``-th nearest row of
    the unit-length ``bank`` (N,): ``2 - 2 s_k`` with ``s_k`` the k-th largest inner product,
    which is exact up to the ``1e-10`` of the normaliser (zero rows stay zero)."""
    s_k = top_inner_products(queries, bank, k)[:, -1]
    q_norm = queries.pow(2).sum(1)
    return (q_norm + 1.0 - 2.0 * s_k).clamp_min(0.0)
