"""Paper Figure 1, readable at 35 methods: OOD detection quality against ID accuracy, and
against inference time where timings tell methods apart (``frontier-<metric>.png`` / ``.pdf``).

* **One marker per distinct result.** Methods with the same accuracy and the same quality (a
  head and its temperature-scaled twin, post-hoc scorers that rank like the softmax) are one
  marker, named together. Nothing is moved sideways: a shared accuracy is a shared x.
* **One score per method, not chosen on the test set.** Each method is drawn with the score of
  the summary table's headline columns: its own OOD score when it has exactly one (``md``,
  ``energy``, ``knn``, ...), else max probability (:func:`etn_cli.report.views.own_scores`).
  The adaptation split holds no OOD samples, so it cannot rank OOD scores; a rule fixed in
  advance is the choice that never looks at test results.
* **Labels only on the Pareto front** (no method is both more accurate and better at detecting
  OOD), colour and shape by family; every other value is in the tables.
* **Runtime** (backbone passes plus head, per sample; bars from the fastest to the slowest of
  every timed repeat and seed) only when some two methods' ranges do not overlap: otherwise the
  differences are timing noise and the panel is left out with a note saying so.
* When every method has the same accuracy (an ablation of ETN, which keeps the argmax), the
  accuracy axis says nothing: the figure becomes a ranked dot plot with 95% intervals.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from etn_cli.report.tables import FAMILY_ORDER, METHOD, row_labels, summarize

FAMILY_STYLES = {  # Okabe & Ito's colour-blind-safe colours, one shape per family
    "evidential": {"color": "#0072B2", "marker": "o"},
    "bayesian": {"color": "#E69F00", "marker": "^"},
    "deterministic": {"color": "#009E73", "marker": "s"},
    "posthoc": {"color": "#CC79A7", "marker": "D"},
    "other": {"color": "#555555", "marker": "X"},
}
SAME = 6  # decimals (in %) at which two results count as one
LABEL_SIZE = 7.5


@dataclass
class Result:
    """One distinct result: the methods that share it, its accuracy, quality and runtime."""

    names: list[str]
    family: str
    acc: float  # %
    quality: float  # %
    ci: float  # half-width of the 95% interval over seeds, %
    runtime: tuple[float, float, float] | None = None  # median, fastest, slowest (ms)

    @property
    def label(self) -> str:
        return ", ".join(self.names)


def frontier_plot(df: pl.DataFrame, folder: Path, metric: str = "aupr") -> list[Path]:
    """Draw ``frontier-<metric>`` from the metrics ``df`` into ``folder`` (see the module
    docstring); returns the written paths, none when the metrics hold no OOD results."""
    from etn_cli.report.plots import save_figure

    summary = summarize(df)
    results, ood_set = distinct_results(df, summary, metric)
    if not results:
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    lower_better = metric.startswith("fpr")
    timed = [r for r in results if r.runtime is not None]
    show_runtime = runtimes_differ(timed)
    same_accuracy = len({round(r.acc, SAME) for r in results}) == 1
    panels = 1 + show_runtime
    height = max(4.2, 0.28 * len(results) + 1.2) if same_accuracy else 4.6
    width = 6.2 * panels - (1.8 if same_accuracy and show_runtime else 0)
    fig, axes = plt.subplots(1, panels, figsize=(width, height), squeeze=False)
    axes = axes[0]
    better = "lower is better" if lower_better else "higher is better"
    quality_label = f"OOD {metric.upper()} (%), {ood_set}, {better}"
    notes = [
        "One marker per distinct result (methods sharing one are named together); labels on "
        "the Pareto front; score: the method's own OOD score, else MP."
    ]
    if same_accuracy:
        ordered = _ranked(axes[0], results, quality_label, lower_better)
        notes = [f"Every method has ID accuracy {results[0].acc:.2f}%: ranked by quality."]
        if show_runtime:
            _ranked_runtime(axes[1], ordered)
    else:
        _scatter(axes[0], results, "acc", "ID accuracy (%)", lower_better)
        axes[0].set_ylabel(quality_label)
        if show_runtime:
            _scatter(axes[1], timed, "runtime", "inference time per sample (ms)", lower_better)
            axes[1].sharey(axes[0])
    if not show_runtime and len(timed) >= 2:
        notes.append(
            "Runtime panel left out: every method's timings (backbone + head, all repeats and "
            "seeds) overlap, so their differences are noise."
        )
    _legend(fig, results)
    fig.suptitle(f"OOD detection ({metric.upper()}) against accuracy" + (
        " and inference time" if show_runtime and not same_accuracy else ""
    ))  # fmt: skip
    fig.text(0.01, 0.005, "\n".join(textwrap.fill(n, 130) for n in notes), fontsize=8)
    left = 0.09 if not same_accuracy else 0.3 / panels
    fig.subplots_adjust(
        left=left, right=0.84, bottom=0.2, top=0.9, wspace=0.08 if same_accuracy else 0.2
    )
    return save_figure(fig, folder, f"frontier-{metric}")


def distinct_results(
    df: pl.DataFrame, summary: pl.DataFrame, metric: str
) -> tuple[list[Result], str]:
    """The distinct (accuracy, quality) results of the methods, in table order, and the OOD
    eval set they are measured on (``<id>-OOD``, or the single OOD set)."""
    from etn_cli.report.views import own_scores

    ood = summary.filter(pl.col("task") == "ood")
    if ood.is_empty():
        return [], ""
    id_dataset = summary["id_dataset"][0]
    sets = ood["eval_set"].unique().to_list()
    ood_set = f"{id_dataset}-OOD" if f"{id_dataset}-OOD" in sets else sorted(sets)[0]
    own = own_scores(summary)
    cells = {
        (tuple(r[c] for c in METHOD), r["metric"], r["score"]): r
        for r in summary.filter(
            ((pl.col("eval_set") == ood_set) & (pl.col("metric") == metric))
            | ((pl.col("task") == "id") & (pl.col("metric") == "acc"))
        ).iter_rows(named=True)
    }
    times = runtime_ranges(df)
    groups: dict[tuple, Result] = {}
    for key, name in row_labels(summary).items():
        acc = cells.get((key, "acc", None))
        quality = cells.get((key, metric, own.get(key, "mp")))
        if acc is None or quality is None or acc["mean"] is None or quality["mean"] is None:
            continue
        point = (round(100 * acc["mean"], SAME), round(100 * quality["mean"], SAME))
        if point in groups:
            groups[point].names.append(name)
            continue
        family = key[3] or "other"
        ci = 100 * (quality["ci95"] or 0.0)
        groups[point] = Result([name], family, *point, ci, times.get(key))
    return list(groups.values()), ood_set


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


def runtimes_differ(results: list[Result]) -> bool:
    """Whether some two results' timing ranges (fastest..slowest) do not overlap."""
    if len(results) < 2:
        return False
    slowest_fast = max(r.runtime[1] for r in results)  # type: ignore[index]
    fastest_slow = min(r.runtime[2] for r in results)  # type: ignore[index]
    return slowest_fast > fastest_slow


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point dominates (higher is better on both axes): no
    ``j`` with ``x_j >= x_i`` and ``y_j >= y_i``, one of them strictly."""
    front = []
    for i in range(len(x)):
        dominated = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        if not dominated.any():
            front.append(i)
    return np.asarray(front, dtype=np.int64)


def _scatter(ax, results: list[Result], column: str, xlabel: str, lower_better: bool) -> None:
    """One marker per result, its 95% interval over seeds as a vertical bar (and for runtime
    the fastest..slowest timing as a horizontal one), Pareto-front results labelled."""
    x = np.array([r.acc if column == "acc" else r.runtime[0] for r in results])  # type: ignore[index]
    xerr = None
    if column == "runtime":  # from the fastest to the slowest timing
        xerr = np.array([[m - fast, slow - m] for m, fast, slow in (r.runtime for r in results)]).T
    y = np.array([r.quality for r in results])
    for i, result in enumerate(results):
        style = FAMILY_STYLES.get(result.family, FAMILY_STYLES["other"])
        ax.errorbar(
            x[i], y[i], yerr=result.ci or None,
            xerr=None if xerr is None else xerr[:, i : i + 1],
            fmt=style["marker"], color=style["color"], markersize=6.5, elinewidth=0.8,
            markeredgecolor="white", markeredgewidth=0.6, alpha=0.9, zorder=3,
        )  # fmt: skip
    sign_x = -1.0 if column == "runtime" else 1.0  # faster is better
    sign_y = -1.0 if lower_better else 1.0
    front = pareto_front(sign_x * x, sign_y * y)
    if column == "runtime" and x.max() / x.min() > 10:
        ax.set_xscale("log")
    if column == "acc":
        middle, half = (x.min() + x.max()) / 2, max(float(np.ptp(x)), 0.5) / 2
        ax.set_xlim(middle - 1.25 * half, middle + 1.25 * half)
    span = float(np.ptp(y)) or 1.0
    ax.set_ylim(y.min() - 0.08 * span - 0.5, y.max() + 0.08 * span + 0.5)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    _label(ax, [(x[i], y[i], results[i].label) for i in front])


def _label(ax, points: list[tuple[float, float, str]]) -> None:
    """Name each point beside it; labels that would overlap are pushed apart vertically (in
    display space) and joined to their point by a thin line."""
    if not points:
        return
    fig = ax.figure
    fig.canvas.draw()  # the axes' final place, for display coordinates
    to_display = ax.transData.transform
    box = ax.get_window_extent()
    line = LABEL_SIZE * 1.25 * fig.dpi / 72  # pixels per line of label text
    placed: list[tuple[float, float, float, str, int]] = []  # point (x, y), label y, text
    for x, y, text in sorted(points, key=lambda p: -to_display((p[0], p[1]))[1]):
        px, py = to_display((x, y))
        right = px < box.x0 + 0.62 * box.width
        wrapped = textwrap.fill(text, 38)
        lines = wrapped.count("\n") + 1
        ly = py
        for _, _, other_y, _, other_lines in placed:
            if abs(ly - other_y) < line * (lines + other_lines) / 2 + 2:
                ly = other_y - line * (lines + other_lines) / 2 - 2
        placed.append((px, py, ly, wrapped, lines))
        offset = (8 if right else -8, (ly - py) * 72 / fig.dpi)
        ax.annotate(
            wrapped, (x, y), xytext=offset, textcoords="offset points", fontsize=LABEL_SIZE,
            ha="left" if right else "right", va="center", zorder=4,
            arrowprops={"arrowstyle": "-", "color": "#777777", "linewidth": 0.5}
            if abs(ly - py) > 3 else None,
        )  # fmt: skip


def _ranked(ax, results: list[Result], xlabel: str, lower_better: bool) -> list[Result]:
    """A dot plot, best first from the top: each result's quality with its 95% interval;
    returns the results in their order from the top."""
    ordered = sorted(results, key=lambda r: r.quality, reverse=not lower_better)
    y = np.arange(len(ordered))[::-1]
    for yi, result in zip(y, ordered, strict=True):
        style = FAMILY_STYLES.get(result.family, FAMILY_STYLES["other"])
        ax.errorbar(
            result.quality, yi, xerr=result.ci or None, fmt=style["marker"],
            color=style["color"], markersize=6, elinewidth=1, capsize=2,
        )  # fmt: skip
    ax.set_yticks(y, [textwrap.shorten(r.label, 60) for r in ordered], fontsize=8)
    ax.set_ylim(-0.5, len(y) - 0.5)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3, axis="x")
    return ordered


def _ranked_runtime(ax, ordered: list[Result]) -> None:
    """Beside the ranked dot plot, on the same rows: each result's median time per sample,
    the bar from its fastest to its slowest timing."""
    y = np.arange(len(ordered))[::-1]
    for yi, result in zip(y, ordered, strict=True):
        if result.runtime is None:
            continue
        median, fast, slow = result.runtime
        style = FAMILY_STYLES.get(result.family, FAMILY_STYLES["other"])
        ax.errorbar(
            median, yi, xerr=[[median - fast], [slow - median]], fmt=style["marker"],
            color=style["color"], markersize=6, elinewidth=1, capsize=2,
        )  # fmt: skip
    ax.set_yticks(y, [""] * len(y))
    ax.set_ylim(-0.5, len(y) - 0.5)
    times = [t for r in ordered if r.runtime for t in r.runtime]
    if times and max(times) / min(times) > 10:
        ax.set_xscale("log")
    ax.set_xlabel("inference time per sample (ms; bar: fastest..slowest repeat)")
    ax.grid(alpha=0.3, axis="x")


def _legend(fig, results: list[Result]) -> None:
    from matplotlib.lines import Line2D

    present = [f for f in FAMILY_ORDER if any(r.family == f for r in results)]
    handles = [Line2D([], [], linestyle="none", markersize=7, **FAMILY_STYLES[f]) for f in present]
    fig.legend(handles, present, loc="upper right", fontsize=8, frameon=False, title="family")
