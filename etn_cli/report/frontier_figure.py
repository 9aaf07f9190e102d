"""The frontier figure's panels (:mod:`etn_cli.report.frontier` says what it shows): quality
against accuracy, against inference time, and the ranked results of a crowded accuracy.

Panels are lettered in the order they appear; the legend and the notes sit under them, outside
every panel's data.
"""

from __future__ import annotations

import textwrap

import numpy as np

from etn_cli.report.frontier_results import SAME, Result
from etn_cli.report.labels import place_labels
from etn_cli.report.style import set_scale

MARKER_SIZE = 6.5
TICK_SIZE = 7.5  # points: font of the ranked panels' names
GLYPH = "#BBBBBB"  # the crowded accuracy's bar
KEY_SIZE = 7.5  # points: the legend's and the notes' font
CROWDED = 4  # results at one accuracy drawn as one glyph in (a) and ranked in (b)


def frontier_figure(results: list[Result], ood_set: str, metric: str):
    """The figure of :func:`etn_cli.report.frontier.frontier_plot`, not yet saved."""
    import matplotlib

    matplotlib.use("Agg")
    lower_better = metric.startswith("fpr")
    better = "lower is better" if lower_better else "higher is better"
    quality = f"OOD {metric.upper()} (%) on {ood_set}, {better}"
    timed = [r for r in results if r.runtime is not None]
    show_runtime = runtimes_differ(timed)
    notes = ["Score: the method's own OOD score, else MP; bars: 95% intervals over seeds."]
    if not show_runtime and len(timed) >= 2:
        notes.append(
            "No runtime panel: every method's timings (backbone + head, all repeats and seeds) "
            "overlap, so their differences are noise."
        )
    if len({round(r.acc, SAME) for r in results}) == 1:
        return _ranked_figure(results, quality, metric, lower_better, show_runtime, notes)
    return _scatter_figure(results, quality, metric, lower_better, show_runtime, notes)


def crowded_accuracy(results: list[Result]) -> float | None:
    """The accuracy most results share when at least :data:`CROWDED` do, else None."""
    counts: dict[float, int] = {}
    for result in results:
        counts[round(result.acc, SAME)] = counts.get(round(result.acc, SAME), 0) + 1
    acc, count = max(counts.items(), key=lambda item: item[1])
    return acc if count >= CROWDED else None


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


def _ranked_figure(results, quality, metric, lower_better, show_runtime, notes):
    from matplotlib import pyplot as plt

    panels = 1 + show_runtime
    width, height = 5.2 + 3.6 * show_runtime, 0.3 * len(results) + 1.6
    key = _key_height(0, width, notes)
    fig = plt.figure(figsize=(width, height + key), layout="constrained")
    grid = fig.add_gridspec(2, panels, height_ratios=[height, key])
    axes = [fig.add_subplot(grid[0, i]) for i in range(panels)]
    ordered = ranked(axes[0], results, quality, lower_better)
    if show_runtime:
        ranked_runtime(axes[1], ordered)
        axes[1].sharey(axes[0])
        axes[1].tick_params(labelleft=False)
    _key(fig, grid, [], notes, None)
    fig.suptitle(
        f"OOD detection ({metric.upper()}), ranked: every method has ID accuracy "
        f"{results[0].acc:.2f}%" + (", with its inference time" if show_runtime else ""),
        fontsize=10,
    )
    return fig


