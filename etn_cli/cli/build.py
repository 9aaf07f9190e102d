"""The ``etn`` commands that build units of a pipeline: ``run``, ``finetune``, ``extract``,
``import`` (features computed elsewhere), ``train``, ``evaluate`` and ``predict``. Each parses
its options, plans the pipeline, calls one stage and prints what it did; :mod:`etn_cli.cli.app`
registers them. :func:`load_plan` serves :mod:`etn_cli.cli.inspect` too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from etn_cli import progress
from etn_cli.cli.options import (
    DataDir,
    Device,
    FailFast,
    Force,
    FormatOption,
    Only,
    Overrides,
    PipelineArg,
    Quiet,
    UsageError,
    Verbose,
    check_device_name,
    check_format,
    error_lines,
    only_heads,
    resolve_data_dir,
)
from etn_cli.errors import EtnError
from etn_cli.stages.distributed import is_main_process, refuse_under_torchrun


def checked_pipeline(
    pipeline: Path, overrides: list[str] | None = None, only: str | None = None
) -> Any:
    """Load a pipeline file and check all that needs no torch: the file, its keys and values,
    ``--set`` and ``--only``, the names it gives and its heads' settings. Every usage and
    pipeline-file error is refused here, in milliseconds, before a stage is imported."""
    from etn_cli.planning.overrides import blaming_overrides
    from etn_cli.planning.pipeline import check_names, check_roots, load_pipeline

    def check(sets: tuple[str, ...]) -> Any:
        loaded = load_pipeline(pipeline, sets, only_heads(only))
        check_names(loaded)
        check_roots(loaded)
        return loaded

    return blaming_overrides(check, tuple(overrides or ()), pipeline)


def load_plan(
    pipeline: Path,
    data_dir: Path | None,
    overrides: list[str] | None = None,
    only: str | None = None,
    read_only: bool = False,
    device: str | None = None,
    extracts: bool = False,
) -> Any:
    """Load and plan a pipeline (planning reads files and builds nothing, unless ``extracts``:
    a command that extracts builds the backbone's stage zero while planning); a ``--device``
    replaces the pipeline's (``dtype = "auto"`` resolves for it)."""
    loaded = checked_pipeline(pipeline, overrides, only)
    data = resolve_data_dir(data_dir)  # a file given as the data directory before torch loads
    loaded = dataclasses.replace(loaded, device=device) if device else loaded
    if extracts:
        from etn_cli.stages.prepare import plan_for_extract

        return plan_for_extract(loaded, data)
    from etn_cli.planning.plan import make_plan

    return make_plan(loaded, data)


def plan_on(
    pipeline: Path,
    data_dir: Path | None,
    device: str | None,
    overrides: list[str] | None = None,
    only: str | None = None,
    read_only: bool = False,
    extracts: bool = False,
) -> tuple[Any, str]:
    """The plan and the checked device of a command that builds: a device this machine lacks
    is refused before anything is built. A ``read_only`` command (``predict``) creates no data
    directory (planning never builds anything)."""
    loaded = checked_pipeline(pipeline, overrides, only)
    check_device_name(device or loaded.device)  # a misspelt one before torch loads
    data = resolve_data_dir(data_dir)
    from etn_cli.stages.run import ensure_data_dir, resolve_device

    dev = resolve_device(device or loaded.device)
    if not read_only:
        ensure_data_dir(data)
    return load_plan(pipeline, data_dir, overrides, only, read_only, device, extracts), dev


def run(
    pipelines: Annotated[
        list[Path],
        typer.Argument(
            metavar="PIPELINE",
            help="Pipeline files or folders of them, or shipped pipelines' names (digits).",
        ),
    ],
    data_dir: DataDir = None,
    device: Device = None,
    format: FormatOption = "table",
    metric: Annotated[
        str | None,
        typer.Option("--metric", metavar="METRIC", help="Show one metric (see `etn report`)."),
    ] = None,
    overrides: Overrides = None,
    only: Only = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each unit, cached or to build; run nothing.")
    ] = False,
    fail_fast: FailFast = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Run (finetune,) extract, train, evaluate and report per pipeline, skipping finished work.

    Safe to rerun (e.g. from cron): finished units are found by their content keys and kept.
    A head that refuses its data fails alone: the others are trained, scored and reported, the
    report marks it failed, the exit code is 1 and a rerun retries only what failed
    (--fail-fast: stop at the first). Several pipelines run in turn; a failing one does not
    stop the others. Under torchrun the ranks share extraction, then rank 0 alone trains,
    evaluates and prints the tables.
    """
    from etn_cli.report.metric_names import check_metric

    progress.configure(quiet=quiet, verbose=verbose)
    fmt, metric = check_format(format), check_metric(metric)
    check_pipelines(pipelines, overrides, only, device)
    data = resolve_data_dir(data_dir)
    from etn_cli.stages.dry_run import RunOptions, dry_run_report

    options = RunOptions(fmt, metric, tuple(overrides or ()), only_heads(only), fail_fast)
    if dry_run:
        typer.echo(dry_run_report(pipelines, data, options, device))
        return
    from etn_cli.stages.run import run_many

    try:
        outcomes = run_many(pipelines, data, device=device, options=options)
    except KeyboardInterrupt:  # no failure: the units finished so far are sealed and kept
        progress.write_line(progress.stamped(resume_line(pipelines, data_dir)))
        raise typer.Exit(130) from None
    if not is_main_process():
        raise typer.Exit(0 if all(o.ok for o in outcomes) else 1)
    print_outcomes(outcomes, options.fmt)


def print_outcomes(outcomes: list, fmt: str) -> None:
    """The tables on stdout, each stage's counts and the closing lines on stderr; exits 2 (the
    user's to fix), 1 (a bug, or a method that refused its data) or returns (all ran)."""
    tables = [o for o in outcomes if o.ok and o.table]
    for outcome in tables:
        title = f"## {outcome.path}\n\n" if len(tables) > 1 and fmt != "json" else ""
        typer.echo(f"{title}{outcome.table.rstrip()}")
    for outcome in outcomes:
        for stage in outcome.stages:  # a log keeps each stage's counts; a terminal with -v
            (progress.detail if progress.on_terminal() else progress.say)(stage)
        for line in outcome.written:  # the report's full paths, then the closing line
            progress.say(line)
        if outcome.ok and not outcome.failures:
            progress.say(outcome.line())
        else:
            head, *items = error_lines(outcome.line())
            typer.echo(head, err=True)
            for item in items:  # each listed problem on a line of its own
                typer.echo(f"error: {item}", err=True)
    if not all(o.ok for o in outcomes):  # 2: the user's to fix, as every `error:` line; 1: a bug
        raise typer.Exit(1 if any(o.bug for o in outcomes) else 2)
    if any(o.failures for o in outcomes):  # 1: a method refused its data, the rest ran
        raise typer.Exit(1)


def resume_line(pipelines: list[Path], data_dir: Path | None) -> str:
    """The last line of an ``etn run`` stopped by Ctrl-C: the same command resumes it."""
    again = ["etn run", *map(str, pipelines), *(["-d", str(data_dir)] if data_dir else [])]
    return f"interrupted: `{' '.join(again)}` resumes from the finished units"


def check_pipelines(
    paths: list[Path], overrides: list[str] | None, only: str | None, device: str | None
) -> None:
    """What ``etn run`` refuses before importing any stage: every file's
    :func:`checked_pipeline` and its device's name, the errors of all files in one line."""
    from etn_cli.planning.pipeline import expand_paths

    errors = []
    for path in expand_paths(paths):
        try:
            check_device_name(device or checked_pipeline(path, overrides, only).device)
        except EtnError as err:
            errors.append(str(err))
    if errors:
        raise EtnError(" | ".join(errors) if len(errors) > 1 else errors[0])


def finetune(
    pipeline: PipelineArg,
    data_dir: DataDir = None,
    device: Device = None,
    force: Force = False,
    overrides: Overrides = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Stage zero: train the backbone on the split named by the pipeline's finetune table.

    The weights (or adapter) land in <data-dir>/backbones/<backbone>-finetune-<key>/ with a
    finetune.json record; extract then uses them. Skipped when already complete.
    """
    refuse_under_torchrun("finetune")
    progress.configure(quiet=quiet, verbose=verbose)
    if checked_pipeline(pipeline, overrides).finetune is None:  # said before torch loads
        raise EtnError(
            f"{pipeline} has no [finetune] table, so there is nothing to fine-tune. Add one "
            '(e.g. [finetune] split = "train") or run `etn extract`.'
        )
    plan, dev = plan_on(pipeline, data_dir, device, overrides)
    from etn_cli.stages.finetune import finetune as run_finetune

    typer.echo(run_finetune(plan, device=dev, force=force).summary())


def extract(
    pipeline: PipelineArg,
    data_dir: DataDir = None,
    device: Device = None,
    overrides: Overrides = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Run the backbone once per dataset split and cache hidden states + logits as HDF5 shards.

    Under torchrun (torchrun --nproc-per-node N -m etn_cli extract ...) each rank extracts a
    share of every split on its own GPU and rank 0 merges them; the result is the same."""
    progress.configure(quiet=quiet, verbose=verbose)
    plan, dev = plan_on(pipeline, data_dir, device, overrides, extracts=True)
    from etn_cli.stages.extract import extract as run_extract

    summary = run_extract(plan, device=dev).summary()
    if is_main_process():
        typer.echo(summary)


def import_command(
    files: Annotated[
        list[Path],
        typer.Argument(
            metavar="FILE", help="Feature files (.npz, .safetensors, .h5), one per split."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="DIR", help="Folder to write the splits into.")
    ],
    classifier: Annotated[
        Path | None,
        typer.Option(
            "--classifier",
            metavar="FILE",
            help="A .npz / .safetensors file with weight (C, D) and bias (C,).",
        ),
    ] = None,
) -> None:
    """Turn feature files into split folders (HDF5 shards + manifest), one per file.

    Each file holds hidden (N, D), logits (N, C), labels (N,) and optionally index, layers/<name>,
    weight and bias; every file is checked before anything is written. The folders can then be
    named in a pipeline's [features] table (etn run also imports files named there itself).
    """
    missing = [str(p) for p in [*files, *([classifier] if classifier else [])] if not p.is_file()]
    if missing:
        raise EtnError(f"No such file: {', '.join(missing)}. Pass feature files to import.")
    from etn_cli.stages.import_files import import_files

    for line in import_files(files, out, classifier):
        typer.echo(line)


def train(
    pipeline: PipelineArg,
    data_dir: DataDir = None,
    device: Device = None,
    force: Force = False,
    overrides: Overrides = None,
    only: Only = None,
    fail_fast: FailFast = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Fit every head of the pipeline (per seed) on the cached adaptation features.

    A head that refuses its data fails alone (exit code 1, the others are fitted); a rerun
    retries only it. --fail-fast stops at the first."""
    refuse_under_torchrun("train")
    progress.configure(quiet=quiet, verbose=verbose)
    plan, dev = plan_on(pipeline, data_dir, device, overrides, only)
    from etn_cli.stages.train import train as run_train

    said(run_train(plan, device=dev, force=force, fail_fast=fail_fast))


def evaluate(
    pipeline: PipelineArg,
    data_dir: DataDir = None,
    device: Device = None,
    force: Force = False,
    overrides: Overrides = None,
    only: Only = None,
    fail_fast: FailFast = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Score every trained head on the ID test set and each OOD set; write Parquet metrics.

    A method that refuses the data fails alone (exit code 1, the others are scored); a rerun
    retries only it. --fail-fast stops at the first."""
    refuse_under_torchrun("evaluate")
    progress.configure(quiet=quiet, verbose=verbose)
    plan, dev = plan_on(pipeline, data_dir, device, overrides, only)
    from etn_cli.stages.evaluate import evaluate as run_evaluate

    said(run_evaluate(plan, device=dev, force=force, fail_fast=fail_fast))


def said(result: Any) -> None:
    """Print a stage's summary; with units that failed (here, or earlier and left units of
    this stage unbuilt), a closing line on stderr, exit 1."""
    typer.echo(result.summary())
    if result.failures():
        from etn_cli.stages.result import failures_line

        typer.echo(failures_line(result.failures()), err=True)
        raise typer.Exit(1)


def predict(
    pipeline: PipelineArg,
    inputs: Annotated[
        str,
        typer.Argument(
            metavar="INPUTS",
            help="An image folder, a .jsonl of questions, or a split: digits:test.",
        ),
    ],
    head: Annotated[
        str, typer.Option("--head", metavar="HEAD", help="Head name, report label or folder name.")
    ] = "etn",
    seed: Annotated[
        int, typer.Option("--seed", metavar="SEED", help="The seed of the trained head.")
    ] = 0,
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="FILE", help="A .parquet or .csv file.")
    ] = Path("predictions.parquet"),
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            metavar="SCORE@PERCENT|SCORE=VALUE",
            help="Repeatable: flag rows, e.g. mp@95 (the threshold that keeps 95% of the "
            "adaptation split's rows; choose thresholds there), mi=0.2 (above), mp=0.5.",
        ),
    ] = None,
    data_dir: DataDir = None,
    device: Device = None,
    overrides: Overrides = None,
    sets: Annotated[
        bool,
        typer.Option(
            "--sets", help="Also print each row's conformal prediction set (needs [conformal])."
        ),
    ] = False,
) -> None:
    """Run a trained head on new inputs; write one row per input with every score.

    Inputs are an image folder, a JSONL file of questions or a dataset split (digits:test);
    the output (Parquet or CSV) holds the prediction, its probabilities and every
    uncertainty score, plus flags for --threshold and, with a [conformal] section, each row's
    prediction set."""
    refuse_under_torchrun("predict")
    loaded = checked_pipeline(pipeline, overrides)  # a mistake in the file before torch loads
    from etn_cli.stages import predict_options as check

    thresholds, keep = check.parse_thresholds(threshold or [])
    check.output_format(out)
    check.check_input_named(inputs)
    check.check_head_named(loaded, head)
    check.check_head_seed(loaded, head, seed)
    plan, dev = plan_on(pipeline, data_dir, device, overrides, read_only=True)  # reads only
    from etn_cli.stages.predict import predict as run_predict

    if sets and plan.pipeline.conformal is None:
        raise UsageError(
            f"--sets prints conformal prediction sets, but {pipeline} has no [conformal] "
            'section. Add one (e.g. [conformal] method = "raps") and run etn run again.'
        )
    options = {"head": head, "seed": seed, "out": out, "thresholds": thresholds, "keep": keep}
    result = run_predict(plan, inputs, device=dev, **options)
    if sets:
        for name, members in zip(
            result.frame["input"], result.frame["prediction_set"], strict=True
        ):
            typer.echo(f"{name}\t{members}")
    typer.echo(result.summary())
