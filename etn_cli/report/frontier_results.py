"""The frontier's data (:mod:`etn_cli.report.frontier` says what the figure shows): the
distinct results of the methods, each with its names, look and runtimes, from the summary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from etn_cli.report.style import Style, family_style
from etn_cli.report.summary import Summary
from etn_cli.report.tables import METHOD

SAME = 6  # decimals (in %) at which two results count as one


@dataclass(frozen=True)
class Result:
    """One distinct result: the methods that share it, its accuracy, quality and runtime."""

    label: str  # the names of the methods sharing it, comma-separated
    look: Style  # its first method's (etn_cli.report.style), else its family's
    acc: float  # %
    quality: float  # %
    ci: float  # half-width of the 95% interval over seeds, %
    runtime: tuple[float, float, float] | None = None  # median, fastest, slowest (ms)


def distinct_results(summary: Summary, metric: str) -> list[Result]:
    """The distinct (accuracy, quality) results of the methods, in table order, on the OOD
    eval set of the figures (``<id>-OOD``, or the single OOD set)."""
    if summary.ood_set is None:
        return []
    cells = {
        (tuple(r[c] for c in METHOD), r["metric"], r["score"]): r
        for r in summary.frame.filter(
            ((pl.col("eval_set") == summary.ood_set) & (pl.col("metric") == metric))
            | ((pl.col("task") == "id") & (pl.col("metric") == "acc"))
        ).iter_rows(named=True)
    }
    groups: dict[tuple, list] = {}  # (acc, quality) -> names, the first's key and CI
    for key, name in summary.labels.items():
        acc = cells.get((key, "acc", None))
        quality = cells.get((key, metric, summary.own.get(key, "mp")))
        if acc is None or quality is None or acc["mean"] is None or quality["mean"] is None:
            continue
        point = (round(100 * acc["mean"], SAME), round(100 * quality["mean"], SAME))
        first = [[], key, 100 * (quality["ci95"] or 0.0)]
        groups.setdefault(point, first)[0].append(name)
    times = runtime_ranges(summary.metrics)
    return [
        Result(
            ", ".join(names),
            summary.styles.get(names[0]) or family_style(key[3] or "other"),
            *point,
            ci,
            times.get(key),
        )  # fmt: skip
        for point, (names, key, ci) in groups.items()
    ]


def runtime_ranges(df: pl.DataFrame) -> dict[tuple, tuple[float, float, float]]:
    """Per method key: the median, fastest and slowest time per sample in ms over every timed
    repeat and seed (backbone passes times the backbone's forward time, plus the head's)."""
    if "inference_s_per_sample" not in df.columns:
        return {}
    repeats = (
        pl.col("inference_s_repeats")
        if "inference_s_repeats" in df.columns
        else pl.concat_list(pl.col("inference_s_per_sample"))
    )
    backbone = pl.lit(0.0)
    if {"backbone_passes", "backbone_s_per_sample"} <= set(df.columns):
        backbone = pl.col("backbone_passes").fill_null(1) * pl.col(
            "backbone_s_per_sample"
        ).fill_null(0.0)
    per_seed = df.group_by([*METHOD, "seed"]).agg(
        repeats.first().alias("head"), backbone.first().alias("backbone")
    )
    out: dict[tuple, list[float]] = {}
    for row in per_seed.iter_rows(named=True):
        values = [1000 * (s + row["backbone"]) for s in (row["head"] or []) if s is not None]
        out.setdefault(tuple(row[c] for c in METHOD), []).extend(values)
    return {
        key: (float(np.median(v)), min(v), max(v)) for key, v in out.items() if v and min(v) > 0
    }