def _scatter_figure(results, quality, metric, lower_better, show_runtime, notes):
    from matplotlib import pyplot as plt

    crowd = crowded_accuracy(results)
    members = [r for r in results if crowd is not None and round(r.acc, SAME) == crowd]
    kinds = ["acc"] + ["runtime"] * show_runtime + ["crowd"] * bool(members)
    ratios = {"acc": 1.0, "runtime": 1.0, "crowd": 0.9}
    width, height = 4.6 * len(kinds) + 1.0, max(3.8, 0.24 * len(members) + 1.6)
    # room for every marker a label might miss: the figure's size is fixed before labels go in
    entries = len(results) + 1 if show_runtime else len(results) - len(members) + 2
    key = _key_height(entries, width, notes)
    fig = plt.figure(figsize=(width, height + key), layout="constrained")
    grid = fig.add_gridspec(2, len(kinds), height_ratios=[height, key],
                            width_ratios=[ratios[k] for k in kinds])  # fmt: skip
    axes = {k: fig.add_subplot(grid[0, i]) for i, k in enumerate(kinds)}
    letters = {k: f"({chr(ord('a') + i)})" for i, k in enumerate(kinds)}
    unlabelled: dict[str, Result] = {}
    if members:
        ranked(axes["crowd"], members, quality, lower_better)
        axes["crowd"].set_title(
            f"{letters['crowd']} the {len(members)} results at ID accuracy {crowd:.2f}%",
            fontsize=9,
        )
    scatter(axes["acc"], results, "acc", lower_better, unlabelled, members)
    axes["acc"].set_title(f"{letters['acc']} against ID accuracy", fontsize=9)
    axes["acc"].set_ylabel(quality)
    if show_runtime:
        timed = [r for r in results if r.runtime is not None]
        scatter(axes["runtime"], timed, "runtime", lower_better, unlabelled, [])
        axes["runtime"].set_title(f"{letters['runtime']} against inference time", fontsize=9)
        axes["runtime"].set_ylim(axes["acc"].get_ylim())
    glyph = None
    if members:
        glyph = f"the {len(members)} results at {crowd:.2f}%, ranked in {letters['crowd']}"
    _key(fig, grid, list(unlabelled.values()), notes, glyph)
    fig.suptitle(
        f"OOD detection ({metric.upper()}) against ID accuracy"
        + (" and inference time" if show_runtime else ""),
        fontsize=10,
    )
    return fig


def scatter(ax, results, column, lower_better, unlabelled, crowd) -> None:
    """One marker per result with its 95% interval (for runtime also the fastest..slowest
    timing); the ``crowd`` (results at one accuracy) as one bar with a tick each; the Pareto
    front labelled where a label fits, every other marker added to ``unlabelled``."""
    x = np.array([r.acc if column == "acc" else r.runtime[0] for r in results])  # type: ignore[index]
    y = np.array([r.quality for r in results])
    sign_x, sign_y = (-1.0 if column == "runtime" else 1.0), (-1.0 if lower_better else 1.0)
    front = set(pareto_front(sign_x * x, sign_y * y).tolist())
    shown = [i for i, r in enumerate(results) if r not in crowd or i in front]
    _limits(ax, results, column, x, y)
    markers, bars = [], []
    if crowd:
        ys = [r.quality for r in crowd]
        ax.vlines(crowd[0].acc, min(ys), max(ys), color=GLYPH, linewidth=5, zorder=1)
        ax.plot([crowd[0].acc] * len(ys), ys, linestyle="none", marker="_", markersize=9,
                color="#666666", zorder=2)  # fmt: skip
        bars.append(((crowd[0].acc, min(ys)), (crowd[0].acc, max(ys)), 4.0))
    for i in shown:
        r = results[i]
        xerr = None
        if column == "runtime":
            xerr = [[x[i] - r.runtime[1]], [r.runtime[2] - x[i]]]  # type: ignore[index]
            bars.append(((r.runtime[1], y[i]), (r.runtime[2], y[i]), 1.0))  # type: ignore[index]
        ax.errorbar(
            x[i], y[i], yerr=r.ci or None, xerr=xerr, markersize=MARKER_SIZE, elinewidth=0.8,
            linestyle="none", markeredgecolor="white", markeredgewidth=0.5, zorder=3,
            **r.look.marker_kwargs(),
        )  # fmt: skip
        markers.append((x[i], y[i], MARKER_SIZE))
        bars.append(((x[i], y[i] - r.ci), (x[i], y[i] + r.ci), 1.0))
    labelled = [i for i in shown if i in front]
    points = [(x[i], y[i], textwrap.fill(results[i].label, 34)) for i in labelled]
    missed = place_labels(ax, points, markers, bars)
    named = {i for k, i in enumerate(labelled) if k not in missed}
    for i in shown:
        if i not in named:
            unlabelled.setdefault(results[i].label, results[i])
    ax.set_xlabel("ID accuracy (%)" if column == "acc" else "inference time per sample (ms)")
    ax.grid(alpha=0.3)


