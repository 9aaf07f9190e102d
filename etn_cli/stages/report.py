"""Stage 4: join a pipeline's metrics files into results tables, ``results.json`` and plots.

Everything lands in ``<data>/reports/<pipeline>/`` (``<pipeline>+<8 hex>/`` for a run with
``--set`` or ``--only``, whose selection ``results.json`` records): the summary table and the
paper's AUPR table (plus the ``--metric`` one) as text, Markdown, CSV and LaTeX;
``results.json``, the long summary a program reads; and the figures (one file per plot kind
and metric, PNG and PDF).
Figures a run no longer draws are removed, so the folder never shows stale results.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl

from etn_cli import progress
from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.metrics.reliability import RELIABILITY_METRICS
from etn_cli.planning.overrides import selection
from etn_cli.planning.plan import MetricsUnit, Plan
from etn_cli.planning.shipped import shown
from etn_cli.provenance import etn_version, now
from etn_cli.report.bootstrap import BOOTSTRAP_SAMPLES
from etn_cli.report.comparison import Comparison, paired_comparison
from etn_cli.report.failures import failures_note, with_failed_rows
from etn_cli.report.frontier import frontier_plot
from etn_cli.report.metric_names import RANKING, SELECTIVE
from etn_cli.report.plot_record import (
    intact_figures,
    read_plot_record,
    replace_views,
    write_plot_record,
)
from etn_cli.report.plots import sweep_plots
from etn_cli.report.reliability import reliability_plot
from etn_cli.report.render import render, table_rows
from etn_cli.report.selective_plot import risk_coverage_plot
from etn_cli.report.summary import Summary
from etn_cli.report.tables import read_metrics
from etn_cli.report.views import footnote, view
from etn_cli.stages.failure_records import plan_failures
from etn_cli.stages.units import holding
from etn_cli.store.artefacts.predictions import predictions_path
from etn_cli.store.artefacts.sealed import repair_line
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import fingerprint_key

# 3: one frontier file per metric, colour-blind palette; 5: sweep plots keep a colour per score,
# swept values as ticks; 6: reliability diagrams; 7: distinct marker shapes, methods sharing
# an accuracy spread sideways; 8: one marker per distinct result, Pareto-front labels, runtime
# only when distinguishable, reliability panels per distinct probabilities, own y-range per sweep,
# risk-coverage curves; 9: one style per method in every figure, a crowded accuracy ranked in
# its own panel, labels that overlap nothing, legends and reference lines explained outside
PLOTS_VERSION = 9
RELIABILITY = "reliability"  # drawn once per report, whatever the --metric
RISK_COVERAGE = "risk-coverage"  # likewise
SUMMARY_VIEW = "summary"  # what every report writes; --metric M and --compare X add a view each
TABLE_FILES = {"table": "txt", "markdown": "md", "csv": "csv", "latex": "tex"}


def metrics_paths(plan: Plan, units: Sequence[MetricsUnit] | None = None) -> list[Path]:
    """The metrics files of the pipeline's current heads (or of ``units``, those a run did not
    fail); stale files of old settings are kept on disk but not reported."""
    units = plan.metrics if units is None else units
    missing = [u.path for u in units if not u.path.is_file()]
    if missing:
        raise EtnError(
            f"{len(missing)} of {len(plan.metrics)} metrics files of pipeline "
            f"{plan.pipeline.name!r} are missing in {plan.data_dir} (first: {missing[0].name}). "
            f"Run `etn run {shown(plan.pipeline.path)}` first (or pass the --data-dir it used)."
        )
    return [u.path for u in units]


def failed_entries(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per metrics key, the method and seed a recorded failure
    (:mod:`etn_cli.stages.failure_records`) left without metrics, as ``results.json`` lists it
    under ``failed``: its own (a scorer refused the test data) or its head's; ``method_seeds``
    are the seeds the method has in the plan."""
    seeds: dict[str, list[int]] = {}
    for unit in plan.metrics:
        seeds.setdefault(unit.head.label, []).append(unit.head.seed)
    found = {}
    for key, failure in plan_failures(plan).items():
        head = next(u.head for u in plan.metrics if u.key == key)
        found[key] = {
            "method": head.head.name, "method_label": head.label, "family": head.head.family,
            "seed": head.seed, "method_seeds": seeds[head.label], "stage": failure.stage,
            "reason": failure.reason, "metrics_key": key,
        }  # fmt: skip
    return found


