"""Reliability diagrams, one panel per head (Guo et al. 2017, Fig. 1): for each of the 15
confidence bins of ECE, the accuracy of the ID test predictions in it against their mean
confidence, pooled over seeds (weighted by the number of predictions per bin).

A perfectly calibrated head has its curve on the diagonal; points below it are over-confident,
points above under-confident. Grey bars show where the predictions fall (the share per bin),
so a wild point from a bin of two predictions reads as such (marker area grows with the count
too). Each panel names the head's ECE (mean over seeds, as the tables show it). Drawn from the
``bin_*`` rows of the metrics files (:mod:`etn_cli.metrics.reliability`) into
``reliability.png`` and ``reliability.pdf``.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import polars as pl

from etn_cli.metrics.evaluation import ECE_BINS
from etn_cli.metrics.reliability import RELIABILITY_METRICS, bin_name
from etn_cli.report.tables import row_labels

ACCURACY_COLOUR, SHARE_COLOUR = "#0072B2", "#BBBBBB"  # Okabe & Ito blue; grey
COLUMNS = 5


def pooled_bins(df: pl.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per method label: count (B,), mean confidence (B,) and accuracy (B,) over all seeds
    (NaN in bins no seed filled)."""
    rows = df.filter(pl.col("metric").is_in(RELIABILITY_METRICS) & (pl.col("task") == "id"))
    if rows.is_empty():
        return {}
    wide = rows.pivot(
        on="metric",
        index=["method_label", "seed", "score"],
        values="value",
        aggregate_function="first",
    ).with_columns(pl.col("bin_confidence", "bin_accuracy").fill_null(0.0))
    pooled = wide.group_by("method_label", "score").agg(
        pl.col("bin_count").sum().alias("n"),
        (pl.col("bin_count") * pl.col("bin_confidence")).sum().alias("conf"),
        (pl.col("bin_count") * pl.col("bin_accuracy")).sum().alias("right"),
    )
    order = {bin_name(b): b for b in range(ECE_BINS)}
    result = {}
    for (label,), part in pooled.group_by("method_label", maintain_order=True):
        n, conf, right = np.zeros(ECE_BINS), np.zeros(ECE_BINS), np.zeros(ECE_BINS)
        for score, count, c, r in part.select("score", "n", "conf", "right").iter_rows():
            n[order[score]], conf[order[score]], right[order[score]] = count, c, r
        with np.errstate(invalid="ignore", divide="ignore"):
            result[label] = (n, conf / n, right / n)
    return result


def reliability_plot(df: pl.DataFrame, folder: Path) -> list[Path]:
    """Draw one reliability panel per head into ``folder``; returns the paths (none when the
    metrics carry no bins, e.g. files written by an older etn)."""
    from etn_cli.report.plots import _save

    bins = pooled_bins(df)
    if not bins:
        return []
    labels = [label for label in _ordered_labels(df) if label in bins]
    ece = _mean_ece(df)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = math.ceil(len(labels) / COLUMNS)
    cols = min(COLUMNS, len(labels))
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.3 * cols, 2.35 * rows), sharex=True, sharey=True,
        layout="constrained", squeeze=False,
    )  # fmt: skip
    for ax, label in zip(axes.flat, labels, strict=False):
        _panel(ax, label, *bins[label], ece.get(label))
    for ax in list(axes.flat)[len(labels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("confidence (max probability)")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy; share")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=3, frameon=False, fontsize=8)
    fig.suptitle("Reliability on the ID test set (15 bins, seeds pooled)")
    return _save(fig, folder, "reliability")


def _panel(ax, label, n, confidence, accuracy, ece) -> None:  # noqa: ANN001
    """Grey bars: the share of predictions per bin; blue: accuracy at each bin's mean
    confidence (marker area grows with the bin's count); dashed: perfect calibration."""
    edges = np.linspace(0, 1, ECE_BINS + 1)
    filled = n > 0
    ax.bar(
        edges[:-1], n / n.sum(), width=1 / ECE_BINS, align="edge", color=SHARE_COLOUR,
        edgecolor="white", linewidth=0.5, label="share of predictions",
    )  # fmt: skip
    ax.plot([0, 1], [0, 1], linestyle="--", color="#555555", linewidth=1, label="perfect")
    ax.plot(
        confidence[filled], accuracy[filled], color=ACCURACY_COLOUR, linewidth=1.2,
        label="accuracy at mean confidence", zorder=3,
    )  # fmt: skip
    sizes = 6 + 60 * np.sqrt(n[filled] / n.max())
    ax.scatter(confidence[filled], accuracy[filled], s=sizes, color=ACCURACY_COLOUR, zorder=4)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_aspect("equal")
    title = textwrap.fill(label, 30, break_on_hyphens=False)  # a sweep point's label in full
    ax.set_title(title + ("" if ece is None else f"\nECE {100 * ece:.1f}%"), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25)


def _ordered_labels(df: pl.DataFrame) -> list[str]:
    """Method labels in the tables' order (by family, then first appearance)."""
    return list(dict.fromkeys(key[1] for key in row_labels(df)))


def _mean_ece(df: pl.DataFrame) -> dict[str, float]:
    ece = df.filter((pl.col("metric") == "ece") & (pl.col("task") == "id"))
    means = ece.group_by("method_label").agg(pl.col("value").mean())
    return {label: value for label, value in means.iter_rows() if value is not None}
