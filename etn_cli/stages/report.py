"""Stage 4: join a pipeline's metrics files into the paper's tables."""

from __future__ import annotations

from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.plan import Plan
from etn_cli.report.tables import paper_table, read_metrics, render, summarize
from etn_cli.store.atomic import atomic_write_text

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


def report(plan: Plan, *, fmt: str = "md", metric: str = "aupr") -> str:
    """Render the pipeline's table, and keep md/csv/tex copies under ``reports/<pipeline>/``."""
    if fmt not in TABLE_FORMATS:
        raise EtnError(f"Unknown table format {fmt!r}. Use one of: {', '.join(TABLE_FORMATS)}.")
    table = paper_table(summarize(read_metrics(metrics_paths(plan))), metric)
    folder = plan.data_dir / "reports" / plan.pipeline.name
    folder.mkdir(parents=True, exist_ok=True)
    for each in TABLE_FORMATS:
        atomic_write_text(folder / f"{metric}.{each}", render(table, each))
    return render(table, fmt)


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
