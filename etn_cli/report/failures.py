"""The methods a run could not score, because a unit refused its data (a head refusing its fit
split in ``train``, a scorer refusing the test set in ``evaluate``): their rows in the results
tables (``failed``, no numbers) and the footnote that says why, from the entries ``results.json``
lists under ``failed`` (:func:`etn_cli.stages.report.failed_entries`). A method is never
silently absent from a report."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import polars as pl

FAILED = "failed"  # what a method's row says in place of its numbers


def with_failed_rows(
    table: pl.DataFrame, failed: Sequence[dict], shown: Sequence[str]
) -> pl.DataFrame:
    """``table`` with a row ``<label> (failed)`` and no numbers for every failed method that
    has no results at all (``shown``: the labels with results), after its family's rows."""
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


def failures_note(failed: Sequence[dict]) -> str | None:
    """``Failed (a rerun retries it): SHE seed 0 in train: SHE stores the mean of …``, one
    paragraph per failed method and seed."""
    lines = [
        f"Failed (a rerun retries it): {e['method_label']} seed {e['seed']} in {e['stage']}: "
        f"{e['reason']}"
        for e in failed
    ]
    wrap = dict(width=80, break_long_words=False, break_on_hyphens=False)
    return "\n".join(textwrap.fill(line, **wrap) for line in lines) or None
