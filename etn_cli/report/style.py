"""How every figure of a report draws a method, a score and an axis: one place, so a method
looks the same in the frontier, the risk–coverage curves and the reliability diagrams.

* **Colour by family, shape by member** (Okabe & Ito's colour-blind-safe colours): the family
  reads at a glance and every method of a report has its own colour-and-marker pair.
  :func:`method_styles` hands out the pairs by name within a family, not by row order, so
  every plot of one report gets the same pair for the same method. A family of more than
  :data:`MARKERS` members continues in its second shade.
* **Scores** (the sweep plots' series: ACC, MP, UM, MI, DE) have their own styles.
* **Log axes only where the data span decades** (:func:`spans_decades`), with plain tick
  labels (``0.01``, ``0.1``, ``1``), not powers of ten.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from etn_cli.report.tables import row_labels

# the family's main shade, then its second one for members past len(MARKERS)
FAMILY_COLOURS = {
    "evidential": ("#0072B2", "#56B4E9"),  # blue, sky blue
    "bayesian": ("#E69F00", "#8C5A00"),  # orange, dark orange
    "deterministic": ("#009E73", "#00563F"),  # bluish green, dark green
    "posthoc": ("#CC79A7", "#7A2E5A"),  # reddish purple, dark purple
    "other": ("#555555", "#999999"),  # greys
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*", "d", "H")
SCORE_STYLES = {  # the sweep plots' series
    "ACC": {"color": "#000000", "marker": "s"},
    "MP": {"color": "#0072B2", "marker": "o"},
    "UM": {"color": "#E69F00", "marker": "v"},
    "MI": {"color": "#009E73", "marker": "^"},
    "DE": {"color": "#D55E00", "marker": "D"},
}
DECADES = 20.0  # a positive axis whose largest value is this many times its smallest goes log


@dataclass(frozen=True)
class Style:
    """A method's look: its family's colour and its own marker."""

    color: str
    marker: str

    def marker_kwargs(self) -> dict[str, str]:
        """``color`` and ``marker`` for ``plot``, ``errorbar`` and ``Line2D``."""
        return {"color": self.color, "marker": self.marker}


def method_styles(frame: pl.DataFrame) -> dict[str, Style]:
    """Display label (:func:`row_labels`) -> style, for every method in a metrics or summary
    frame: the members of a family, sorted by name, variant and label, take the markers in
    turn, so the pairs do not depend on the order of the frame's rows."""
    styles: dict[str, Style] = {}
    members: dict[str, int] = {}
    labels = row_labels(frame)
    for key in sorted(labels, key=lambda k: tuple(str(part) for part in k)):
        label = labels[key]
        family = key[3] if key[3] in FAMILY_COLOURS else "other"
        index = members.get(family, 0)
        members[family] = index + 1
        shade = FAMILY_COLOURS[family][(index // len(MARKERS)) % 2]
        styles[label] = Style(shade, MARKERS[index % len(MARKERS)])
    return styles


def family_style(family: str | None) -> Style:
    """The look of a family as a whole (its main shade, its first member's marker)."""
    return Style(FAMILY_COLOURS.get(family or "other", FAMILY_COLOURS["other"])[0], MARKERS[0])


def spans_decades(values) -> bool:
    """Whether an axis over ``values`` (all that is drawn on it, interval ends included) is
    better read on a log scale: every value positive and the largest at least
    :data:`DECADES` times the smallest."""
    finite = [float(v) for v in values if v is not None and float(v) == float(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) >= DECADES


def set_scale(ax, axis: str, values) -> None:
    """Log scale on ``axis`` ("x" or "y") of ``ax`` where :func:`spans_decades`, with plain
    tick labels (``0.01``, ``0.1``, ``1``); else linear."""
    if not spans_decades(values):
        return
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())