def table_text(
    summary: Summary, fmt: str, metric: str | None, comparison: Comparison | None = None
) -> str:
    """The ``--metric`` view of ``summary`` in ``fmt``; plain text and Markdown get a footnote
    (with the splits the heads were fitted on and any fallbacks) and, for a
    selective-prediction metric, the overview of them all (AURC, E-AURC, risks) above its
    table; with a paired ``comparison``, cells that differ significantly from its reference
    carry a ``†``; a failed method (an entry of :func:`failed_entries`) without results has a
    ``(failed)`` row, one with results from some seeds a ``‡`` (plain text and Markdown), and
    the footnote says why each failed and how many seeds the marked numbers come from."""
    if fmt == "json":
        return shown_json(summary, metric)
    marked = comparison.marked(summary.frame, metric) if comparison else summary.frame
    table = view(marked, metric)
    failed, fitted_on = summary.failed, summary.fitted_on
    with_notes = fmt in ("table", "markdown")
    if failed:
        table = with_failed_rows(table, failed, summary.shown, mark=with_notes)
    body = render(table, fmt)
    if with_notes:
        if metric in SELECTIVE:
            body = render(view(marked, "selective"), fmt) + "\n" + body
        note = footnote(table, metric) + (f"\n{fitted_on}" if fitted_on else "")
        note += f"\n{failures_note(failed, summary.shown)}" if failed else ""
        note += f"\n{comparison.note()}" if comparison else ""
        return body + ("\n" + note if fmt == "table" else "\n" + _md_note(note)) + "\n"
    return body


def _md_note(note: str) -> str:
    return "\n".join(line.replace("*", r"\*", 1) for line in note.splitlines())


def shown_json(summary: Summary, metric: str | None, comparison: Comparison | None = None) -> str:
    """What the printed table shows, for a program (``--format json``): per method and column
    the mean and 95% CI half-width in the table's units (its footnote says which), and with a
    ``comparison`` its differences likewise; ``--rows`` gives every row instead
    (:func:`results_json`)."""
    frame = summary.frame
    table = view(comparison.marked(frame, metric) if comparison else frame, metric)
    record = {
        "pipeline": frame["pipeline"][0],
        "view": metric or "summary",
        "footnote": footnote(table, metric).splitlines(),
        "rows": table_rows(table),
    }
    if comparison is not None:
        compared = comparison.view_table(metric)
        record["comparison"] = {"reference": comparison.reference, "rows": table_rows(compared)}
    return json.dumps(record, indent=1, default=str)


def results_json(summary: Summary, extra: dict | None = None) -> str:
    """Per method, metric, score and eval set: mean, 95% CI half-width, seeds, rows of the
    eval set; with how it was made."""
    rows = summary.frame.filter(~pl.col("metric").is_in(RELIABILITY_METRICS)).select(
        "pipeline", "backbone", "id_dataset", "eval_set", "task", "method", "method_label",
        "variant", "family", "metric", "score", "mean", pl.col("ci95").alias("ci95_half_width"),
        "n_seeds", "seeds", "note",
    ).to_dicts()  # fmt: skip
    record = {"etn_version": etn_version(), "created_at": now(), **(extra or {}), "results": rows}
    return json.dumps(record, indent=1, default=str)


