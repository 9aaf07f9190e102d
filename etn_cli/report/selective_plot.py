"""The risk–coverage curves of selective prediction (Geifman & El-Yaniv 2017, Fig. 1):
``risk-coverage.png`` / ``.pdf``.

Each method abstains on its least confident ID test predictions by max probability (the
softmax response); the curve is the error rate of the accepted predictions against the share
accepted, the mean over seeds at every coverage, and its area is the table's AURC. Shown: the
:data:`SHOWN` methods with the lowest AURC and MAP, the backbone's own softmax, as the
baseline; methods with the same curve (the post-hoc scorers keep MAP's probabilities) are one
line, named together. Dotted lines mark the 80/90/95% coverages of the Risk@ columns.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import polars as pl

from etn_cli.metrics.selective import COVERAGES, risk_coverage_curve
from etn_cli.report.tables import METHOD, row_labels, summarize

SHOWN = 5
LINE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000")


def curve_groups(summary: pl.DataFrame) -> list[tuple[list[tuple], float]]:
    """Method keys with one AURC of MP and one accuracy (one curve), best AURC first."""
    values = summary.filter(
        (pl.col("task") == "id")
        & (((pl.col("metric") == "aurc") & (pl.col("score") == "mp")) | (pl.col("metric") == "acc"))
    )
    cells = {
        (tuple(r[c] for c in METHOD), r["metric"]): r["mean"] for r in values.iter_rows(named=True)
    }
    groups: dict[tuple, list[tuple]] = {}
    for key in row_labels(summary):
        aurc, acc = cells.get((key, "aurc")), cells.get((key, "acc"))
        if aurc is not None and acc is not None:
            groups.setdefault((round(aurc, 12), round(acc, 12)), []).append(key)
    return sorted(((keys, point[0]) for point, keys in groups.items()), key=lambda g: g[1])


def mean_curve(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """Coverage (N,) and the mean over the files' seeds of the selective risk by MP (N,)."""
    from etn_cli.store.artefacts.predictions import read_rows

    risks, coverage = [], None
    for path in paths:
        test = read_rows(path).filter(pl.col("task") == "id")
        coverage, risk = risk_coverage_curve(
            test["score_mp"].to_numpy(), test["correct"].to_numpy()
        )
        risks.append(risk)
    return coverage, np.mean(risks, axis=0)


def risk_coverage_plot(df: pl.DataFrame, predictions: dict[str, Path], folder: Path) -> list[Path]:
    """Draw ``risk-coverage`` from the metrics ``df`` and the predictions files by metrics key
    (``predictions``); returns the written paths (none without AURC values or files)."""
    from etn_cli.report.plots import save_figure

    summary = summarize(df)
    groups = curve_groups(summary)
    if not groups or not predictions:
        return []
    chosen = groups[:SHOWN] + [g for g in groups[SHOWN:] if any(k[0] == "map" for k in g[0])]
    files = df.select(*METHOD, "metrics_key").unique()
    labels = row_labels(summary)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.4), layout="constrained")
    first_error = 1.0  # the lowest coverage at which any drawn curve has an error
    for i, (keys, aurc) in enumerate(chosen):
        mine = files.filter(
            pl.all_horizontal(pl.col(c).eq_missing(v) for c, v in zip(METHOD, keys[0], strict=True))
        )
        found = [predictions.get(k) for k in mine["metrics_key"].to_list()]
        paths = [path for path in found if path is not None and path.is_file()]
        if not paths:
            continue
        coverage, risk = mean_curve(paths)
        first_error = min(first_error, coverage[np.argmax(risk > 0)] if risk.any() else 1.0)
        names = ", ".join(labels[k] for k in keys)
        label = textwrap.fill(f"{names} (AURC {1000 * aurc:.1f}‰)", 48)
        style = "--" if keys[0][0] == "map" else "-"
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        ax.plot(100 * coverage, 100 * risk, color=colour, linewidth=1.4, label=label, ls=style)
    for coverage in COVERAGES.values():
        ax.axvline(100 * coverage, color="#999999", linestyle=":", linewidth=0.8)
    start = max(0.0, 10 * np.floor((100 * first_error - 5) / 10))  # the curves are flat before
    ax.set_xlim(start, 100)
    ax.set_ylim(bottom=0)
    xlabel = "coverage: share of ID test predictions accepted (%), most confident first"
    if start > 0:
        xlabel += f"\n(no curve has an error below {start:.0f}% coverage)"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("selective risk: error rate of the accepted (%)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False,
               title=f"lowest AURC by MP (of {len(groups)} curves)", title_fontsize=8)  # fmt: skip
    ax.set_title("Risk–coverage by max probability, mean over seeds (lower is better)")
    return save_figure(fig, folder, "risk-coverage")
