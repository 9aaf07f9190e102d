"""Stage 4: join a pipeline's metrics files into the paper's tables."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from etn_cli.errors import EtnError
from etn_cli.plan import Plan
from etn_cli.report.plots import frontier_plot, sweep_plots
from etn_cli.report.tables import paper_table, read_metrics, render, summarize
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import fingerprint_key

PLOTS_VERSION = 2  # bump when the plots change for the same metrics

TABLE_FORMATS = ("md", "csv", "tex")


def metrics_paths(plan: Plan) -> list[Path]:
    """The metrics files of the pipeline's current heads; stale files of old settings are
    kept on disk but not reported."""
    missing = [u.path for u in plan.metrics if not u.path.is_file()]
    if missing:
        raise EtnError(
            f"{len(missing)} of {len(plan.metrics)} metrics files of pipeline "
            f"{plan.pipeline.name!r} are missing (first: {missing[0]}). Run `etn evaluate "
            f"{plan.pipeline.path}` (or `etn run`) first."
        )
    return [u.path for u in plan.metrics]


def report(plan: Plan, *, fmt: str = "md", metric: str = "aupr") -> tuple[str, list[Path]]:
    """Render the pipeline's table, keep md/csv/tex copies under ``reports/<pipeline>/`` and
    draw the ablation plots of swept heads there (PNG and PDF). Returns the table and the plot
    paths; plots of unchanged metrics are not redrawn."""
    if fmt not in TABLE_FORMATS:
        raise EtnError(f"Unknown table format {fmt!r}. Use one of: {', '.join(TABLE_FORMATS)}.")
    metrics = read_metrics(metrics_paths(plan))
    table = paper_table(summarize(metrics), metric)
    folder = report_folder(plan)
    folder.mkdir(parents=True, exist_ok=True)
    for each in TABLE_FORMATS:
        atomic_write_text(folder / f"{metric}.{each}", render(table, each))
    return render(table, fmt), _plots(plan, metrics, folder, metric)


def _plots(plan: Plan, metrics: pl.DataFrame, folder: Path, metric: str) -> list[Path]:
    """Draw the sweep plots unless a stamp says these exact metrics files were drawn already."""
    stamp = folder / f"plots-{metric}.json"
    key = fingerprint_key({"metrics": [u.key for u in plan.metrics], "plots": PLOTS_VERSION})
    if stamp.is_file():
        record = json.loads(stamp.read_text())
        paths = [folder / name for name in record["files"]]
        if record["key"] == key and all(p.is_file() for p in paths):
            return paths
    paths = sweep_plots(metrics, folder, metric) + frontier_plot(metrics, folder, metric)
    atomic_write_text(stamp, json.dumps({"key": key, "files": [p.name for p in paths]}))
    return paths


def report_folder(plan: Plan) -> Path:
    """Where a pipeline's tables and plots go: ``<data>/reports/<pipeline>/``."""
    return plan.data_dir / "reports" / plan.pipeline.name


def report_files(paths: list[Path], *, fmt: str = "md", metric: str = "aupr") -> str:
    """Render tables straight from metrics Parquet files (any source, one table per setting)."""
    from etn_cli.report.tables import split_by_backbone

    summary = summarize(read_metrics(paths))
    parts = split_by_backbone(summary)
    rendered = []
    for (pipeline, backbone), part in parts.items():
        title = f"{pipeline} ({backbone})"
        body = render(paper_table(part, metric), fmt)
        rendered.append(body if len(parts) == 1 or fmt == "csv" else f"{title}\n\n{body}")
    return "\n\n".join(rendered)
