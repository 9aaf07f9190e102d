"""How long do the paired bootstrap's ranking metrics take (``etn report --compare``)?

Method: every ranking metric (AUROC, the three AUPRs, both FPR95s) of one score on an ID and
an OOD set, for 1,000 bootstrap replicates plus the full data, the way
:mod:`etn_cli.report.bootstrap` asks for them: :func:`etn_cli.metrics.weighted.weighted_ranking`
with its blocks of replicates, the same with every replicate in one block, and the reference,
the plain bootstrap, :func:`etn_cli.metrics.ranking.ranking_values` on each resampled set of
rows (timed on 50 replicates and scaled to 1,001). Best of ``--repeats``; the same rows and
draws for each. The digits default has about 1,100 rows per ID + OOD pair (``--rows``), with
scores on a 0.001 grid, so there are ties.

    python benchmarks/bench_paired.py [--rows 1100] [--replicates 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
from unittest import mock

import numpy as np

from etn_cli.metrics import weighted
from etn_cli.metrics.ranking import ranking_values

try:  # run as a script: benchmarks/ is on sys.path
    from bench_store import best_seconds
except ImportError:  # imported as benchmarks.bench_paired
    from benchmarks.bench_store import best_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1100)
    parser.add_argument("--replicates", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.rows
    labels = (np.arange(n) < n // 2).astype(np.float64)
    scores = np.round(rng.normal(size=n) + labels, 3)
    draws = rng.multinomial(n, np.full(n, 1 / n), size=args.replicates)
    weights = np.vstack([np.ones(n), draws]).astype(np.float64)  # (B + 1, N)

    def blocked():
        return weighted.weighted_ranking(labels, scores, weights)

    def one_block():
        with mock.patch.object(weighted, "BLOCK_CELLS", weights.size):
            return weighted.weighted_ranking(labels, scores, weights)

    sample = 50

    def plain():
        for b in range(sample):
            rows = np.repeat(np.arange(n), weights[b].astype(np.int64))
            ranking_values(labels[rows], scores[rows])

    first, second = blocked(), one_block()
    assert all(np.allclose(first[k], second[k], equal_nan=True) for k in first)
    reference = best_seconds(plain, args.repeats) * len(weights) / sample
    print(f"{len(weights)} replicates x {n} rows, best of {args.repeats}")
    print(f"{'way':<48}{'seconds':>9}{'x plain':>10}")
    for name, fn in (("weighted_ranking (blocks of replicates)", blocked),
                     ("weighted_ranking (one block)", one_block)):  # fmt: skip
        seconds = best_seconds(fn, args.repeats)
        print(f"{name:<48}{seconds:>9.4f}{seconds / reference:>10.3f}")
    print(f"{'plain bootstrap (ranking_values per replicate)':<48}{reference:>9.4f}{1.0:>10.3f}")


if __name__ == "__main__":
    main()