def report(
    plan: Plan,
    *,
    fmt: str = "table",
    metric: str | None = None,
    compare: str | None = None,
    bootstrap: int = BOOTSTRAP_SAMPLES,
    rows: bool = False,
) -> tuple[str, list[Path], list[dict[str, Any]]]:
    """Write the pipeline's tables, results.json and plots under ``reports/<pipeline>/`` and
    return the table in ``fmt``, the paths written (unchanged plots are not redrawn) and the
    failed entries (:func:`failed_entries`). ``compare`` names a reference method for paired
    comparisons (``bootstrap`` replicates), whose table follows the results table. ``rows``
    with ``fmt="json"`` returns every result row (``results.json``) instead of the table's
    cells. A method whose unit has a failure record is reported as failed, with the reason;
    any other missing metrics file refuses the report."""
    failed_by_key = failed_entries(plan)
    failed = list(failed_by_key.values())
    units = [u for u in plan.metrics if u.key not in failed_by_key]
    if not units:
        return (*every_method_failed(plan, failed), failed)
    name = plan.pipeline.name
    with progress.step("report", f"{name}: summary of {len(units)} metrics files"):
        metrics = with_shift_groups(read_metrics(metrics_paths(plan, units)), plan)
        summary = Summary.of(metrics, failed)
    comparison = None
    if compare is not None:
        predicted = [predictions_path(u.path) for u in units]
        with progress.step("report", f"{name}: paired bootstrap against {compare}"):
            comparison = paired_comparison(summary, predicted, compare, bootstrap)
    folder = report_folder(plan)
    folder.mkdir(parents=True, exist_ok=True)
    with holding(folder):  # one report at a time writes this folder
        made: dict[str, list[Path]] = {}  # view -> the files this report wrote for it
        for view_name, stem, wanted in _tables(summary.frame, metric):
            text = partial(table_text, summary, metric=wanted, comparison=comparison)
            made.setdefault(view_name, []).extend(_write_table(folder, stem, text))
        if comparison is not None:
            stem = f"compare-{comparison.slug}" + (f"-{metric}" if metric else "")
            made[stem] = _write_table(folder, stem, partial(comparison.table_text, metric=metric))
        extra = {
            "pipeline_file": str(plan.pipeline.path),
            "selection": selection(
                plan.pipeline.overrides, plan.pipeline.only, plan.pipeline.selection_key
            ),
            "metrics_keys": [u.key for u in units],
            "failed": failed,
        }
        if comparison is not None:
            extra["comparisons"] = comparison.records()
        atomic_write_text(folder / "results.json", results_json(summary, extra))
        made[SUMMARY_VIEW].append(folder / "results.json")
        record = earlier_record(folder)
        with progress.step("report", f"{name}: plots"):
            plots, drawn, key = _plots(units, summary, folder, metric, record)
        for kind, paths in plots.items():  # the frontier of --metric auroc is auroc's view
            made.setdefault(kind if kind == metric and kind != "aupr" else SUMMARY_VIEW, []).extend(
                paths
            )
        views = replace_views(folder, record, {v: [p.name for p in ps] for v, ps in made.items()})
        kept = {name for names in views.values() for name in names}
        drawn = {kind: names for kind, names in drawn.items() if set(names) <= kept}
        write_plot_record(folder, key, drawn, views)
    written = [path for paths in made.values() for path in paths]
    if fmt == "json":
        shown = results_json(summary, extra) if rows else shown_json(summary, metric, comparison)
        return shown, written, failed
    shown = table_text(summary, fmt, metric, comparison)
    if comparison is not None:
        shown = shown.rstrip("\n") + "\n\n" + comparison.table_text(fmt, metric)
    return shown, written, failed


def every_method_failed(plan: Plan, failed: list[dict]) -> tuple[str, list[Path]]:
    """No table to draw: ``results.json`` lists the failures only, and the text says why."""
    folder = report_folder(plan)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"etn_version": etn_version(), "created_at": now(), "results": [], "failed": failed}
    atomic_write_text(folder / "results.json", json.dumps(record, indent=1, default=str))
    return f"No results: every method failed.\n{failures_note(failed)}\n", [folder / "results.json"]


def _write_table(folder: Path, stem: str, text: Callable[[str], str]) -> list[Path]:
    """``<stem>.txt``, ``.md``, ``.csv`` and ``.tex``, each ``text(format)``."""
    paths = []
    for each, suffix in TABLE_FILES.items():
        atomic_write_text(folder / f"{stem}.{suffix}", text(each))
        paths.append(folder / f"{stem}.{suffix}")
    return paths


def _tables(summary: pl.DataFrame, metric: str | None) -> list[tuple[str, str, str | None]]:
    """(view, file stem, table) of every table a report writes: the summary view's summary,
    the paper's AUPR, calibration, selective prediction and conformal sets (when evaluated);
    the ``--metric`` view's own table when it is none of those."""
    tables = [("summary", None), ("aupr", "aupr"), ("calibration", "ece")]
    tables.append(("selective", "selective"))
    if summary.filter(pl.col("metric") == "coverage").height:
        tables.append(("conformal", "coverage"))
    named = {wanted for _, wanted in tables}
    own = [(metric, metric, metric)] if metric is not None and metric not in named else []
    return [(SUMMARY_VIEW, name, wanted) for name, wanted in tables] + own


