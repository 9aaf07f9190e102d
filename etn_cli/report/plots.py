"""The paper's figures from the metrics: the ablation plots of swept heads (AUPR against the
swept value, mean over seeds with the 95% confidence band shaded; paper Figures "Ablation
studies" and "Comparison across transformation dimensionalities") and Figure 1, uncertainty
quality against accuracy and against inference runtime (:func:`frontier_plot`).

Each metrics row of a swept head carries its point in the ``sweep`` column (JSON, e.g.
``{"prior_mode": 5}``). For every method and swept setting one figure is drawn with two panels:
ID confidence estimation (accuracy, MP, UM) and OOD detection (MP, MI, DE on the ``<ID>-OOD``
average, or on the single OOD set). Numeric settings become lines (log x-axis when the values
span more than a factor of 20); other values (``variant``) become points with error bars.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from etn_cli.report.tables import runtime_rows, summarize
from etn_cli.store.atomic import atomic_write_bytes

PLOT_FORMATS = ("png", "pdf")
ID_SERIES = (("acc", None, "ACC"), ("aupr", "mp", "MP"), ("aupr", "um", "UM"))
OOD_SERIES = (("aupr", "mp", "MP"), ("aupr", "mi", "MI"), ("aupr", "de", "DE"))
# A score keeps its colour and marker in every panel (Okabe & Ito's colour-blind-safe colours).
SERIES_STYLES = {
    "ACC": {"color": "#000000", "marker": "s"},
    "MP": {"color": "#0072B2", "marker": "o"},
    "UM": {"color": "#E69F00", "marker": "v"},
    "MI": {"color": "#009E73", "marker": "^"},
    "DE": {"color": "#D55E00", "marker": "D"},
}


def sweep_points(df: pl.DataFrame) -> pl.DataFrame:
    """One row per swept head label: method, label, variant and its parsed sweep point."""
    if "sweep" not in df.columns:
        return pl.DataFrame()
    rows = df.select("method", "method_label", "variant", "sweep").unique(maintain_order=True)
    rows = rows.filter(pl.col("sweep").is_not_null() & (pl.col("sweep") != "{}"))
    return rows


def sweep_plots(df: pl.DataFrame, folder: Path, metric: str = "aupr") -> list[Path]:
    """Draw every ablation figure of the metrics in ``df`` into ``folder`` as PNG and PDF.

    Returns the written paths (none when no head was swept).
    """
    points = sweep_points(df)
    if points.is_empty():
        return []
    summary = summarize(df)
    written: list[Path] = []
    for method in points["method"].unique(maintain_order=True).to_list():
        mine = points.filter(pl.col("method") == method)
        parsed = [json.loads(s) for s in mine["sweep"].to_list()]
        labels = mine["method_label"].to_list()
        for setting in dict.fromkeys(k for point in parsed for k in point):
            groups: dict[str, list[tuple[Any, str]]] = {}
            for label, point in zip(labels, parsed, strict=True):
                if setting in point:
                    rest = {k: v for k, v in point.items() if k != setting}
                    groups.setdefault(_describe(rest), []).append((point[setting], label))
            for rest, members in groups.items():
                if len(members) < 2:
                    continue
                figure = _figure(summary, method, setting, rest, members, metric)
                stem = _slug(f"sweep-{method}-{setting}" + (f"-{rest}" if rest else ""))
                written += _save(figure, folder, stem)
    return written


def _save(figure, folder: Path, stem: str) -> list[Path]:  # noqa: ANN001
    """Write ``figure`` as ``<stem>.png`` and ``<stem>.pdf`` atomically, then close it."""
    paths = []
    for fmt in PLOT_FORMATS:
        buffer = io.BytesIO()
        figure.savefig(buffer, format=fmt, bbox_inches="tight")
        atomic_write_bytes(folder / f"{stem}.{fmt}", buffer.getvalue())
        paths.append(folder / f"{stem}.{fmt}")
    _close(figure)
    return paths


# Okabe & Ito's colour-blind-safe palette (its yellow swapped for grey, which reads on white),
# crossed with markers of clearly different shapes (no circle-like hexagons or octagons, the
# triangles apart), so 35 methods stay apart in print and for colour-blind readers.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#999999", "#000000")
MARKERS = ("o", "^", "s", "X", "D", "v", "*", "P")
MARKER_AREA = {"*": 110, "X": 70, "P": 70}  # thin shapes drawn larger to weigh as much ink


def method_styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """A distinct (colour, marker) per label: colour cycles fastest and the marker moves on
    by one per method and one more per round of colours, so the methods sharing a colour
    (every 8th) get consecutive, clearly different shapes; no two of 64 share both."""
    return {
        label: {
            "color": PALETTE[i % len(PALETTE)],
            "marker": MARKERS[(i // len(PALETTE) + i) % len(MARKERS)],
        }
        for i, label in enumerate(labels)
    }


def spread(x: np.ndarray, y: np.ndarray, width: float, height: float) -> np.ndarray:
    """Sideways offsets (in x units) that keep points sharing an x value apart, beeswarm style:
    in order of ``y``, each point of a shared x takes the nearest free slot (0, +w, -w, +2w,
    ...), a slot being taken by a point of that x less than ``height`` away in y. Points with
    an x of their own stay where they are. Deterministic: the same data, the same plot."""
    offsets = np.zeros(len(x))
    for value in np.unique(x):
        members = np.flatnonzero(x == value)
        if len(members) < 2:
            continue
        placed: list[tuple[float, float]] = []  # (slot, y)
        for i in members[np.argsort(y[members], kind="stable")]:
            for k in range(len(members)):
                slot = (k + 1) // 2 * (1 if k % 2 else -1) * width
                if all(abs(slot - s) > width / 2 or abs(y[i] - v) >= height for s, v in placed):
                    break
            placed.append((slot, y[i]))
            offsets[i] = slot
    return offsets


def frontier_plot(df: pl.DataFrame, folder: Path, metric: str = "aupr") -> list[Path]:
    """Paper Figure 1: each method's OOD detection quality against its accuracy (left) and
    against its inference runtime per sample (right), as ``frontier-<metric>.png`` / ``.pdf``.

    Quality is the method's best OOD score (MP, MI, DE or its own) on the ``<ID>-OOD`` average
    (or the single OOD set), mean over seeds; runtime is the median over seeds of the measured
    time per sample (backbone passes plus head), on a log axis only when it spans a decade.
    Methods are told apart by colour and marker, named in a legend outside the axes.
    """
    summary = summarize(df)
    if summary.filter(pl.col("task") == "ood").is_empty():
        return []
    id_dataset = summary["id_dataset"][0]
    ood_sets = summary.filter(pl.col("task") == "ood")["eval_set"].unique().to_list()
    ood_set = f"{id_dataset}-OOD" if f"{id_dataset}-OOD" in ood_sets else sorted(ood_sets)[0]
    quality = (
        summary.filter(
            (pl.col("eval_set") == ood_set)
            & (pl.col("metric") == metric)
            & pl.col("mean").is_not_null()
        )
        .group_by("method_label", maintain_order=True)
        .agg(pl.col("mean").max().alias("quality"))
    )
    accuracy = summary.filter((pl.col("task") == "id") & (pl.col("metric") == "acc")).select(
        "method_label", pl.col("mean").alias("acc")
    )
    runtime = (
        runtime_rows(df)
        .group_by("method_label", maintain_order=True)
        .agg(pl.col("value").median().alias("runtime_ms"))
    )
    points = quality.join(accuracy, on="method_label", how="inner").join(
        runtime, on="method_label", how="left"
    )
    if points.is_empty():
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    lower_better = metric.startswith("fpr")
    styles = method_styles(points["method_label"].to_list())
    below = len(styles) > 20  # the legend goes under the panels, in columns
    height = 4.4 + (0.17 * -(-len(styles) // 4) + 0.3 if below else 0)
    fig, axes = plt.subplots(1, 2, figsize=(11, height), sharey=True, layout="constrained")
    for ax, column, xlabel in (
        (axes[0], "acc", "ID accuracy (%)"),
        (axes[1], "runtime_ms", "inference time per sample (ms, median over seeds)"),
    ):
        rows = points.filter(pl.col(column).is_not_null() & (pl.col(column) > 0))
        scale = 100.0 if column == "acc" else 1.0
        labels = rows["method_label"].to_list()
        x = rows[column].to_numpy() * scale
        y = rows["quality"].to_numpy() * 100
        if column == "acc" and len(x):  # post-hoc scores of one classifier share its accuracy
            x = np.round(x, 6)
            span = max(float(np.ptp(x)), 0.5)  # at least half a point of accuracy on the axis
            height = 0.03 * max(float(np.ptp(y)), 1.0)
            values, counts = np.unique(x, return_counts=True)
            for value in values[counts > 1]:  # the accuracy they share, under the spread
                ax.axvline(value, color="#999999", linewidth=0.8, linestyle=":", zorder=1)
            if (counts > 1).any():
                xlabel += "\n(dotted: an accuracy several methods share, spread sideways)"
            x = x + spread(x, y, 0.012 * span, height)  # slots about half a marker apart
            middle, half = (x.min() + x.max()) / 2, max(float(np.ptp(x)), span) / 2
            ax.set_xlim(middle - 1.1 * half, middle + 1.1 * half)  # a spread never fills it
        for label, xi, yi in zip(labels, x, y, strict=True):
            style = styles[label]
            ax.scatter(
                xi, yi, s=MARKER_AREA.get(style["marker"], 55), label=label,
                edgecolors="white", linewidths=0.6, zorder=3, **style,
            )  # fmt: skip
        if column == "runtime_ms" and len(x) and x.max() / x.min() > 10:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    better = "lower is better" if lower_better else "higher is better"
    axes[0].set_ylabel(f"OOD {metric.upper()} (%), {ood_set}\nbest score per method, {better}")
    handles, labels = axes[0].get_legend_handles_labels()
    if not below:  # one column beside the panels
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    else:  # many methods: columns under the panels, read row by row
        fig.legend(handles, labels, loc="outside lower center", fontsize=8, frameon=False, ncols=4)
    fig.suptitle(f"OOD detection ({metric.upper()}) against accuracy and inference time")
    return _save(fig, folder, f"frontier-{metric}")


def _figure(summary, method, setting, rest, members, metric):  # noqa: ANN001, ANN202
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    members = sorted(members, key=lambda m: _sort_key(m[0]))
    values = [v for v, _ in members]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    x = np.asarray(values, dtype=float) if numeric else np.arange(len(values), dtype=float)
    id_dataset = summary["id_dataset"][0]
    ood_sets = summary.filter(pl.col("task") == "ood")["eval_set"].unique().to_list()
    ood_set = f"{id_dataset}-OOD" if f"{id_dataset}-OOD" in ood_sets else sorted(ood_sets)[0]

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True, layout="constrained")
    panels = (
        ("ID confidence", "id", id_dataset, ID_SERIES),
        (f"OOD detection ({ood_set})", "ood", ood_set, OOD_SERIES),
    )
    for ax, (title, task, eval_set, series) in zip(axes, panels, strict=True):
        for k, (metric_name, score, name) in enumerate(series):
            wanted = metric if metric_name == "aupr" else metric_name
            mean, ci = _series(
                summary, [label for _, label in members], task, eval_set, wanted, score
            )
            if np.isnan(mean).all():
                continue
            style = SERIES_STYLES[name]
            if numeric:
                ax.plot(x, 100 * mean, label=name, **style)
                ax.fill_between(
                    x, 100 * (mean - ci), 100 * (mean + ci), alpha=0.15, color=style["color"]
                )
            else:  # categories: unconnected points, dodged so the error bars do not overlap
                dodge = 0.08 * (k - (len(series) - 1) / 2)
                ax.errorbar(
                    x + dodge, 100 * mean, yerr=100 * ci, capsize=3, linestyle="none",
                    label=name, **style,
                )  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel(setting)
        if numeric and x.min() > 0 and x.max() / x.min() > 20:
            ax.set_xscale("log")
            ax.minorticks_off()  # the swept values label the axis, not powers of ten
        ax.set_xticks(x, [_tick(v) for v in values])
        if not numeric:
            ax.set_xlim(-0.5, len(values) - 0.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"{metric.upper()} (%), ACC (%)")
    head = _common_label([label for _, label in members]) or method
    fig.suptitle(f"{head}: {metric.upper()} against {setting}" + (f" ({rest})" if rest else ""))
    return fig


def _tick(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _common_label(labels: list[str]) -> str:
    """``ETN`` for ``ETN (prior_mode=1)``, ``ETN (prior_mode=10)``, …: the head's own label."""
    heads = {label.split(" (")[0] for label in labels}
    return heads.pop() if len(heads) == 1 else ""


def _series(summary, labels, task, eval_set, metric, score):  # noqa: ANN001, ANN202
    """Mean and CI half-width per label, NaN where the head has no such score."""
    rows = summary.filter(
        (pl.col("task") == task)
        & (pl.col("eval_set") == eval_set)
        & (pl.col("metric") == metric)
        & (pl.col("score").is_null() if score is None else pl.col("score") == score)
    )
    by_label = {r["method_label"]: r for r in rows.iter_rows(named=True)}
    mean = np.array([_value(by_label.get(label), "mean") for label in labels])
    ci = np.array([_value(by_label.get(label), "ci95") for label in labels])
    return mean, np.nan_to_num(ci)


def _value(row: dict | None, key: str) -> float:
    return np.nan if row is None or row[key] is None else float(row[key])


def _sort_key(value: Any) -> tuple:
    order = {"scalar": 0, "vector": 1, "matrix": 2}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value))
    return (1, order.get(value, 99), str(value))


def _describe(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")


def _close(figure) -> None:  # noqa: ANN001
    from matplotlib import pyplot as plt

    plt.close(figure)
