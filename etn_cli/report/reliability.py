"""Reliability diagrams, one panel per head (Guo et al. 2017, Fig. 1): for each of the 15
confidence bins of ECE, the accuracy of the ID test predictions in it against their mean
confidence, pooled over seeds (weighted by the number of predictions per bin).

A perfectly calibrated head has its curve on the diagonal; points below it are over-confident,
points above under-confident. Grey bars show where the predictions fall (the share per bin),
so a wild point from a bin of two predictions reads as such: marker area grows with the count,
and a bin with fewer than :data:`SPARSE_BIN` predictions per seed is drawn hollow and left out
of the line. Heads whose bins are identical (the post-hoc scorers keep the softmax's
probabilities) share one panel, named in a footnote, drawn in the first head's colour and
marker as in every figure (:mod:`etn_cli.report.style`). Each panel names the head's ECE (mean
over seeds, as the tables show it) and carries its own tick labels. Drawn from the
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
from etn_cli.report.summary import Summary

SHARE_COLOUR, KEY_COLOUR = "#BBBBBB", "#555555"  # the bars; the legend's stand-in for a method
COLUMNS = 5
SPARSE_BIN = 10  # bins with fewer predictions per seed are drawn hollow and left unjoined


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


def reliability_plot(summary: Summary, folder: Path) -> list[Path]:
    """Draw one reliability panel per distinct set of pooled bins into ``folder``; returns the
    paths (none when the metrics carry no bins, e.g. files written by an older etn)."""
    from etn_cli.report.plots import save_figure

    bins = pooled_bins(summary.metrics)
    if not bins:
        return []
    ordered = dict.fromkeys(key[1] for key in summary.labels)  # by method_label, as pooled
    panels = shared_panels([label for label in ordered if label in bins], bins)
    ece, seeds = _mean_ece(summary.frame), _seed_counts(summary.metrics)
    styles = {key[1]: summary.styles[label] for key, label in summary.labels.items()}
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = math.ceil(len(panels) / COLUMNS)
    cols = min(COLUMNS, len(panels))
    panel = 2.4 if cols >= 4 else 3.1  # a few panels get room for their axis labels
    width = max(panel * cols, 6.4)  # room for the legend under one or two panels
    fig = plt.figure(
        figsize=(width, (panel + 0.1) * rows + 0.8 + 0.3 * (cols < 4)), layout="constrained"
    )
    grid = fig.add_gridspec(
        rows + 1, cols, height_ratios=[1.0] * rows + [0.18 if cols >= 4 else 0.34]
    )
    axes = [fig.add_subplot(grid[i // cols, i % cols]) for i in range(len(panels))]
    footnotes = []
    for i, (ax, labels) in enumerate(zip(axes, panels, strict=True)):
        first = labels[0]
        title = textwrap.fill(first, 30, break_on_hyphens=False)  # a sweep point's label in full
        if len(labels) > 1:
            mark = "*" * (len(footnotes) + 1)
            title += f"\n+ {len(labels) - 1} with the same probabilities{mark}"
            footnotes.append(f"{mark} {first}'s panel also stands for {', '.join(labels[1:])}.")
        _panel(ax, title, *bins[first], ece.get(first), seeds.get(first, 1), styles[first])
        if i + cols >= len(panels):  # the lowest panel of its column
            ax.set_xlabel("confidence (max probability)", fontsize=8)
        if i % cols == 0:
            ax.set_ylabel("accuracy; share", fontsize=8)
    key = fig.add_subplot(grid[rows, :])  # the legend and footnotes, under every panel
    key.axis("off")
    key.legend(
        handles=_legend_handles(), loc="upper center", ncols=4 if cols >= 4 else 2,
        frameon=False, fontsize=8,
    )  # fmt: skip
    if footnotes:
        notes = "\n".join(textwrap.fill(n, int(16 * width)) for n in footnotes)
        key.text(0.0, 0.0, notes, fontsize=7, va="top", transform=key.transAxes)
    title = (
        "Reliability on the ID test set (15 bins, seeds pooled; hollow, unjoined: bins with "
        f"fewer than {SPARSE_BIN} predictions per seed)"
    )
    fig.suptitle(textwrap.fill(title, int(15 * width)), fontsize=10)
    return save_figure(fig, folder, "reliability")


def _legend_handles() -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    dot = {"linestyle": "none", "marker": "o", "markersize": 6, "color": KEY_COLOUR}
    return [
        Line2D([], [], linestyle="--", color="#555555", label="perfect"),
        Line2D(
            [],
            [],
            linewidth=1.2,
            **dot | {"linestyle": "-"},
            label="accuracy at mean confidence (the method's colour and marker)",
        ),  # fmt: skip
        Line2D([], [], markerfacecolor="white", label=f"bin with < {SPARSE_BIN} per seed", **dot),
        Patch(color=SHARE_COLOUR, label="share of predictions"),
    ]


def shared_panels(labels: list[str], bins: dict[str, tuple]) -> list[list[str]]:
    """``labels`` grouped by identical pooled bins (count, confidence and accuracy per bin), in
    the given order: the post-hoc scorers that keep the softmax's probabilities share its
    panel instead of repeating it."""
    groups: dict[bytes, list[str]] = {}
    for label in labels:
        key = np.round(np.nan_to_num(np.stack(bins[label]), nan=-1.0), 9).tobytes()
        groups.setdefault(key, []).append(label)
    return list(groups.values())


def _panel(ax, title, n, confidence, accuracy, ece, seeds, style) -> None:
    """Grey bars: the share of predictions per bin; in the method's colour and marker:
    accuracy at each bin's mean confidence (marker area grows with the bin's count), the line
    joining only bins with at least :data:`SPARSE_BIN` predictions per seed, sparser bins
    hollow; dashed: perfect calibration."""
    edges = np.linspace(0, 1, ECE_BINS + 1)
    filled = n > 0
    dense = n / seeds >= SPARSE_BIN  # (B,)
    sparse = filled & ~dense
    ax.bar(
        edges[:-1], n / n.sum(), width=1 / ECE_BINS, align="edge", color=SHARE_COLOUR,
        edgecolor="white", linewidth=0.5,
    )  # fmt: skip
    ax.plot([0, 1], [0, 1], linestyle="--", color="#555555", linewidth=1)
    ax.plot(
        confidence[dense], accuracy[dense], color=style.color, linewidth=1.2,
        zorder=3,
    )  # fmt: skip
    sizes = 8 + 60 * np.sqrt(n / n.max())
    ax.scatter(
        confidence[dense], accuracy[dense], s=sizes[dense], color=style.color,
        marker=style.marker, zorder=4,
    )  # fmt: skip
    ax.scatter(
        confidence[sparse], accuracy[sparse], s=sizes[sparse], facecolors="white",
        edgecolors=style.color, marker=style.marker, linewidths=1, zorder=4,
    )  # fmt: skip
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_aspect("equal")
    ax.set_title(title + ("" if ece is None else f"\nECE {100 * ece:.1f}%"), fontsize=8)
    ax.tick_params(labelsize=7, labelbottom=True, labelleft=True)  # every panel reads alone
    ax.grid(alpha=0.25)


def _mean_ece(frame: pl.DataFrame) -> dict[str, float]:
    """Per method label, its mean ECE on the ID test set, from the summary ``frame``."""
    ece = frame.filter((pl.col("metric") == "ece") & (pl.col("task") == "id"))
    return {
        r["method_label"]: r["mean"] for r in ece.iter_rows(named=True) if r["mean"] is not None
    }


def _seed_counts(df: pl.DataFrame) -> dict[str, int]:
    """Per method label, the number of seeds its bins pool."""
    rows = df.filter(pl.col("metric") == "bin_count")
    counts = rows.group_by("method_label").agg(pl.col("seed").n_unique())
    return dict(counts.iter_rows())
