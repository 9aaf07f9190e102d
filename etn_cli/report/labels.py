"""Text labels beside markers that never overlap each other, a marker or an error bar.

Each label tries places around its point, nearest first (right, left, above, below, the four
corners, then the same farther out); a place is taken when the label's box, measured by the
renderer, stays inside the axes and clear of every obstacle (the drawn markers and interval
bars, in display space) and of the labels placed before it, and lies nearer its own point than
any other marker, so that it cannot be read as naming a neighbour; a label set farther out is
joined to its point by a thin grey line. A label with no free place is
not drawn; the caller names it in a legend instead.
"""

from __future__ import annotations

import numpy as np
from matplotlib.text import Text
from matplotlib.transforms import Bbox

LABEL_SIZE = 7.5
PAD = 1.5  # pixels of clearance around every box
PLACES = (  # (dx, dy) in units of the step, with the text's alignment
    (1, 0, "left", "center"),
    (-1, 0, "right", "center"),
    (0, 1, "center", "bottom"),
    (0, -1, "center", "top"),
    (1, 1, "left", "bottom"),
    (1, -1, "left", "top"),
    (-1, 1, "right", "bottom"),
    (-1, -1, "right", "top"),
)
STEPS = (6, 14, 24, 36, 50)  # points from the marker's centre


def marker_box(ax, x: float, y: float, size: float) -> Bbox:
    """The display box of a marker of ``size`` points at data ``(x, y)``."""
    px, py = ax.transData.transform((x, y))
    half = size * ax.figure.dpi / 72 / 2 + PAD
    return Bbox.from_extents(px - half, py - half, px + half, py + half)


def segment_box(ax, start: tuple[float, float], end: tuple[float, float], pad: float) -> Bbox:
    """The display box of a bar from data ``start`` to ``end``, ``pad`` pixels wider."""
    (x0, y0), (x1, y1) = ax.transData.transform([start, end])
    return Bbox.from_extents(min(x0, x1) - pad, min(y0, y1) - pad, max(x0, x1) + pad,
                             max(y0, y1) + pad)  # fmt: skip


def place_labels(
    ax,
    points: list[tuple[float, float, str]],
    markers: list[tuple[float, float, float]],
    bars: list[tuple[tuple[float, float], tuple[float, float], float]],
) -> list[int]:
    """Draw each ``(x, y, text)`` beside its point where it overlaps nothing: no other label,
    no marker ``(x, y, size in points)`` and no bar ``(start, end, half-width in pixels)``;
    returns the indices of the labels that found no free place (not drawn)."""
    fig = ax.figure
    fig.canvas.draw()  # the axes' final place (after layout) and a renderer to measure text
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = [marker_box(ax, x, y, size) for x, y, size in markers]
    taken += [segment_box(ax, start, end, PAD + pad) for start, end, pad in bars]
    centres = ax.transData.transform([(x, y) for x, y, _ in markers]).reshape(-1, 2)
    unplaced = []
    for i, (x, y, text) in enumerate(points):
        label = _first_free(ax, renderer, frame, taken, centres, x, y, text)
        if label is None:
            unplaced.append(i)
        else:
            taken.append(_text_box(label, renderer).padded(PAD))
    return unplaced


def _first_free(ax, renderer, frame, taken, centres, x: float, y: float, text: str):
    """The first place around ``(x, y)`` where the label overlaps nothing in ``taken`` and
    lies nearer its own point than any other marker's centre (so it names no neighbour)."""
    own = ax.transData.transform((x, y))
    for step in STEPS:
        for dx, dy, ha, va in PLACES:
            label = ax.annotate(
                text, (x, y), xytext=(dx * step, dy * step), textcoords="offset points",
                fontsize=LABEL_SIZE, ha=ha, va=va, zorder=4,
                arrowprops={"arrowstyle": "-", "color": "#888888", "linewidth": 0.5,
                            "shrinkA": 0, "shrinkB": 4} if step > STEPS[0] else None,
            )  # fmt: skip
            box = _text_box(label, renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1
            inside = inside and frame.y0 <= box.y0 and box.y1 <= frame.y1
            nearest = min((_distance(box, c) for c in centres if not np.allclose(c, own)),
                          default=np.inf)  # fmt: skip
            if inside and _distance(box, own) < nearest:
                if not any(box.overlaps(other) for other in taken):
                    return label
            label.remove()
    return None


def _distance(box: Bbox, point) -> float:
    """Pixels from ``point`` to the nearest edge of ``box`` (0 inside it)."""
    dx = max(box.x0 - point[0], 0.0, point[0] - box.x1)
    dy = max(box.y0 - point[1], 0.0, point[1] - box.y1)
    return float(np.hypot(dx, dy))


def _text_box(label, renderer) -> Bbox:
    """The box of a label's text alone: an annotation's own extent takes in its leader line,
    which runs to the very marker it names."""
    label.update_positions(renderer)  # what Annotation.get_window_extent does first
    return Text.get_window_extent(label, renderer)
