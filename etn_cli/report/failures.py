"""The methods a run could not score, because a unit refused its data (a head refusing its fit
split in ``train``, a scorer refusing the test set in ``evaluate``): their rows in the results
tables (``failed``, no numbers; ``‡`` on a method that kept results from some seeds) and the
footnote that says why, from the entries ``results.json`` lists under ``failed``
(:func:`etn_cli.stages.report.failed_entries`). A method is never silently absent from a report,
nor silently short of a seed."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import polars as pl

FAILED = "failed"  # what a method's row says in place of its numbers
PARTIAL = "‡"  # ends the row of a method whose numbers lack a failed seed († marks cells)


def with_failed_rows(
    table: pl.DataFrame, failed: Sequence[dict], shown: Sequence[str], *, mark: bool = False
) -> pl.DataFrame:
    """``table`` with a row ``<label> (failed)`` and no numbers for every failed method that
    has no results at all (``shown``: the labels with results), after its family's rows; with
    ``mark``, the rows of a method some of whose seeds failed end in :data:`PARTIAL`, their
    numbers coming from the other seeds (:func:`failures_note` says how many)."""
    if mark:
        table = with_partial_marks(table, {e["method_label"] for e in failed} & set(shown))
    labels = dict.fromkeys(e["method_label"] for e in failed if e["method_label"] not in shown)
    for label in labels:
        family = next(e["family"] for e in failed if e["method_label"] == label)
        row = {"Method": f"{label} ({FAILED})"}
        if "Family" in table.columns:
            row["Family"] = family
        extra = pl.DataFrame([row]).with_columns(
            pl.lit(None, dtype=table.schema[name]).alias(name)
            for name in table.columns
            if name not in row
        )
        families = table["Family"].to_list() if "Family" in table.columns else []
        at = max((i + 1 for i, f in enumerate(families) if f == family), default=table.height)
        table = pl.concat([table.head(at), extra.select(table.columns), table.slice(at)])
    return table


def with_partial_marks(table: pl.DataFrame, labels: set[str]) -> pl.DataFrame:
    """``table`` with :data:`PARTIAL` after the Method of every row of a method in ``labels``
    (``Mahalanobis`` or, when labels repeat, ``Mahalanobis [mahalanobis/x]``)."""
    marked = [
        f"{method} {PARTIAL}" if any(_is_row_of(method, label) for label in labels) else method
        for method in table["Method"].to_list()
    ]
    return table.with_columns(pl.Series("Method", marked, dtype=pl.String))


def _is_row_of(method: str, label: str) -> bool:
    return method == label or method.startswith(f"{label} [")


def failures_note(failed: Sequence[dict], shown: Sequence[str] = ()) -> str | None:
    """``Failed (a rerun retries it): SHE seed 0 in train: SHE stores the mean of …``, one
    paragraph per failed method and seed without results; for a method with results from its
    other seeds (in ``shown``) one paragraph ``‡ SHE: 2 of 3 seeds; seed 1 failed in train:
    …``, its numbers being those seeds' only."""
    whole = [e for e in failed if e["method_label"] not in shown]
    lines = [
        f"Failed (a rerun retries it): {e['method_label']} seed {e['seed']} in {e['stage']}: "
        f"{e['reason']}"
        for e in whole
    ]
    partial = [e for e in failed if e["method_label"] in shown]
    for label in dict.fromkeys(e["method_label"] for e in partial):
        mine = [e for e in partial if e["method_label"] == label]
        seeds = len(mine[0]["method_seeds"])
        why = "; ".join(f"seed {e['seed']} failed in {e['stage']}: {e['reason']}" for e in mine)
        lines.append(f"{PARTIAL} {label}: {seeds - len(mine)} of {seeds} seeds; {why}")
    wrap = dict(width=80, break_long_words=False, break_on_hyphens=False)
    return "\n".join(textwrap.fill(line, **wrap) for line in lines) or None


def failed_units_line(failed: Sequence[dict], pipeline: object) -> str:
    """``1 unit failed (train Mahalanobis seed 0), reported with its reason; `etn run P`
    retries only the failed unit.``: what ``etn report`` says on stderr of a report with
    failures."""
    n = len(failed)
    names = ", ".join(f"{e['stage']} {e['method_label']} seed {e['seed']}" for e in failed[:3])
    units = "unit" if n == 1 else "units"
    return (
        f"{n} {units} failed ({names}{', …' * (n > 3)}), reported with the reason; "
        f"`etn run {pipeline}` retries only the failed {units}."
    )