def _plots(
    units: list[MetricsUnit], summary: Summary, folder: Path, metric: str | None, record: dict
) -> tuple[dict[str, list[Path]], dict, str]:
    """Draw the sweep and frontier plots (per ranking metric) and the reliability diagrams
    unless ``record`` says these exact metrics were drawn already; returns the paths per plot
    kind, what the record says was drawn (this report's kinds and, from the same metrics,
    earlier ones), and the metrics' key."""
    wanted = ["aupr"] + ([metric] if metric in RANKING and metric != "aupr" else [])
    key = fingerprint_key({"metrics": [u.key for u in units], "plots": PLOTS_VERSION})
    drawn = dict(record.get("drawn", {})) if record.get("key") == key else {}
    files: dict[str, list[Path]] = {}

    def ranking(name: str):
        return lambda: sweep_plots(summary, folder, name) + frontier_plot(summary, folder, name)

    plots = {name: ranking(name) for name in wanted}
    plots[RELIABILITY] = lambda: reliability_plot(summary, folder)
    rows = {u.key: predictions_path(u.path) for u in units}
    plots[RISK_COVERAGE] = lambda: risk_coverage_plot(summary, rows, folder)
    for name, draw in plots.items():
        paths = [folder / f for f in drawn.get(name, [])]
        if not intact_figures(folder, record, drawn.get(name, [])):
            paths = draw()
        drawn[name] = [p.name for p in paths]
        files[name] = paths
    return files, drawn, key


def earlier_record(folder: Path) -> dict:
    """The ``plots.json`` the last report of this folder wrote; a damaged one is said in one
    ``repair:`` line and taken as none, so every figure is drawn again and only files of the
    folder itself are cleaned up (:mod:`etn_cli.report.plot_record`)."""
    try:
        return read_plot_record(folder)
    except DamagedArtefact as damage:
        progress.say(repair_line(damage, "Redrawing every figure."))
        return {}


def with_shift_groups(metrics: pl.DataFrame, plan: Plan) -> pl.DataFrame:
    """With ``[data] grouping = "openood"``, each OOD set's rows join the group of its kind of
    shift (``semantic`` or ``covariate``, declared by its dataset), averaged in the tables as
    ``semantic-OOD`` and ``covariate-OOD``; ``<id>-OOD`` stays the paper's average of all."""
    data = plan.pipeline.data
    if data is None or data.grouping == "paper":
        return metrics
    from etn_cli.datasets import datasets

    kinds = {unit.name: datasets.get(unit.dataset).shift for unit in plan.ood}
    group = pl.col("eval_set").replace_strict(kinds, default=None, return_dtype=pl.String)
    return metrics.with_columns(group.fill_null(pl.col("ood_group")).alias("ood_group"))


def report_folder(plan: Plan) -> Path:
    """Where a pipeline's tables and plots go: ``<data>/reports/<pipeline>/``, or for a run
    whose ``--set`` or ``--only`` change it ``<data>/reports/<pipeline>+<8 hex>/``, keyed by
    the pipeline they give, so a subset or an override never overwrites the full pipeline's
    report and two different effects never share a folder."""
    key = plan.pipeline.selection_key
    name = plan.pipeline.name if key is None else f"{plan.pipeline.name}+{key}"
    return plan.data_dir / "reports" / name


def written_lines(written: list[Path]) -> list[str]:
    """The closing lines of ``etn run`` about its report, as ``etn report`` names what it wrote
    (``wrote /abs/path``): the main table and ``results.json``, then the folder for the rest."""
    main = [p for p in written if p.name in ("summary.txt", "results.json")]
    lines = [f"wrote {p.resolve()}" for p in main]
    rest = len(written) - len(main)
    if rest:
        folder = written[0].parent.resolve()
        lines.append(f"wrote {rest} more tables and plots in {folder}/ (etn report lists them)")
    return lines


def report_files(
    paths: list[Path], *, fmt: str = "table", metric: str | None = None, rows: bool = False
) -> str:
    """Render tables straight from metrics Parquet files (any source, one table per setting;
    ``rows``: see :func:`report`)."""
    summary = Summary.of(read_metrics(paths))
    if fmt == "json" and rows:
        return results_json(summary)
    parts = summary.parts()
    if fmt == "json":  # one document: a list of the settings' tables
        shown = [json.loads(shown_json(part, metric)) for _, part in parts]
        return json.dumps(shown[0] if len(shown) == 1 else shown, indent=1)
    rendered = []
    for (pipeline, backbone), part in parts:
        title = f"{pipeline} ({backbone})"
        body = table_text(part, fmt, metric)
        rendered.append(body if len(parts) == 1 or fmt == "csv" else f"{title}\n\n{body}")
    return "\n\n".join(rendered)
