"""Render a results table (:func:`etn_cli.report.tables.build_table`) as text for a terminal,
Markdown, CSV, LaTeX (booktabs, the paper's bold best and underlined second) or JSON.

The terminal text stays within 100 columns: a wider table (``--metric aupr`` with several OOD
sets) is cut into blocks of whole eval sets, each repeating the Method column; Markdown, CSV
and LaTeX keep one wide table. Cells show ``mean ± half-width`` where the value has two or
more seeds and the mean alone otherwise; methods are grouped by family, one section per family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import groupby

import polars as pl

from etn_cli.errors import EtnError
from etn_cli.report.metric_names import OOD_SET_SIZE
from etn_cli.report.tables import RUNTIME

LOWER_IS_BETTER = {
    "fpr95", "fpr95_id", "ece", "nll", "brier", RUNTIME,
    "aurc", "eaurc", "risk80", "risk90", "risk95", "set_size",
}  # fmt: skip
# a conformal set's coverage should meet 1 - alpha, not be highest; on OOD sets a larger
# set is the honest answer, not a worse one
UNRANKED = {"coverage", OOD_SET_SIZE}
RENDER_FORMATS = ("table", "markdown", "csv", "latex", "json")
ALIASES = {"md": "markdown", "tex": "latex"}
MISSING = "–"
FAMILY_NAMES = {
    "evidential": "evidential",
    "bayesian": "Bayesian",
    "deterministic": "deterministic (single pass)",
    "posthoc": "post-hoc scorers",
}
DECIMALS = {"table": 1, "markdown": 2, "latex": 2}
NON_PERCENT_DECIMALS = 3  # nll, brier
METHOD_WIDTH = 30  # longer labels are cut with "…" in the terminal table
MAX_WIDTH = 100  # the terminal table's widest line; wider tables are cut into blocks


def cell_columns(table: pl.DataFrame) -> list[str]:
    """Names of the struct (mean, ci95, metric, n_seeds) columns of a results table."""
    return [name for name, dtype in table.schema.items() if isinstance(dtype, pl.Struct)]


def _decimals(metric: str | None, style: str) -> int:
    from etn_cli.report.tables import PERCENT_METRICS, PERMILLE_METRICS

    if metric == RUNTIME:
        return 2  # ms per sample: 1.02
    scaled = PERCENT_METRICS | PERMILLE_METRICS
    return DECIMALS[style] if metric in scaled else NON_PERCENT_DECIMALS


def _ranks(cells: list[dict | None], digits: int = 2) -> list[int]:
    """Per cell: 1 if best, 2 if second best (by the shown value), else 0.

    Best is the highest value, or the lowest for fpr95, ece, nll, brier, runtime, the selective
    risks and the conformal set size; coverage is not ranked. Needs 2+ values.
    """
    metrics = [cell["metric"] for cell in cells if cell and cell["metric"]]
    if metrics and metrics[0] in UNRANKED:
        return [0] * len(cells)
    sign = -1.0 if metrics and metrics[0] in LOWER_IS_BETTER else 1.0
    shown = [
        None if not cell or cell["mean"] is None else round(cell["mean"], digits) for cell in cells
    ]
    distinct = sorted({sign * v for v in shown if v is not None}, reverse=True)
    if sum(v is not None for v in shown) < 2:
        return [0] * len(cells)
    places = {value: place for place, value in enumerate(distinct[:2], start=1)}
    return [0 if v is None else places.get(sign * v, 0) for v in shown]


MARKS = {
    "markdown": ("**{}**", "{}", "{} ± {}", MISSING),
    "latex": (r"\textbf{{{}}}", r"\underline{{{}}}", r"{} $\pm$ {}", "--"),
    "table": ("{}*", "{}", "{}±{}", MISSING),
}


DAGGER = {"table": "†", "markdown": "†", "latex": r"$^\dagger$"}


def _cell_text(cell: dict | None, rank: int, style: str) -> str:
    """A cell's text: ``mean ± ci`` (best marked), or a paired difference with its interval;
    ``†`` where a paired comparison found the difference significant."""
    best, second, with_ci, missing = MARKS[style]
    if not cell or cell["mean"] is None:
        return missing
    dagger = DAGGER[style] if cell.get("significant") else ""
    if cell.get("lo") is not None:  # a difference against the reference
        return _difference_text(cell, style) + dagger
    return _value_text(cell, rank, style) + dagger


def _difference_text(cell: dict, style: str) -> str:
    digits = _decimals(cell["metric"], style)
    mean, lo, hi = (f"{cell[k]:+.{digits}f}" for k in ("mean", "lo", "hi"))
    if style == "latex":
        return rf"${mean}$ {{\scriptsize $[{lo}, {hi}]$}}"
    return f"{mean} [{lo}, {hi}]"


def _value_text(cell: dict, rank: int, style: str) -> str:
    best, second, with_ci, _ = MARKS[style]
    digits = _decimals(cell["metric"], style)
    mean = f"{cell['mean']:.{digits}f}"
    with_seeds = (cell.get("n_seeds") or 0) >= 2
    if style == "table":  # the marker follows the whole cell so the numbers stay aligned
        text = with_ci.format(mean, f"{cell['ci95']:.{digits}f}") if with_seeds else mean
        return best.format(text) if rank == 1 else text
    marked = best.format(mean) if rank == 1 else second.format(mean) if rank == 2 else mean
    return with_ci.format(marked, f"{cell['ci95']:.{digits}f}") if with_seeds else marked


def formatted(table: pl.DataFrame, style: str) -> list[list[str]]:
    """Rows of text cells (method label first), best (and second) per column marked."""
    columns = [[_escape(label, style) for label in table["Method"].to_list()]]
    for name in cell_columns(table):
        cells = table[name].to_list()
        digits = _decimals(next((c["metric"] for c in cells if c), None), style)
        differences = any(c and c.get("lo") is not None for c in cells)
        ranks = [0] * len(cells) if differences else _ranks(cells, digits)
        columns.append([_cell_text(c, r, style) for c, r in zip(cells, ranks, strict=True)])
    return [list(row) for row in zip(*columns, strict=True)]


def _escape(text: str, style: str) -> str:
    """Escape LaTeX specials (``_ & % #``) and write arrows as ``$\\to$`` for ``latex``."""
    if style != "latex":
        return text
    for char in "_&%#":
        text = text.replace(char, "\\" + char)
    return text.replace("→", r"$\to$")


def _families(table: pl.DataFrame) -> list[tuple[str, list[int]]]:
    """(family, row indices) in table order; one group when the table has no families."""
    families = table["Family"].to_list() if "Family" in table.columns else [""] * table.height
    out, index = [], 0
    for family, members in groupby(families):
        size = len(list(members))
        out.append((family or "", list(range(index, index + size))))
        index += size
    return out


def _render_md(table: pl.DataFrame) -> str:
    """Markdown: ``mean ± ci`` cells, best per column in bold, a row per family heading."""
    header = ["Method", *cell_columns(table)]
    rows = formatted(table, "markdown")
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    sections = _families(table)
    for family, members in sections:
        if len(sections) > 1:
            lines.append(f"| *{FAMILY_NAMES.get(family, family)}* |" + " |" * (len(header) - 1))
        lines += ["| " + " | ".join(rows[i]) + " |" for i in members]
    return "\n".join(lines) + "\n"


def _render_tex(table: pl.DataFrame) -> str:
    """booktabs LaTeX table grouped like the paper: one multicolumn per eval set."""
    names = cell_columns(table)
    spans, rules, start = [], [], 2
    for group, members in groupby(names, key=lambda name: name.rsplit(" ", 1)[0]):
        width = len(list(members))
        spans.append(rf"\multicolumn{{{width}}}{{c}}{{{_escape(group, 'latex')}}}")
        rules.append(rf"\cmidrule(lr){{{start}-{start + width - 1}}}")
        start += width
    subheads = [_escape(name.rsplit(" ", 1)[-1], "latex") for name in names]
    lines = [rf"\begin{{tabular}}{{l{'c' * len(names)}}}", r"\toprule"]
    lines += ["Method & " + " & ".join(spans) + r" \\", " ".join(rules)]
    lines += [" & " + " & ".join(subheads) + r" \\"]
    rows = formatted(table, "latex")
    sections = _families(table)
    for family, members in sections:
        lines.append(r"\midrule")
        if len(sections) > 1:
            title = FAMILY_NAMES.get(family, family)
            lines.append(rf"\multicolumn{{{len(names) + 1}}}{{l}}{{\textit{{{title}}}}} \\")
        lines += [" & ".join(rows[i]) + r" \\" for i in members]
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"


def _render_csv(table: pl.DataFrame) -> str:
    """CSV: ``Method``, then ``<cell> mean`` and ``<cell> ci95`` per cell (for paired
    differences ``<cell> difference``, ``lo``, ``hi`` and ``significant``), then ``Family``."""
    names = cell_columns(table)
    differences = any(
        c and c.get("lo") is not None for name in names for c in table[name].to_list()
    )
    parts = (("mean", "difference"), ("lo", "lo"), ("hi", "hi"), ("significant", "significant"))
    if not differences:
        parts = (("mean", "mean"), ("ci95", "ci95"))
    fields = [
        pl.col(name).struct.field(part).alias(f"{name} {shown}")
        for name in names
        for part, shown in parts
    ]
    family = ["Family"] if "Family" in table.columns else []
    return table.select("Method", *fields, *family).write_csv()


def table_rows(table: pl.DataFrame) -> list[dict]:
    """The table's rows for a program (``--format json``): per method its label, family and,
    per column as the table heads it, the cell's fields that are set (``mean``, ``ci95``,
    ``n_seeds``, ``metric``; for paired differences ``lo``, ``hi``, ``significant``), in the
    table's units."""
    names = cell_columns(table)
    family = table["Family"].to_list() if "Family" in table.columns else [None] * table.height
    rows = []
    for i, label in enumerate(table["Method"].to_list()):
        cells = {name: table[name][i] for name in names}
        shown = {
            name: {k: v for k, v in cell.items() if v is not None}
            for name, cell in cells.items()
            if cell is not None and cell.get("mean") is not None
        }
        rows.append({"method": label, "family": family[i], "cells": shown})
    return rows


@dataclass(frozen=True)
class TextColumns:
    """The terminal table's column specs, from its headers and formatted cell strings: the
    Method column's labels and width and, per cell column, its cells, its width and the width
    of its trailing marks (best, significant). A block of columns is as wide as their widths
    add up to, so a table is cut into blocks without rendering it."""

    labels: list[str]
    label_width: int
    cells: dict[str, list[str]]
    widths: dict[str, tuple[int, int]]  # name -> (width, of which trailing marks)

    @classmethod
    def of(cls, table: pl.DataFrame) -> TextColumns:
        rows = formatted(table, "table")
        labels = [row[0] for row in rows]
        label_width = min(max([len("Method"), *map(len, labels)]), METHOD_WIDTH)
        cells = {name: [row[i] for row in rows] for i, name in enumerate(cell_columns(table), 1)}
        widths = {}
        for name, column in cells.items():
            marks = max((len(c) - len(c.rstrip(MARKERS)) for c in column), default=0)
            numbers = (len(c.rstrip(MARKERS)) for c in column)
            widths[name] = (max(len(name.rsplit(" ", 1)[-1]), *numbers) + marks, marks)
        return cls(labels, label_width, cells, widths)

    def width(self, names: list[str]) -> int:
        """The widest line of a block of the columns ``names``."""
        return self.label_width + sum(self.widths[name][0] + 1 for name in names)


def text_width(table: pl.DataFrame) -> int:
    """The widest line of ``table`` rendered for a terminal in one block."""
    return TextColumns.of(table).width(cell_columns(table))


def render_text(table: pl.DataFrame, max_width: int | None = MAX_WIDTH) -> str:
    """Aligned plain text for a terminal or a log, at most ``max_width`` characters wide: a
    table too wide is cut into blocks of whole column groups (an eval set's columns stay
    together), each repeating the Method column, one after the other."""
    columns = TextColumns.of(table)
    names = cell_columns(table)
    if max_width is None or columns.width(names) <= max_width:
        return _text_block(table, columns, names)
    blocks: list[list[str]] = [[]]
    for _, members in groupby(names, key=lambda name: name.rsplit(" ", 1)[0]):
        group = list(members)
        pieces = [group] if columns.width(group) <= max_width else [[c] for c in group]
        for piece in pieces:
            if blocks[-1] and columns.width(blocks[-1] + piece) > max_width:
                blocks.append(piece)
            else:
                blocks[-1] = blocks[-1] + piece
    return "\n".join(_text_block(table, columns, block) for block in blocks)


def _text_block(table: pl.DataFrame, columns: TextColumns, names: list[str]) -> str:
    """One aligned block of the columns ``names``: a group header line (eval set) over the
    column names, one section per family, best per column marked ``*``."""
    label_width = columns.label_width
    widths = [columns.widths[name] for name in names]
    groups = [name.rsplit(" ", 1)[0] for name in names]
    top = " " * label_width
    for group, members in groupby(zip(groups, widths, strict=True), key=lambda g: g[0]):
        span = sum(w + 1 for _, (w, _) in members)
        top += " " + _fit(group, span - 1).center(span - 1)
    lines = [top.rstrip()]
    lines.append(
        "Method".ljust(label_width)
        + "".join(
            " " + n.rsplit(" ", 1)[-1].rjust(w) for n, (w, _) in zip(names, widths, strict=True)
        )
    )
    rule = "─" * len(lines[-1])
    sections = _families(table)
    for family, members in sections:
        heading = f"── {FAMILY_NAMES.get(family, family)} "
        lines.append(rule if len(sections) == 1 else _fit(heading, len(rule)).ljust(len(rule), "─"))
        for i in members:
            label = _fit(columns.labels[i], label_width).ljust(label_width)
            cells = "".join(
                " " + _aligned(columns.cells[n][i], *w) for n, w in zip(names, widths, strict=True)
            )
            lines.append((label + cells).rstrip())
    return "\n".join(lines) + "\n"


MARKERS = "*†"  # trailing marks of a cell (best, significant), kept right of the numbers


def _aligned(cell: str, width: int, marks: int) -> str:
    """``cell`` right-aligned in ``width`` with its trailing marks in the last ``marks``
    characters, so the numbers of a column line up whether marked or not."""
    number = cell.rstrip(MARKERS)
    return (
        (number.rjust(width - marks) + cell[len(number) :].ljust(marks))
        if marks
        else cell.rjust(width)
    )


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def render(table: pl.DataFrame, fmt: str) -> str:
    """Render a results table as ``table`` (terminal text), ``markdown``, ``csv``, ``latex``
    (``md`` and ``tex`` are accepted too) or ``json`` (:func:`table_rows`)."""
    renderers = {
        "table": render_text,
        "markdown": _render_md,
        "csv": _render_csv,
        "latex": _render_tex,
        "json": lambda shown: json.dumps(table_rows(shown), indent=1, default=str) + "\n",
    }
    fmt = ALIASES.get(fmt, fmt)
    if fmt not in renderers:
        raise EtnError(f"Unknown table format '{fmt}'. Use one of: {', '.join(RENDER_FORMATS)}.")
    return renderers[fmt](table)