def _limits(ax, results, column, x, y) -> None:
    """Room around the data for the labels; log time only where the times span decades."""
    low = min(r.quality - r.ci for r in results)
    high = max(r.quality + r.ci for r in results)
    span = max(high - low, 1.0)
    ax.set_ylim(low - 0.1 * span, high + 0.1 * span)
    if column == "acc":
        middle, half = (x.min() + x.max()) / 2, max(float(np.ptp(x)), 0.5) / 2
        ax.set_xlim(middle - 1.6 * half, middle + 1.6 * half)
        return
    ends = [t for r in results for t in r.runtime[1:]]  # type: ignore[index]
    set_scale(ax, "x", ends)
    if ax.get_xscale() == "log":
        ax.set_xlim(min(ends) / 1.6, max(ends) * 1.6)
    else:
        pad = 0.15 * (max(ends) - min(ends) or 1.0)
        ax.set_xlim(max(0.0, min(ends) - pad), max(ends) + pad)


def ranked(ax, results: list[Result], xlabel: str, lower_better: bool) -> list[Result]:
    """A dot plot, best first from the top: each result's quality with its 95% interval, its
    methods named on the axis; returns the results in their order from the top."""
    ordered = sorted(results, key=lambda r: r.quality, reverse=not lower_better)
    y = np.arange(len(ordered))[::-1]
    for yi, result in zip(y, ordered, strict=True):
        ax.errorbar(
            result.quality, yi, xerr=result.ci or None, markersize=6, elinewidth=1, capsize=2,
            linestyle="none", **result.look.marker_kwargs(),
        )  # fmt: skip
    names = [textwrap.shorten(r.label, 48, placeholder=" …") for r in ordered]
    ax.set_yticks(y, names, fontsize=TICK_SIZE)
    ax.set_ylim(-0.6, len(y) - 0.4)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3, axis="x")
    return ordered


def ranked_runtime(ax, ordered: list[Result]) -> None:
    """Beside the ranked dot plot, on the same rows: each result's median time per sample,
    the bar from its fastest to its slowest timing."""
    y = np.arange(len(ordered))[::-1]
    for yi, result in zip(y, ordered, strict=True):
        if result.runtime is None:
            continue
        median, fast, slow = result.runtime
        ax.errorbar(
            median, yi, xerr=[[median - fast], [slow - median]], markersize=6, elinewidth=1,
            capsize=2, linestyle="none", **result.look.marker_kwargs(),
        )  # fmt: skip
    set_scale(ax, "x", [t for r in ordered if r.runtime for t in r.runtime[1:]])
    ax.set_xlabel("inference time per sample (ms),\nfastest..slowest repeat")
    ax.grid(alpha=0.3, axis="x")


def _key(fig, grid, unlabelled: list[Result], notes: list[str], glyph: str | None) -> None:
    """Under the panels: a legend of the crowded accuracy's bar (``glyph``) and the markers
    drawn without a label, then the notes."""
    from matplotlib.lines import Line2D

    key = fig.add_subplot(grid[1, :])
    key.axis("off")
    handles = [
        Line2D([], [], linestyle="none", markersize=6, **r.look.marker_kwargs()) for r in unlabelled
    ]
    names = [textwrap.shorten(r.label, 40, placeholder=" …") for r in unlabelled]
    if glyph:
        handles.insert(0, Line2D([], [], color=GLYPH, linewidth=5))
        names.insert(0, glyph)
    if handles:
        key.legend(handles, names, loc="upper left", ncols=_columns(fig.get_figwidth()),
                   fontsize=KEY_SIZE, frameon=False, borderaxespad=0)  # fmt: skip
    key.text(0.0, 0.0, _notes(notes, fig.get_figwidth()), fontsize=KEY_SIZE, va="bottom",
             transform=key.transAxes)  # fmt: skip


def _columns(width: float) -> int:
    return max(1, min(5, int(width // 3.0)))


def _notes(notes: list[str], width: float) -> str:
    return "\n".join(textwrap.fill(n, int(width * 15)) for n in notes)


def _key_height(entries: int, width: float, notes: list[str]) -> float:
    """Inches under the panels for a legend of ``entries`` and the notes."""
    rows = -(-entries // _columns(width))
    lines = _notes(notes, width).count("\n") + 1
    return 0.19 * rows + 0.15 * lines + 0.1
