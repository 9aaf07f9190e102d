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
import textwrap
from pathlib import Path

import polars as pl

from etn_cli import progress
from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.metrics.reliability import RELIABILITY_METRICS
from etn_cli.planning.overrides import selection
from etn_cli.planning.plan import Plan
from etn_cli.provenance import etn_version, now
from etn_cli.report.bootstrap import BOOTSTRAP_SAMPLES
from etn_cli.report.comparison import Comparison, paired_comparison
from etn_cli.report.frontier import frontier_plot
from etn_cli.report.plot_record import intact_figures, read_plot_record, write_plot_record
from etn_cli.report.plots import sweep_plots
from etn_cli.report.reliability import reliability_plot
from etn_cli.report.render import render
from etn_cli.report.selective_plot import risk_coverage_plot
from etn_cli.report.tables import read_metrics, summarize
from etn_cli.report.views import footnote, view
from etn_cli.store.artefacts.predictions import predictions_path
from etn_cli.store.artefacts.sealed import repair_line
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import fingerprint_key

# 3: one frontier file per metric, colour-blind palette; 5: sweep plots keep a colour per score,
# swept values as ticks; 6: reliability diagrams; 7: distinct marker shapes, methods sharing
# an accuracy spread sideways; 8: one marker per distinct result, Pareto-front labels, runtime
# only when distinguishable, reliability panels per distinct probabilities, own y-range per sweep,
# risk-coverage curves
PLOTS_VERSION = 8
RELIABILITY = "reliability"  # drawn once per report, whatever the --metric
RISK_COVERAGE = "risk-coverage"  # likewise
TABLE_FILES = {"table": "txt", "markdown": "md", "csv": "csv", "latex": "tex"}
REPORT_SUFFIXES = (".txt", ".md", ".csv", ".tex", ".png", ".pdf")


def metrics_paths(plan: Plan) -> list[Path]:
    """The metrics files of the pipeline's current heads; stale files of old settings are
    kept on disk but not reported."""
    missing = [u.path for u in plan.metrics if not u.path.is_file()]
    if missing:
        raise EtnError(
            f"{len(missing)} of {len(plan.metrics)} metrics files of pipeline "
            f"{plan.pipeline.name!r} are missing in {plan.data_dir} (first: {missing[0].name}). "
            f"Run `etn run {plan.pipeline.path}` first (or pass the --data-dir it used)."
        )
    return [u.path for u in plan.metrics]


def table_text(
    summary: pl.DataFrame,
    fmt: str,
    metric: str | None,
    fitted_on: str | None = None,
    comparison: Comparison | None = None,
) -> str:
    """The ``--metric`` view of ``summary`` in ``fmt``; plain text and Markdown get a footnote
    (with ``fitted_on``, the splits the heads were fitted on and any fallbacks, when given);
    with a paired ``comparison``, cells that differ significantly from its reference carry a
    ``†``."""
    if fmt == "json":
        return results_json(summary)
    table = view(comparison.marked(summary, metric) if comparison else summary, metric)
    body = render(table, fmt)
    if fmt in ("table", "markdown"):
        note = footnote(table, metric) + (f"\n{fitted_on}" if fitted_on else "")
        note += f"\n{comparison.note()}" if comparison else ""
        return body + ("\n" + note if fmt == "table" else "\n" + _md_note(note)) + "\n"
    return body


def notes(metrics: pl.DataFrame) -> str | None:
    """The footnote's lines on how the heads were fitted: the splits, and any fallbacks."""
    lines = [note for note in (fit_splits_note(metrics), fallbacks_note(metrics)) if note]
    return "\n".join(lines) or None


def fit_splits_note(metrics: pl.DataFrame) -> str | None:
    """``Fitted on digits:train (760 rows): 17 methods; digits:adapt (190 rows): 15.``: which
    split the heads were fitted on (post-hoc scorers use ``[data] fit`` for ID statistics),
    from the ``fit_split`` column the metrics files record; None for files without it."""
    if "fit_split" not in metrics.columns:
        return None
    counts = (
        metrics.filter(pl.col("fit_split").is_not_null())
        .group_by("fit_split", maintain_order=True)
        .agg(pl.col("method_label").n_unique().alias("n"))
        .sort("n", descending=True, maintain_order=True)
    )
    parts = [f"{split}: {n} method{'s' * (n != 1)}" for split, n in counts.iter_rows()]
    return f"Fitted on {'; '.join(parts)}." if parts else None


