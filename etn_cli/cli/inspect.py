"""The ``etn`` commands that look at what was built and compute nothing: ``report``,
``verify``, ``ls`` and ``status`` (``report`` writes its tables and plots, nothing else).
:mod:`etn_cli.cli.app` registers them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from etn_cli import progress
from etn_cli.cli.build import checked_pipeline, load_plan
from etn_cli.cli.options import (
    DataDir,
    FormatOption,
    Only,
    Overrides,
    PipelineArg,
    Quiet,
    UsageError,
    check_format,
    choose,
    resolve_data_dir,
)
from etn_cli.errors import EtnError
from etn_cli.stages.distributed import refuse_under_torchrun

LISTINGS = ("heads", "backbones", "datasets", "pipelines", "examples")


def report(
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="SOURCE",
            help="Pipeline files (their current results) or metrics *.parquet files.",
        ),
    ],
    data_dir: DataDir = None,
    format: FormatOption = "table",
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            metavar="METRIC",
            help="One metric's full table: aupr, auroc, fpr95, aupr_in, aupr_out (per score), "
            "acc, ece, nll, brier, aurc, eaurc, risk80, risk90, risk95 (selective prediction), "
            "coverage, set_size (conformal sets), runtime. Default: the summary (ACC, ECE, "
            "AUROC, FPR95, AUPR).",
        ),
    ] = None,
    overrides: Overrides = None,
    only: Only = None,
    compare: Annotated[
        str | None,
        typer.Option(
            "--compare",
            metavar="METHOD",
            help="Add paired differences against METHOD (a report label or head name, e.g. "
            "ETN) with 95% bootstrap intervals over test rows and seeds; † marks the "
            "significant ones. Pipeline files only.",
        ),
    ] = None,
    bootstrap: Annotated[
        int,
        typer.Option(
            "--bootstrap",
            metavar="N",
            min=100,
            max=100_000,  # a (N + 1, rows) matrix per eval set: 10,000 rows at most is 8 GB
            help="Bootstrap replicates for --compare.",
        ),
    ] = 1000,
    rows: Annotated[
        bool,
        typer.Option(
            "--rows",
            help="With --format json: every result row (each method, metric, score and eval "
            "set, as results.json) instead of the table's cells.",
        ),
    ] = False,
    quiet: Quiet = False,
) -> None:
    """Print the results table of pipelines or metrics files and write tables and plots.

    Tables, results.json and plots go to <data-dir>/reports/<pipeline>/ (with --set or
    --only: <pipeline>+<8 hex of them>/; their paths on stderr); the table in the chosen
    format goes to stdout. Nothing is trained or scored. Methods that failed in an earlier
    run or command are reported as failed, with the reason, and the exit code is 1."""
    from etn_cli.report.metric_names import check_metric

    refuse_under_torchrun("report")
    progress.configure(quiet=quiet)
    fmt, metric = check_format(format), check_metric(metric)
    if rows and fmt != "json":
        raise UsageError(f"--rows lists every result row as JSON; add --format json (not {fmt}).")
    parquet = [p for p in sources if p.suffix == ".parquet"]
    if compare is not None and parquet:
        raise UsageError(
            f"--compare needs pipeline files (it reads their per-row predictions), got "
            f"{parquet[0]}. Pass the pipeline file instead, e.g. etn report P.toml --compare ETN."
        )
    for source in sources:  # every file's mistakes before torch loads
        if source.suffix != ".parquet":
            checked_pipeline(source, overrides, only)
        elif not source.is_file():
            raise EtnError(f"Metrics file {source} does not exist. Run evaluate or fix the path.")
    from etn_cli.report.failures import failed_units_line
    from etn_cli.stages.report import report as run_report
    from etn_cli.stages.report import report_files

    tables, written, failures = [], [], []
    for source in sources:
        if source.suffix != ".parquet":
            plan = load_plan(source, data_dir, overrides, only, read_only=True)
            table, files, failed = run_report(
                plan, fmt=fmt, metric=metric, compare=compare, bootstrap=bootstrap, rows=rows
            )
            tables.append(table)
            written += files
            failures += [failed_units_line(failed, source)] if failed else []
    if parquet:
        tables.append(report_files(parquet, fmt=fmt, metric=metric, rows=rows))
    typer.echo("\n\n".join(t.rstrip("\n") for t in tables))
    if progress.verbosity() >= progress.NORMAL:
        for path in written:  # stdout stays the table
            typer.echo(f"wrote {path}", err=True)
    for line in failures:  # 1: the report is whole but for methods that refused their data
        typer.echo(line, err=True)
    if failures:
        raise typer.Exit(1)


def verify(
    data_dir: DataDir = None,
    clean_partials: Annotated[
        bool,
        typer.Option(
            "--clean-partials",
            help="Delete leftovers of interrupted runs that no running etn process holds.",
        ),
    ] = False,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Remove every damaged unit (each is derived); the next etn run rebuilds it.",
        ),
    ] = False,
) -> None:
    """Check every manifest, row count and checksum under the data directory.

    Prints one line per damaged item (what is wrong, how to fix it) and per leftover of an
    interrupted run, then a summary; exits 1 when anything is damaged and not removed.
    """
    refuse_under_torchrun("verify")
    data = resolve_data_dir(data_dir)
    if not data.is_dir():
        raise EtnError(
            f"No data directory at {data}: nothing has run there yet, so there is nothing to "
            "verify. Run `etn run PIPELINE` first, or pass --data-dir."
        )
    from etn_cli.stages.verify import verify as run_verify

    outcome = run_verify(data, clean_partials=clean_partials, repair=repair)
    typer.echo(outcome.render())
    if outcome.left_damaged:
        raise typer.Exit(1)


def list_names(
    what: Annotated[
        str,
        typer.Argument(metavar="WHAT", help="heads, backbones, datasets, pipelines or examples."),
    ],
    folder: Annotated[
        Path | None,
        typer.Option(
            "--folder",
            metavar="DIR",
            help="List the pipeline files of DIR instead of the shipped pipelines.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """List the registered heads (with their family and needs), backbones, datasets, the
    shipped pipelines (or the pipeline files of a folder) or the shipped examples."""
    what = choose(what, LISTINGS, "listing")
    if folder is not None and what != "pipelines":
        raise UsageError(
            f"--folder lists pipeline files (etn ls pipelines --folder DIR), not {what}."
        )
    if what == "pipelines":
        typer.echo(pipeline_listing(folder))
        if folder is None:  # stdout stays one pipeline a line
            typer.echo(
                "Run one by its name from any folder (etn run digits); see also etn ls examples.",
                err=True,
            )
    elif what == "examples":
        typer.echo(example_listing())
    elif what == "heads":
        typer.echo(head_listing())
    elif what == "backbones":
        from etn_cli.backbones import backbones

        typer.echo("\n".join(backbones.names()))
    else:
        from etn_cli.datasets import datasets

        typer.echo("\n".join(datasets.names()))


def pipeline_listing(folder: Path | None) -> str:
    """``etn ls pipelines``: the shipped pipelines by the names they run by, or the pipeline
    files of ``--folder``; each with its one-line description."""
    from etn_cli.planning.shipped import description, shipped_pipelines
    from etn_cli.report.listing import described_listing, missing_folder

    if folder is None:
        files = shipped_pipelines()
    elif folder.is_dir():
        files = {str(path): path for path in sorted(folder.glob("*.toml"))}
    else:
        raise missing_folder(folder)
    return described_listing([(name, description(path)) for name, path in files.items()])


def example_listing() -> str:
    """``etn ls examples``: where the shipped examples are and how to use one: copied next to
    your files, since the paths in an example are relative to it (an installed package's
    folder is no place for your data)."""
    from etn_cli.planning.shipped import EXAMPLES, description, shipped_examples
    from etn_cli.report.listing import described_listing

    rows = [(path.name, description(path)) for path in shipped_examples()]
    return (
        f"Examples in {EXAMPLES}; copy one next to your files (its paths are relative to it):\n"
        f"{described_listing(rows)}\n"
        f"For example: cp {EXAMPLES / 'images.toml'} . && python {EXAMPLES / 'standins.py'} . "
        "(stand-ins of the files the examples read, written here)"
    )


def head_listing() -> str:
    """``etn ls heads``: every registered head's line, from the tables (no head, nor torch,
    is imported)."""
    from etn_cli.heads import LABELS, heads, settings_of
    from etn_cli.planning.units import PlannedHead
    from etn_cli.report.listing import HeadEntry, head_listing, head_needs

    entries = []
    for name in heads.names():
        head = PlannedHead(name, {}, settings_of(name)(), LABELS[name])
        needs, aliases = tuple(head_needs(head)), tuple(heads.aliases_of(name))
        entries.append(HeadEntry(name, head.family, head.label, needs, aliases))
    return head_listing(entries)


def status(
    pipeline: PipelineArg,
    data_dir: DataDir = None,
    format: FormatOption = "table",
    overrides: Overrides = None,
    only: Only = None,
    prompt: Annotated[
        bool, typer.Option("--prompt", help="Also print an LLM's rendered example prompt.")
    ] = False,
) -> None:
    """Show which units of a pipeline are done, partial or missing (nothing is written).

    Units are the fine-tuned backbone, the feature splits, the classifier, heads x seeds and
    metrics files; partial means in progress or interrupted (with the shards done so far)."""
    refuse_under_torchrun("status")
    fmt = check_format(format)
    plan = load_plan(pipeline, data_dir, overrides, only, read_only=True)
    from etn_cli.stages.status import render_status
    from etn_cli.stages.status import status as unit_status

    typer.echo(render_status(plan, unit_status(plan), fmt))
    if prompt:
        from etn_cli.stages.prompt_example import render_prompt

        typer.echo(render_prompt(plan))
