"""Paired comparisons against a reference method (``etn report --compare ETN``).

Every method is scored on the same test rows as the reference, so the question "is A better
than B?" is answered on paired data: for each metric, score and eval set, the difference
``method - reference`` of the table's value, with a 95% percentile bootstrap interval.

* **Within a seed**, the bootstrap resamples the test rows: each replicate draws the ID test
  set's rows with replacement (and, for OOD metrics, each OOD set's rows, separately, so every
  replicate keeps the sets' sizes) and computes both methods' metric on the very same draw.
  Every method and seed sees the same draws, so the difference is paired.
* **Seeds combined**: the difference of the means over seeds, which is the difference of the
  table's two cells. Its replicates draw the test rows as above (the same draw for every seed:
  the seeds share one test set) and, where there are two seeds or more, also the seeds, with
  replacement, so the interval covers both the test set's sampling and the training seeds'
  spread. A seed-free method (MAP, a post-hoc scorer: one fit) is paired with every seed of the
  other; two seeded methods are paired seed by seed.
* A difference is **significant** when its interval excludes zero.

Pairs of scores are those the table sets side by side: the summary's AUROC and FPR95
(``headline``) pair each method's headline OOD score (its own, else MP) with the reference's;
everywhere else (``same``) a score meets the same score, and a method's own score the
reference's own score.
The metrics are recomputed from the per-row predictions under shared resamples
(:mod:`etn_cli.report.bootstrap`); at full weights they are the metrics files' values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from etn_cli import progress
from etn_cli.report.bootstrap import COMPARED, Predictions, Resamples
from etn_cli.report.tables import METHOD, SEED_KEYS, STANDARD_SCORES

PAIRINGS = ("headline", "same")


def find_reference(summary: pl.DataFrame, name: str) -> tuple:
    """The method key ``--compare NAME`` names: a report label (any case), else a head name
    with one label; otherwise a usage error listing the labels."""
    from etn_cli.errors import UsageError, suggest

    keys = summary.select(METHOD).unique(maintain_order=True).rows()
    if len(keys) < 2:  # nothing to pair with: the views would be empty
        only = ", ".join(repr(key[1]) for key in keys) or "no method"
        raise UsageError(
            f"--compare needs two methods or more; this report holds {only} only. Drop "
            "--compare, or run more heads (without --only)."
        )
    by_label = {key[1].lower(): key for key in keys}
    if name.lower() in by_label:
        return by_label[name.lower()]
    heads = [key for key in keys if key[0] == name.lower()]
    if len(heads) == 1:
        return heads[0]
    if len(heads) > 1:
        named = ", ".join(repr(key[1]) for key in heads)
        raise UsageError(
            f"--compare {name!r} names {len(heads)} results ({named}). Pass one label."
        )
    close = suggest(name.lower(), by_label, cutoff=0.5)
    hint = f" Did you mean {by_label[close[0]][1]!r}?" if close else ""
    raise UsageError(
        f"Unknown method {name!r} for --compare.{hint} Choose a label of the report: "
        f"{', '.join(key[1] for key in keys)}."
    )


def compare(
    summary: pl.DataFrame,
    predictions: dict[tuple, dict[int, Predictions]],
    reference: tuple,
    pairing: str,
    draws: Resamples,
) -> pl.DataFrame:
    """One row per (method, eval set, metric, score) of ``summary`` that the reference can be
    paired with: the summary's key columns, ``mean`` (the difference, method - reference),
    ``lo``/``hi`` (its 95% interval), ``significant``, ``n_seeds``, ``seeds``, ``note``,
    ``reference``, ``reference_score`` and ``per_seed`` (the same per seed pair)."""
    from etn_cli.report.views import own_scores

    headline = own_scores(summary)
    cells = summary.filter(
        pl.col("metric").is_in(COMPARED) & pl.col("task").is_in(["id", "ood"])
        & pl.col("mean").is_not_null()
    )  # fmt: skip
    seeds_of = {
        (tuple(r[c] for c in METHOD), r["task"], r["eval_set"], r["metric"], r["score"]): r["seeds"]
        for r in cells.iter_rows(named=True)
    }
    records = []
    shown = progress.bar(cells.iter_rows(named=True), f"vs {reference[1]}", total=cells.height)
    for row in shown:
        key = tuple(row[c] for c in METHOD)
        if key == reference:
            continue
        theirs = _paired_score(row, key, reference, pairing, headline, seeds_of)
        if theirs is UNPAIRED:
            continue
        where = (row["task"], row["eval_set"], row["metric"])
        pairs = seed_pairs(row["seeds"], seeds_of[(reference, *where, theirs)])
        if not pairs:
            continue
        ours, refs = predictions.get(key, {}), predictions.get(reference, {})
        if not all(m in ours and r in refs for m, r in pairs):
            continue
        where_score = (row["task"], row["eval_set"], row["metric"], row["score"])
        if not all(ours[m].has(*where_score) for m, _ in pairs):
            continue
        diffs = np.stack(
            [
                ours[m].value(*where[:2], row["metric"], row["score"], draws)
                - refs[r].value(*where[:2], row["metric"], theirs, draws)
                for m, r in pairs
            ]
        )  # fmt: skip  (S, B + 1)
        records.append(_record(row, reference, theirs, pairs, diffs, draws))
    schema = {k: summary.schema[k] for k in SEED_KEYS} | RESULT_TYPES
    if not records:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(records, schema_overrides=schema, infer_schema_length=None)


RESULT_TYPES = {
    "mean": pl.Float64, "lo": pl.Float64, "hi": pl.Float64, "significant": pl.Boolean,
    "n_seeds": pl.UInt32, "seeds": pl.List(pl.Int64), "note": pl.String, "reference": pl.String,
    "reference_score": pl.String,
    "per_seed": pl.List(pl.Struct({"seed": pl.Int64, "reference_seed": pl.Int64,
                                   "difference": pl.Float64, "lo": pl.Float64, "hi": pl.Float64})),
}  # fmt: skip


UNPAIRED = "<unpaired>"  # no score of the reference faces this cell (None is a score: none)
HEADLINE_METRICS = ("auroc", "fpr95")  # the summary's columns that rank by the headline score


def _paired_score(row, key, reference, pairing, headline, seeds_of) -> str | None:
    """The reference's score that the table sets beside ``row``'s, or :data:`UNPAIRED`."""
    score, where = row["score"], (row["task"], row["eval_set"], row["metric"])
    if row["task"] == "ood" and row["metric"] in HEADLINE_METRICS and pairing == "headline":
        if score != headline.get(key, "mp"):
            return UNPAIRED
        theirs = headline.get(reference, "mp")
    elif score is None or score in STANDARD_SCORES:
        theirs = score
    else:  # a method's own score faces the reference's own score
        own = [s for (k, *w, s) in seeds_of if k == reference and tuple(w) == where]
        own = [s for s in own if s is not None and s not in STANDARD_SCORES]
        theirs = own[0] if len(own) == 1 else UNPAIRED
    return theirs if (reference, *where, theirs) in seeds_of else UNPAIRED


def seed_pairs(ours: list[int], theirs: list[int]) -> list[tuple[int, int]]:
    """(method seed, reference seed) pairs: a single seed (a seed-free method) meets each seed
    of the other; otherwise the seeds both have, seed by seed."""
    if len(ours) == 1 or len(theirs) == 1:
        return [(m, r) for m in ours for r in theirs]
    return [(s, s) for s in sorted(set(ours) & set(theirs))]


def interval(replicates: np.ndarray) -> tuple[float, float]:
    """The 95% percentile interval of the finite replicates."""
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(finite, [2.5, 97.5])
    return float(low), float(high)


def _record(row, reference, theirs, pairs, diffs, draws) -> dict[str, Any]:
    """The comparison row of one cell from its per-pair differences (S, B + 1)."""
    replicates = diffs[0, 1:]
    if len(pairs) >= 2:  # seeds drawn too
        picked = np.take_along_axis(diffs[:, 1:].T, draws.seeds(len(pairs)), axis=1)
        replicates = picked.mean(axis=1)
    low, high = interval(replicates)
    per_seed = []
    for (mine, ref), diff in zip(pairs, diffs, strict=True):
        lo, hi = interval(diff[1:])
        per_seed.append({"seed": mine, "reference_seed": ref, "difference": float(diff[0]),
                         "lo": lo, "hi": hi})  # fmt: skip
    return {
        **{k: row[k] for k in SEED_KEYS},
        "mean": float(diffs[:, 0].mean()),
        "lo": low,
        "hi": high,
        "significant": bool(low > 0 or high < 0),
        "n_seeds": len(pairs),
        "seeds": sorted({m for m, _ in pairs}),
        "note": None,
        "reference": reference[1],
        "reference_score": theirs,
        "per_seed": per_seed,
    }