def fallbacks_note(metrics: pl.DataFrame) -> str | None:
    """``Fell back to a rule (no finite adaptation-NLL optimum): Temperature scaling (T by
    Laplace's rule).``: the methods whose fitted temperature is a fallback rule's rather than
    the NLL's minimiser (:mod:`etn_cli.heads.calibration`), from the ``fit_fallback`` column;
    None when there are none or the files predate it."""
    if "fit_fallback" not in metrics.columns:
        return None
    fell = (
        metrics.filter(pl.col("fit_fallback").is_not_null())
        .select("method_label", "fit_fallback")
        .unique(maintain_order=True)
        .group_by("method_label", maintain_order=True)
        .agg(pl.col("fit_fallback").unique(maintain_order=True))
    )
    parts = [f"{label} ({'; '.join(rules)})" for label, rules in fell.iter_rows()]
    if not parts:
        return None
    line = f"Fell back to a rule (no finite adaptation-NLL optimum): {', '.join(parts)}."
    return textwrap.fill(line, width=80, break_long_words=False, break_on_hyphens=False)


def _md_note(note: str) -> str:
    return "\n".join(line.replace("*", r"\*", 1) for line in note.splitlines())


def results_json(summary: pl.DataFrame, extra: dict | None = None) -> str:
    """Per method, metric, score and eval set: mean, 95% CI half-width, seeds, rows of the
    eval set; with how it was made."""
    rows = summary.filter(~pl.col("metric").is_in(RELIABILITY_METRICS)).select(
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
) -> tuple[str, list[Path]]:
    """Write the pipeline's tables, results.json and plots under ``reports/<pipeline>/`` and
    return the table in ``fmt`` with the paths written (unchanged plots are not redrawn).
    ``compare`` names a reference method for paired comparisons (``bootstrap`` replicates),
    whose table follows the results table."""
    metrics = with_shift_groups(read_metrics(metrics_paths(plan)), plan)
    summary = summarize(metrics)
    fitted_on = notes(metrics)
    comparison = None
    if compare is not None:
        rows = [predictions_path(u.path) for u in plan.metrics]
        comparison = paired_comparison(summary, metrics, rows, compare, bootstrap)
    folder = report_folder(plan)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, wanted in _tables(summary, metric):
        for each, suffix in TABLE_FILES.items():
            path = folder / f"{name}.{suffix}"
            atomic_write_text(path, table_text(summary, each, wanted, fitted_on, comparison))
            written.append(path)
    if comparison is not None:
        stem = f"compare-{comparison.slug}" + (f"-{metric}" if metric else "")
        for each, suffix in TABLE_FILES.items():
            path = folder / f"{stem}.{suffix}"
            atomic_write_text(path, comparison.table_text(each, metric))
            written.append(path)
    extra = {
        "pipeline_file": str(plan.pipeline.path),
        "selection": selection(
            plan.pipeline.overrides, plan.pipeline.only, plan.pipeline.selection_key
        ),
        "metrics_keys": [u.key for u in plan.metrics],
    }
    if comparison is not None:
        extra["comparisons"] = comparison.records()
    atomic_write_text(folder / "results.json", results_json(summary, extra))
    written.append(folder / "results.json")
    record = earlier_record(folder)
    plots, drawn, key = _plots(plan, metrics, folder, metric, record)
    written += plots
    names = {p.name for p in written}
    for old in _earlier_files(folder, record):  # a table or plot this report no longer makes
        if old.name not in names:
            old.unlink(missing_ok=True)
    write_plot_record(folder, key, drawn, sorted(names))
    if fmt == "json":
        return results_json(summary, extra), written
    shown = table_text(summary, fmt, metric, fitted_on, comparison)
    if comparison is not None:
        shown = shown.rstrip("\n") + "\n\n" + comparison.table_text(fmt, metric)
    return shown, written


