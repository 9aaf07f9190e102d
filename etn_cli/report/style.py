"""How every figure of a report draws a method, a score and an axis: one place, so a method
looks the same in the frontier, the risk–coverage curves and the reliability diagrams.

* **Shape by family, colour by member** (Okabe & Ito's colour-blind-safe colours): a circle
  is evidential, a triangle Bayesian, a square deterministic, a diamond post-hoc, and
  neighbouring methods differ in colour, so the curves of one family stay apart.
  :func:`method_styles` hands out the pairs by family and name, not by row order, so every
  plot of one report gets the same pair for the same method, and no two methods share one.
* **Scores** (the sweep plots' series: ACC, MP, UM, MI, DE) have their own styles.
* **Log axes only where the data span decades** (:func:`spans_decades`), with plain tick
  labels (``0.01``, ``0.1``, ``1``), not powers of ten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from etn_cli.report.tables import row_labels

# Okabe & Ito's colour-blind-safe colours (their yellow left out: too faint on white), in an
# order that keeps neighbours apart
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000")
FAMILY_MARKERS = {  # the first shape says the family; the others take over past len(COLOURS)
    "evidential": ("o", "h"),
    "bayesian": ("^", "v"),
    "deterministic": ("s", "P"),
    "posthoc": ("D", "X", "p", "*", "d"),
    "other": ("H", "8"),
}
SPARE_MARKERS = ("<", ">", "o", "h", "^", "v", "s", "P", "D", "X", "p", "*", "d", "H", "8")
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
    """A method's look: its own colour and its family's marker."""

    color: str
    marker: str

    def marker_kwargs(self) -> dict[str, str]:
        """``color`` and ``marker`` for ``plot``, ``errorbar`` and ``Line2D``."""
        return {"color": self.color, "marker": self.marker}


def method_styles(frame: pl.DataFrame) -> dict[str, Style]:
    """Display label (:func:`row_labels`) -> style, for every method in a metrics or summary
    frame. The methods, sorted by family and then by name, variant and label (never by the
    order of the frame's rows), take the colours in turn; each has its family's shape, the
    family's next shape once its colours come round again, so no two share both."""
    styles: dict[str, Style] = {}
    labels = row_labels(frame)
    rank = {family: i for i, family in enumerate(FAMILY_MARKERS)}
    ordered = sorted(labels, key=lambda k: (rank.get(_family(k), 99), _natural(k)))
    members: dict[str, int] = {}
    for i, key in enumerate(ordered):
        family = _family(key)
        index = members.get(family, 0)
        members[family] = index + 1
        shapes = FAMILY_MARKERS[family]
        shapes += tuple(m for m in SPARE_MARKERS if m not in shapes)
        styles[labels[key]] = Style(COLOURS[i % len(COLOURS)], shapes[index // len(COLOURS)])
    return styles


def _natural(key: tuple) -> list:
    """Sort key of a method key whose numbers count as numbers: ``prior_mode=2`` before
    ``prior_mode=10``."""
    parts = re.split(r"(\d+)", "\0".join(str(part) for part in key))
    return [(int(p), p) if i % 2 else (0, p) for i, p in enumerate(parts)]  # odd: digits


def _family(key: tuple) -> str:
    return key[3] if key[3] in FAMILY_MARKERS else "other"


def family_style(family: str | None) -> Style:
    """The look of a family as a whole: grey, with the family's shape."""
    return Style("#555555", FAMILY_MARKERS.get(family or "other", FAMILY_MARKERS["other"])[0])


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
