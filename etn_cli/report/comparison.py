"""What ``etn report --compare METHOD`` adds to a report: the paired differences of
:mod:`etn_cli.report.paired` as tables (``compare-<method>.{txt,md,csv,tex}``), a ``†`` on
every cell of the results tables that differs significantly from the reference, and a
``comparisons`` list in ``results.json``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from etn_cli.report.bootstrap import Resamples, load_predictions
from etn_cli.report.paired import PAIRINGS, compare, find_reference
from etn_cli.report.render import render
from etn_cli.report.summary import Summary
from etn_cli.report.tables import SEED_KEYS
from etn_cli.report.views import footnote, view


@dataclass
class Comparison:
    """The paired differences of every method against ``reference``, one frame per pairing
    of scores (``headline`` for the summary, ``same`` for one-metric tables)."""

    reference: str
    frames: dict[str, pl.DataFrame]
    samples: int

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.reference.lower()).strip("-") or "reference"

    def frame(self, metric: str | None) -> pl.DataFrame:
        return self.frames["headline" if metric is None else "same"]

    def marked(self, summary: pl.DataFrame, metric: str | None) -> pl.DataFrame:
        """``summary`` with a ``significant`` column: True where the cell differs from the
        reference's with 95% confidence (null where there is no pair)."""
        flags = self.frame(metric).select(*SEED_KEYS, "significant")
        return summary.join(flags, on=SEED_KEYS, how="left", nulls_equal=True)

    def note(self) -> str:
        return (
            f"† differs from {self.reference}: the 95% paired bootstrap interval of the "
            f"difference excludes 0 (compare-{self.slug}.*)."
        )

    def view_table(self, metric: str | None) -> pl.DataFrame:
        """The differences, laid out as the ``metric`` view."""
        frame = self.frame(metric).with_columns(pl.lit(None, pl.Float64).alias("ci95"))
        return view(frame, metric)

    def table_text(self, fmt: str, metric: str | None) -> str:
        """The differences, laid out as the ``metric`` view, in ``fmt`` (a note under the
        plain-text and Markdown tables says how to read them)."""
        table = self.view_table(metric)
        body = render(table, fmt)
        if fmt not in ("table", "markdown"):
            return body
        lines = [
            f"Paired difference, method - {self.reference}, with its 95% bootstrap interval "
            f"({self.samples} replicates):",
            "the test rows are drawn with replacement (the same rows for both methods and every",
            "seed; each OOD set apart), and the seeds too where there are two or more. † the",
            "interval excludes 0. Units as in the results table (points of %, ‰ for AURC);",
            "lower is better for FPR95, ECE, NLL, Brier, AURC, risks and set size.",
        ]
        lines += footnote(table, metric).splitlines()[1:]  # its units and scores, not seeds
        text = "\n".join(lines)
        return body + "\n" + (text if fmt == "table" else text.replace("*", r"\*")) + "\n"

    def records(self) -> list[dict]:
        """Every paired difference for ``results.json`` (both pairings, each pair once)."""
        frame = pl.concat([self.frames[p] for p in PAIRINGS], how="vertical_relaxed")
        keys = [*SEED_KEYS, "reference_score"]
        frame = frame.unique(subset=keys, keep="first", maintain_order=True)
        return frame.select(
            "eval_set", "task", "method", "method_label", "variant", "family", "metric", "score",
            "reference", "reference_score", pl.col("mean").alias("difference"),
            pl.col("lo").alias("ci95_low"), pl.col("hi").alias("ci95_high"), "significant",
            "n_seeds", "seeds", "per_seed",
        ).to_dicts()  # fmt: skip


def paired_comparison(
    summary: Summary, prediction_paths: list[Path], reference: str, samples: int
) -> Comparison:
    """The comparison of every method in ``summary`` with the one ``reference`` names."""
    key = find_reference(summary.frame, reference)
    predictions = load_predictions(prediction_paths, summary.metrics)
    draws = Resamples(samples)
    frames = {p: compare(summary.frame, predictions, key, p, draws) for p in PAIRINGS}
    return Comparison(key[1], frames, samples)