def _tables(summary: pl.DataFrame, metric: str | None) -> list[tuple[str, str | None]]:
    """(file stem, view) of every table a report writes: the summary, the paper's AUPR,
    calibration, selective prediction, conformal sets (when evaluated) and the ``--metric``."""
    tables = [("summary", None), ("aupr", "aupr"), ("calibration", "ece")]
    tables.append(("selective", "selective"))
    if summary.filter(pl.col("metric") == "coverage").height:
        tables.append(("conformal", "coverage"))
    named = {wanted for _, wanted in tables}
    return tables + ([(metric, metric)] if metric is not None and metric not in named else [])


def _plots(
    plan: Plan, metrics: pl.DataFrame, folder: Path, metric: str | None, record: dict
) -> tuple[list[Path], dict, str]:
    """Draw the sweep and frontier plots (per ranking metric) and the reliability diagrams
    unless ``record`` says these exact metrics were drawn already; returns the paths, what was
    drawn per plot kind, and the metrics' key."""
    from etn_cli.report.views import RANKING

    wanted = ["aupr"] + ([metric] if metric in RANKING and metric != "aupr" else [])
    key = fingerprint_key({"metrics": [u.key for u in plan.metrics], "plots": PLOTS_VERSION})
    drawn = record.get("drawn", {}) if record.get("key") == key else {}
    files: list[Path] = []

    def ranking(name: str):
        return lambda: sweep_plots(metrics, folder, name) + frontier_plot(metrics, folder, name)

    plots = {name: ranking(name) for name in wanted}
    plots[RELIABILITY] = lambda: reliability_plot(metrics, folder)
    rows = {u.key: predictions_path(u.path) for u in plan.metrics}
    plots[RISK_COVERAGE] = lambda: risk_coverage_plot(metrics, rows, folder)
    for name, draw in plots.items():
        paths = [folder / f for f in drawn.get(name, [])]
        if not intact_figures(folder, record, drawn.get(name, [])):
            paths = draw()
        drawn[name] = [p.name for p in paths]
        files += paths
    return files, {name: drawn[name] for name in plots}, key


def earlier_record(folder: Path) -> dict:
    """The ``plots.json`` the last report of this folder wrote; a damaged one is said in one
    ``repair:`` line and taken as none, so every figure is drawn again and only files of the
    folder itself are cleaned up (:mod:`etn_cli.report.plot_record`)."""
    try:
        return read_plot_record(folder)
    except DamagedArtefact as damage:
        progress.say(repair_line(damage, "Redrawing every figure."))
        return {}


def _earlier_files(folder: Path, record: dict) -> list[Path]:
    """Files an earlier report wrote: those in its record, and the unversioned names of
    older etn (``frontier.png``, ``plots-<metric>.json``, ``<metric>.md`` …)."""
    named = [folder / f for f in record.get("files", [])]
    legacy = [*folder.glob("frontier.p[nd][gf]"), *folder.glob("plots-*.json")]
    if "files" not in record:  # tables and plots of an etn that kept no list of them
        legacy += [p for p in folder.iterdir() if p.is_file() and p.suffix in REPORT_SUFFIXES]
    return named + legacy


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


def report_files(paths: list[Path], *, fmt: str = "table", metric: str | None = None) -> str:
    """Render tables straight from metrics Parquet files (any source, one table per setting)."""
    from etn_cli.report.tables import split_by_backbone

    metrics = read_metrics(paths)
    summary = summarize(metrics)
    fitted_on = notes(metrics)
    if fmt == "json":
        return results_json(summary)
    parts = split_by_backbone(summary)
    rendered = []
    for (pipeline, backbone), part in parts.items():
        title = f"{pipeline} ({backbone})"
        body = table_text(part, fmt, metric, fitted_on)
        rendered.append(body if len(parts) == 1 or fmt == "csv" else f"{title}\n\n{body}")
    return "\n\n".join(rendered)
