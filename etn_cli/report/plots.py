"""The paper's figures from the metrics: the ablation plots of swept heads (AUPR against the
swept value, mean over seeds with the 95% confidence band shaded; paper Figures "Ablation
studies" and "Comparison across transformation dimensionalities"); Figure 1 is in
:mod:`etn_cli.report.frontier`.

Each metrics row of a swept head carries its point in the ``sweep`` column (JSON, e.g.
``{"prior_mode": 5}``). For every method and swept setting one figure is drawn with two panels:
ID confidence estimation (accuracy, MP, UM) and OOD detection (MP, MI, DE on the ``<ID>-OOD``
average, or on the single OOD set), each panel with its own y-range, so that curves a few
points apart are not squeezed into a shared one. Numeric settings become lines (log x-axis where
the values span decades, :func:`etn_cli.report.style.spans_decades`); other values
(``variant``) become points with error bars. A score has one colour and marker in every panel
(:data:`etn_cli.report.style.SCORE_STYLES`); the legend sits under the panels.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from etn_cli.errors import EtnError
from etn_cli.report.style import SCORE_STYLES, spans_decades
from etn_cli.report.summary import Summary
from etn_cli.store.atomic import atomic_write_bytes

PLOT_FORMATS = ("png", "pdf")
ID_SERIES = (("acc", None, "ACC"), ("aupr", "mp", "MP"), ("aupr", "um", "UM"))
OOD_SERIES = (("aupr", "mp", "MP"), ("aupr", "mi", "MI"), ("aupr", "de", "DE"))


def sweep_points(df: pl.DataFrame) -> pl.DataFrame:
    """One row per swept head label: method, label, variant and its parsed sweep point."""
    if "sweep" not in df.columns:
        return pl.DataFrame()
    rows = df.select("method", "method_label", "variant", "sweep").unique(maintain_order=True)
    rows = rows.filter(pl.col("sweep").is_not_null() & (pl.col("sweep") != "{}"))
    return rows


def sweep_point(text: str, method: str) -> dict[str, Any]:
    """One row's ``sweep`` column: a JSON object of the swept settings' values."""
    try:
        point = json.loads(text)
    except (ValueError, RecursionError):
        point = None
    if not isinstance(point, dict):
        raise EtnError(
            f"The metrics of {method} give sweep = {text[:60]!r}; expected a JSON object of the "
            "swept settings. Re-run etn evaluate to rewrite the file."
        )
    return point


def sweep_plots(summary: Summary, folder: Path, metric: str = "aupr") -> list[Path]:
    """Draw every ablation figure of ``summary`` into ``folder`` as PNG and PDF.

    Returns the written paths (none when no head was swept).
    """
    points = sweep_points(summary.metrics)
    if points.is_empty():
        return []
    written: list[Path] = []
    for method in points["method"].unique(maintain_order=True).to_list():
        mine = points.filter(pl.col("method") == method)
        parsed = [sweep_point(s, method) for s in mine["sweep"].to_list()]
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
                written += save_figure(figure, folder, stem)
    return written


def save_figure(figure, folder: Path, stem: str) -> list[Path]:
    """Write ``figure`` as ``<stem>.png`` and ``<stem>.pdf`` atomically, then close it."""
    paths = []
    for fmt in PLOT_FORMATS:
        buffer = io.BytesIO()
        figure.savefig(buffer, format=fmt, bbox_inches="tight")
        atomic_write_bytes(folder / f"{stem}.{fmt}", buffer.getvalue())
        paths.append(folder / f"{stem}.{fmt}")
    _close(figure)
    return paths


def _figure(summary, method, setting, rest, members, metric):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    members = sorted(members, key=lambda m: _sort_key(m[0]))
    values = [v for v, _ in members]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    x = np.asarray(values, dtype=float) if numeric else np.arange(len(values), dtype=float)
    id_dataset, ood_set = summary.frame["id_dataset"][0], summary.ood_set

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    panels = (
        ("ID confidence", "id", id_dataset, ID_SERIES),
        (f"OOD detection ({ood_set})", "ood", ood_set, OOD_SERIES),
    )
    for ax, (title, task, eval_set, series) in zip(axes, panels, strict=True):
        for k, (metric_name, score, name) in enumerate(series):
            wanted = metric if metric_name == "aupr" else metric_name
            labels = [label for _, label in members]
            mean, ci = _series(summary.frame, labels, task, eval_set, wanted, score)
            if np.isnan(mean).all():
                continue
            style = SCORE_STYLES[name]
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
        if numeric and spans_decades(x):
            ax.set_xscale("log")
            ax.minorticks_off()  # the swept values label the axis, not powers of ten
        ax.set_xticks(x, [_tick(v) for v in values])
        if not numeric:
            ax.set_xlim(-0.5, len(values) - 0.5)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{metric.upper()} (%), ACC (%)")
    axes[1].set_ylabel(f"{metric.upper()} (%)")
    _series_legend(fig, axes)
    head = _common_label([label for _, label in members]) or method
    fig.suptitle(f"{head}: {metric.upper()} against {setting}" + (f" ({rest})" if rest else ""))
    return fig


def _series_legend(fig, axes) -> None:
    """One legend of every score drawn, under both panels (outside their data)."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(name, handle)
    fig.legend(entries.values(), entries.keys(), loc="outside lower center",
               ncols=len(entries), fontsize=8, frameon=False)  # fmt: skip


def _tick(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _common_label(labels: list[str]) -> str:
    """``ETN`` for ``ETN (prior_mode=1)``, ``ETN (prior_mode=10)``, …: the head's own label."""
    heads = {label.split(" (")[0] for label in labels}
    return heads.pop() if len(heads) == 1 else ""


def _series(summary, labels, task, eval_set, metric, score):
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


def _close(figure) -> None:
    from matplotlib import pyplot as plt

    plt.close(figure)
