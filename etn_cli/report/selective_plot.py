"""The risk–coverage curves of selective prediction (Geifman & El-Yaniv 2017, Fig. 1):
``risk-coverage.png`` / ``.pdf``.

Each method abstains on its least confident ID test predictions by max probability (the
softmax response); the curve is the error rate of the accepted predictions against the share
accepted, the mean over seeds at every coverage, and its area is the table's AURC. Shown: the
:data:`SHOWN` methods with the lowest AURC and MAP, the backbone's own softmax, as the
baseline (dashed); methods with the same curve (the post-hoc scorers keep MAP's probabilities)
are one line, named together in the legend under the axes. Each line has its method's colour
and marker (:mod:`etn_cli.report.style`); dotted lines, named at the top, mark the coverages
of the tables' Risk@80, Risk@90 and Risk@95 columns.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import polars as pl

from etn_cli.metrics.selective import COVERAGES, risk_coverage_curve
from etn_cli.report.style import family_style
from etn_cli.report.summary import Summary
from etn_cli.report.tables import METHOD

SHOWN = 5
NEAR = 0.12  # share of the axis width under which two reference names stack


def curve_groups(summary: Summary) -> list[tuple[list[tuple], float]]:
    """Method keys with one AURC of MP and one accuracy (one curve), best AURC first."""
    values = summary.frame.filter(
        (pl.col("task") == "id")
        & (((pl.col("metric") == "aurc") & (pl.col("score") == "mp")) | (pl.col("metric") == "acc"))
    )
    cells = {
        (tuple(r[c] for c in METHOD), r["metric"]): r["mean"] for r in values.iter_rows(named=True)
    }
    groups: dict[tuple, list[tuple]] = {}
    for key in summary.labels:
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


def risk_coverage_plot(summary: Summary, predictions: dict[str, Path], folder: Path) -> list[Path]:
    """Draw ``risk-coverage`` from ``summary`` and the predictions files by metrics key
    (``predictions``); returns the written paths (none without AURC values or files)."""
    from etn_cli.report.plots import save_figure

    groups = curve_groups(summary)
    if not groups or not predictions:
        return []
    chosen = groups[:SHOWN] + [g for g in groups[SHOWN:] if any(k[0] == "map" for k in g[0])]
    curves = []
    for keys, aurc in chosen:
        paths = _prediction_paths(summary.metrics, keys[0], predictions)
        if paths:
            curves.append((keys, aurc, *mean_curve(paths)))
    if not curves:
        return []
    figure = _figure(curves, summary.labels, summary.styles, len(groups))
    return save_figure(figure, folder, "risk-coverage")


def _prediction_paths(df: pl.DataFrame, key: tuple, predictions: dict[str, Path]) -> list[Path]:
    """The predictions files of the method ``key``, one per seed."""
    mine = df.filter(
        pl.all_horizontal(pl.col(c).eq_missing(v) for c, v in zip(METHOD, key, strict=True))
    )
    found = [predictions.get(k) for k in mine["metrics_key"].unique(maintain_order=True)]
    return [path for path in found if path is not None and path.is_file()]


def curve_name(names: list[str], families: list[str | None], aurc: float) -> str:
    """A legend entry: the first method sharing the curve, how many more (post-hoc scorers
    named as such), and the curve's AURC."""
    name = names[0]
    if len(names) == 2:
        name += f", {names[1]}"
    elif len(names) > 2:
        rest = "post-hoc scorers" if set(families[1:]) == {"posthoc"} else "more"
        name += f" + {len(names) - 1} {rest}"
    return f"{textwrap.shorten(name, 44, placeholder=' …')} (AURC {1000 * aurc:.1f}‰)"


def _figure(curves, labels: dict, styles: dict, total: int):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.2), layout="constrained")
    # the lowest coverage at which any drawn curve has an error; the curves are flat before
    first_error = min(cov[np.argmax(risk > 0)] if risk.any() else 1.0 for *_, cov, risk in curves)
    start = max(0.0, 10 * np.floor((100 * first_error - 5) / 10))
    for i, (keys, aurc, coverage, risk) in enumerate(curves):
        names = [labels[k] for k in keys]
        style = styles.get(names[0]) or family_style(keys[0][3])
        baseline = any(k[0] == "map" for k in keys)
        ax.plot(
            100 * coverage, 100 * risk, linewidth=1.4, linestyle="--" if baseline else "-",
            markevery=_marker_every(coverage, start, i / len(curves)), markersize=5.5,
            markeredgecolor="white", markeredgewidth=0.5,
            label=curve_name(names, [k[3] for k in keys], aurc), **style.marker_kwargs(),
        )  # fmt: skip
    _reference_lines(ax, start)
    ax.set_xlim(start, 100)
    ax.set_ylim(bottom=0)
    xlabel = "coverage: share of ID test predictions accepted, most confident first (%)"
    if start > 0:
        xlabel += f"\n(every curve is at 0 below {start:.0f}%)"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("selective risk: error rate of the accepted (%)")
    ax.grid(alpha=0.3)
    fig.legend(
        loc="outside lower center", ncols=2, fontsize=7.5, frameon=False, title_fontsize=8,
        title=_legend_title(curves, total),
    )  # fmt: skip
    fig.suptitle("Risk–coverage by max probability, mean over seeds (lower is better)", fontsize=10)
    return fig


def _legend_title(curves, total: int) -> str:
    """What the legend lists: the lowest AURCs, and MAP (dashed) as the baseline."""
    best = sum(not any(k[0] == "map" for k in keys) for keys, *_ in curves)
    among = any(any(k[0] == "map" for k in keys) for keys, *_ in curves[:SHOWN])
    if best == len(curves):  # no MAP among the heads
        return f"the {best} lowest AURCs by MP of {total} curves"
    if among:
        return f"the {len(curves)} lowest AURCs by MP of {total} curves (dashed: MAP, the baseline)"
    return f"the {best} lowest AURCs by MP of {total} curves, and MAP (dashed), the baseline"


def _marker_every(coverage: np.ndarray, start: float, shift: float) -> list[int]:
    """Indices of the points that carry a curve's marker: eight across the shown coverages,
    each curve's ``shift`` (0..1) of a step along, so that flat curves' markers do not land on
    one another."""
    step = (100 - start) / 8
    wanted = start + step * (np.arange(8) + shift)
    return [int(np.argmin(np.abs(100 * coverage - c))) for c in wanted]


def _reference_lines(ax, start: float) -> None:
    """Dotted lines at the coverages of the tables' Risk@80/90/95 columns, named at the top;
    a name too near the one before it goes a line higher."""
    row, last = 0, None
    for name, coverage in COVERAGES.items():
        if 100 * coverage <= start:
            continue
        ax.axvline(100 * coverage, color="#999999", linestyle=":", linewidth=0.8, zorder=0)
        near = last is not None and (coverage - last) * 100 / (100 - start) < NEAR
        row = 1 - row if near else 0
        last = coverage
        ax.text(
            100 * coverage, 1.01 + 0.04 * row, f"Risk@{name.removeprefix('risk')}", ha="center",
            va="bottom", fontsize=7, color="#555555", transform=ax.get_xaxis_transform(),
        )  # fmt: skip
