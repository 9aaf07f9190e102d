"""A report's results, summarised once: the step between reading the metrics files
(:func:`etn_cli.report.tables.read_metrics`, which checks them) and the views (tables, plots,
comparisons), which read the one :class:`Summary` and compute nothing over seeds again.

:func:`summarize` averages the OOD sets into ``<ID>-OOD`` and reports the mean and 95%
t-interval over seeds, as in the paper ("we report the mean along with 95% confidence
intervals").
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from etn_cli.report.style import Style, method_styles
from etn_cli.report.tables import COLUMN_TYPES, METHOD, RUNTIME, SEED_KEYS, SETTING, row_labels
from etn_cli.report.views import own_scores


@dataclass(frozen=True)
class Summary:
    """The checked metrics rows (one per seed), their summary over seeds (:func:`summarize`),
    the failed units' entries (:func:`etn_cli.stages.report.failed_entries`) and what every
    view reads of them, each worked out once, in :meth:`of`."""

    metrics: pl.DataFrame
    frame: pl.DataFrame  # mean, ci95, n_seeds, seeds, note per SEED_KEYS
    failed: Sequence[dict]
    labels: dict[tuple, str]  # row label per method key, in the tables' order (row_labels)
    own: dict[tuple, str]  # per method key, the OOD score of its headline columns
    styles: dict[str, Style]  # row label -> the method's colour and marker in every figure
    ood_set: str | None  # the figures' OOD set: <id>-OOD, else the first by name; None: none
    fitted_on: str | None  # the footnote's lines on the splits fitted on and any fallbacks
    shown: list[str]  # the labels of the methods with results

    @classmethod
    def of(
        cls, metrics: pl.DataFrame, failed: Sequence[dict] = (), frame: pl.DataFrame | None = None
    ) -> Summary:
        """The summary of ``metrics`` (or its part ``frame`` of them)."""
        frame = summarize(metrics) if frame is None else frame
        sets = frame.filter(pl.col("task") == "ood")["eval_set"].unique().to_list()
        average = f"{frame['id_dataset'][0]}-OOD"
        ood_set = average if average in sets else min(sets, default=None)
        notes = [note for note in (fit_splits_note(metrics), fallbacks_note(metrics)) if note]
        labels, own, styles = row_labels(frame), own_scores(frame), method_styles(frame)
        fitted_on, shown = "\n".join(notes) or None, frame["method_label"].unique().to_list()
        return cls(metrics, frame, failed, labels, own, styles, ood_set, fitted_on, shown)

    def parts(self) -> list[tuple[tuple[str, str], Summary]]:
        """One summary per (pipeline, backbone), each fit for one table."""
        parts = self.frame.partition_by(["pipeline", "backbone"], maintain_order=True, as_dict=True)
        return [((str(k[0]), str(k[1])), Summary.of(self.metrics, (), p)) for k, p in parts.items()]


def fit_splits_note(metrics: pl.DataFrame) -> str | None:
    """``Fitted on digits:train (760 rows): 17 methods; digits:adapt (190 rows): 15.``: which
    split the heads were fitted on (post-hoc scorers use ``[data] fit`` for ID statistics),
    from the ``fit_split`` column the metrics files record; None for files without it."""
    if "fit_split" not in metrics.columns:
        return None
    counts = (
        metrics.filter(pl.col("fit_split").is_not_null())
        .group_by("fit_split", maintain_order=True)
        .agg(pl.col("method_label").n_unique().alias("n"))
        .sort("n", descending=True, maintain_order=True)
    )
    parts = [f"{split}: {n} method{'s' * (n != 1)}" for split, n in counts.iter_rows()]
    return f"Fitted on {'; '.join(parts)}." if parts else None


def fallbacks_note(metrics: pl.DataFrame) -> str | None:
    """``Fell back to a rule (no finite adaptation-NLL optimum): Temperature scaling (T by
    Laplace's rule).``: the methods whose fitted temperature is a fallback rule's rather than
    the NLL's minimiser (:mod:`etn_cli.heads.calibration`), from the ``fit_fallback`` column;
    None when there are none or the files predate it."""
    if "fit_fallback" not in metrics.columns:
        return None
    fell = (
        metrics.filter(pl.col("fit_fallback").is_not_null())
        .select("method_label", "fit_fallback")
        .unique(maintain_order=True)
        .group_by("method_label", maintain_order=True)
        .agg(pl.col("fit_fallback").unique(maintain_order=True))
    )
    parts = [f"{label} ({'; '.join(rules)})" for label, rules in fell.iter_rows()]
    if not parts:
        return None
    line = f"Fell back to a rule (no finite adaptation-NLL optimum): {', '.join(parts)}."
    return textwrap.fill(line, width=80, break_long_words=False, break_on_hyphens=False)


def _ood_average(df: pl.DataFrame) -> pl.DataFrame:
    """Per seed, the mean over 2+ OOD eval sets as eval set ``<id_dataset>-OOD`` (task "ood"),
    and the mean over each group of OOD sets (``[data.groups]``) as ``<group>-OOD``, as
    OpenOOD's leaderboard averages near- and far-OOD."""
    keys = [*SETTING, *METHOD, "seed", "metric", "score"]
    average_name = pl.col("id_dataset") + "-OOD"
    ood = df.filter((pl.col("task") == "ood") & (pl.col("eval_set") != average_name))
    averaged = ood.group_by(keys, maintain_order=True).agg(
        pl.col("value").mean(), pl.col("eval_set").n_unique().alias("n_sets")
    )
    grouped = (
        ood.filter(pl.col("ood_group").is_not_null())
        .group_by([*keys, "ood_group"], maintain_order=True)
        .agg(pl.col("value").mean())
    )
    return pl.concat(
        [
            _as_eval_set(averaged.filter(pl.col("n_sets") >= 2), average_name),
            _as_eval_set(grouped, pl.col("ood_group") + "-OOD"),
        ]
    )


def _as_eval_set(frame: pl.DataFrame, name: pl.Expr) -> pl.DataFrame:
    """Averaged OOD rows in the long layout, under the eval-set name ``name``."""
    return frame.select(
        *SETTING,
        name.alias("eval_set"),
        pl.lit("ood").alias("task"),
        *METHOD,
        pl.lit(None, pl.String).alias("ood_group"),
        "seed",
        "metric",
        "score",
        "value",
        pl.lit(None, pl.String).alias("note"),
    )


def runtime_rows(df: pl.DataFrame) -> pl.DataFrame:
    """Per head and seed, the inference time of one sample in ms, as metric ``runtime_ms``.

    ``backbone_passes * backbone_s_per_sample`` (the backbone's forward time measured at
    extraction, times the passes the method needs: 2 for ODIN's perturbation) plus the head's
    own ``inference_s_per_sample``; files without the backbone columns count the head only.
    """
    if "inference_s_per_sample" not in df.columns:
        return pl.DataFrame(schema=COLUMN_TYPES)
    backbone = (
        pl.col("backbone_passes").fill_null(1) * pl.col("backbone_s_per_sample").fill_null(0.0)
        if {"backbone_passes", "backbone_s_per_sample"} <= set(df.columns)
        else pl.lit(0.0)
    )
    per_head = df.group_by([*SETTING, *METHOD, "seed"], maintain_order=True).agg(
        ((pl.col("inference_s_per_sample") + backbone) * 1000).first().alias("value")
    )
    return per_head.select(
        *SETTING,
        pl.col("id_dataset").alias("eval_set"),
        pl.lit("id").alias("task"),
        *METHOD,
        pl.lit(None, pl.String).alias("ood_group"),
        "seed",
        pl.lit(RUNTIME).alias("metric"),
        pl.lit(None, pl.String).alias("score"),
        "value",
        pl.lit(None, pl.String).alias("note"),
    )


def t_quantile(dof: np.ndarray) -> np.ndarray:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom (scipy.special on use:
    importing scipy.stats would cost a rerun half a second)."""
    from scipy.special import stdtrit

    return stdtrit(dof, 0.975)


def summarize(df: pl.DataFrame) -> pl.DataFrame:
    """Mean, 95% CI half-width and seed count per setting, eval set, method, metric and score.

    ``ci95 = t_{0.975, n-1} * std(ddof=1) / sqrt(n)`` over the n seeds with a value (0 when
    n == 1, null when n == 0). Null values are left out; a group of only nulls has a null mean
    and keeps the first note saying why.
    """
    long = df.select(pl.col(name).cast(dtype) for name, dtype in COLUMN_TYPES.items())
    runtime = runtime_rows(df).select(pl.col(n).cast(t) for n, t in COLUMN_TYPES.items())
    long = pl.concat([long, _ood_average(long), runtime], how="vertical_relaxed")
    summary = long.group_by(SEED_KEYS, maintain_order=True).agg(
        pl.col("value").mean().alias("mean"),
        pl.col("value").std(ddof=1).alias("std"),
        pl.col("value").count().alias("n_seeds"),
        pl.col("seed").filter(pl.col("value").is_not_null()).unique().sort().alias("seeds"),
        pl.col("note").drop_nulls().first().alias("note"),
    )
    n = summary["n_seeds"].to_numpy().astype(np.float64)  # (G,)
    std = summary["std"].fill_null(0.0).to_numpy()  # (G,)
    with np.errstate(invalid="ignore", divide="ignore"):
        ci = np.where(n > 1, t_quantile(n - 1) * std / np.sqrt(n), 0.0)  # (G,)
    ci95 = pl.Series("ci95", ci).set(pl.Series(n == 0), None)
    return summary.with_columns(ci95).select(*SEED_KEYS, "mean", "ci95", "n_seeds", "seeds", "note")
