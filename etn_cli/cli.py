"""The ``etn`` command: parse options, load the pipeline, call one stage, exit.

Heavy libraries (torch, h5py, polars) are imported inside the commands, so ``--help`` is fast.
Usage errors are one line on stderr and exit status 2; domain errors (:class:`EtnError`) are one
line too; only a bug keeps its traceback.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated

import typer

from etn_cli import progress
from etn_cli.cli_options import (
    DataDir,
    Device,
    Force,
    FormatOption,
    Only,
    Overrides,
    PipelineArg,
    Quiet,
    Verbose,
    check_format,
    choose,
    fail,
    one_line,
    only_heads,
    resolve_data_dir,
)
from etn_cli.distributed import is_main_process, refuse_under_torchrun
from etn_cli.errors import EtnError
from etn_cli.own_features.command import import_command

app = typer.Typer(
    help="Evidential Transformation Network: trustworthy confidence and OOD scores for any "
    "pretrained classifier, from cached features.\n\nTypical use: `etn run pipelines/digits.toml`.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
LISTINGS = ("heads", "backbones", "datasets", "pipelines")


def _version(value: bool) -> None:
    if value:
        from etn_cli.provenance import code_version

        typer.echo(f"etn {code_version()}")
        raise typer.Exit(0)


@app.callback()
def _main_options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Evidential Transformation Network: trustworthy confidence and OOD scores for any
    pretrained classifier, from cached features. Typical use: `etn run pipelines/digits.toml`."""


def _plan(pipeline: Path, data_dir, overrides=None, only=None, read_only=False, device=None):  # noqa: ANN001, ANN202
    """Load and plan a pipeline; ``read_only`` plans never build (or train) anything; a
    ``--device`` replaces the pipeline's (``dtype = "auto"`` resolves for it)."""
    from etn_cli.backbones.base import read_only as building_nothing
    from etn_cli.pipeline import load_pipeline
    from etn_cli.plan import make_plan

    loaded = load_pipeline(pipeline, tuple(overrides or ()), only_heads(only))
    loaded = dataclasses.replace(loaded, device=device) if device else loaded
    if not read_only:
        return make_plan(loaded, resolve_data_dir(data_dir))
    with building_nothing():
        return make_plan(loaded, resolve_data_dir(data_dir))


def _device(plan, device: str | None) -> str:  # noqa: ANN001
    from etn_cli.stages.run import resolve_device

    return resolve_device(device or plan.pipeline.device)


def _run_stage(stage, pipeline: Path, data_dir, device, overrides, only, **options) -> None:  # noqa: ANN001, ANN003
    """Plan the pipeline, run one stage on it and print what it built and skipped."""
    plan = _plan(pipeline, data_dir, overrides, only, device=device)
    typer.echo(stage(plan, device=_device(plan, device), **options).summary())


@app.command()
def run(
    pipelines: Annotated[list[Path], typer.Argument(help="Pipeline files or folders of them.")],
    data_dir: DataDir = None,
    device: Device = None,
    format: FormatOption = "table",
    metric: Annotated[str | None, typer.Option(help="Show one metric (see `etn report`).")] = None,
    overrides: Overrides = None,
    only: Only = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each unit, cached or to build; run nothing.")
    ] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Run (finetune,) extract, train, evaluate and report per pipeline, skipping finished work.

    Safe to rerun (e.g. from cron): finished units are found by their content keys and kept.
    Several pipelines run in turn; a failing one does not stop the others, and the exit code
    is non-zero if any failed. Under torchrun the ranks share extraction, then rank 0 alone
    trains, evaluates and prints the tables.
    """
    from etn_cli.report.views import check_metric
    from etn_cli.stages.run import RunOptions, dry_run_report, run_many

    progress.configure(quiet=quiet, verbose=verbose)
    options = RunOptions(
        fmt=check_format(format),
        metric=check_metric(metric),
        overrides=tuple(overrides or ()),
        only=only_heads(only),
    )
    data = resolve_data_dir(data_dir)
    if dry_run:
        typer.echo(dry_run_report(pipelines, data, options))
        return
    outcomes = run_many(pipelines, data, device=device, options=options)
    if not is_main_process():
        raise typer.Exit(0 if all(o.ok for o in outcomes) else 1)
    tables = [o for o in outcomes if o.ok and o.table]
    for outcome in tables:
        title = f"## {outcome.path}\n\n" if len(tables) > 1 and options.fmt != "json" else ""
        typer.echo(f"{title}{outcome.table.rstrip()}")
    for outcome in outcomes:
        if outcome.ok:
            progress.say(outcome.line())
        else:
            typer.echo(outcome.line(), err=True)
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)


@app.command()
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
    from etn_cli.stages.finetune import finetune as run_finetune

    refuse_under_torchrun("finetune")
    progress.configure(quiet=quiet, verbose=verbose)
    plan = _plan(pipeline, data_dir, overrides, device=device)
    if plan.finetune is None:
        raise EtnError(
            f"{pipeline} has no [finetune] table, so there is nothing to fine-tune. Add one "
            '(e.g. [finetune] split = "train") or run `etn extract`.'
        )
    typer.echo(run_finetune(plan, device=_device(plan, device), force=force).summary())


@app.command()
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
    from etn_cli.stages.extract import extract as run_extract

    progress.configure(quiet=quiet, verbose=verbose)
    plan = _plan(pipeline, data_dir, overrides, device=device)
    summary = run_extract(plan, device=_device(plan, device)).summary()
    if is_main_process():
        typer.echo(summary)


@app.command()
def train(
    pipeline: PipelineArg,
    data_dir: DataDir = None,
    device: Device = None,
    force: Force = False,
    overrides: Overrides = None,
    only: Only = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Fit every head of the pipeline (per seed) on the cached adaptation features."""
    from etn_cli.stages.train import train as run_train

    refuse_under_torchrun("train")
    progress.configure(quiet=quiet, verbose=verbose)
    _run_stage(run_train, pipeline, data_dir, device, overrides, only, force=force)


@app.command()
def evaluate(
    pipeline: PipelineArg,
    data_dir: DataDir = None,
    device: Device = None,
    force: Force = False,
    overrides: Overrides = None,
    only: Only = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Score every trained head on the ID test set and each OOD set; write Parquet metrics."""
    from etn_cli.stages.evaluate import evaluate as run_evaluate

    refuse_under_torchrun("evaluate")
    progress.configure(quiet=quiet, verbose=verbose)
    _run_stage(run_evaluate, pipeline, data_dir, device, overrides, only, force=force)


@app.command()
def predict(
    pipeline: PipelineArg,
    inputs: Annotated[
        str,
        typer.Argument(help="An image folder, a .jsonl of questions, or a split: digits:test."),
    ],
    head: Annotated[str, typer.Option(help="Head name, report label or folder name.")] = "etn",
    seed: Annotated[int, typer.Option(help="The seed of the trained head.")] = 0,
    out: Annotated[Path, typer.Option("--out", "-o", help="A .parquet or .csv file.")] = Path(
        "predictions.parquet"
    ),
    threshold: Annotated[
        list[str] | None,
        typer.Option(help="SCORE=VALUE, repeatable: flag rows, e.g. mi=0.2 (above), mp=0.5."),
    ] = None,
    data_dir: DataDir = None,
    device: Device = None,
    overrides: Overrides = None,
) -> None:
    """Run a trained head on new inputs; write one row per input with every score.

    Inputs are an image folder, a JSONL file of questions or a dataset split (digits:test);
    the output (Parquet or CSV) holds the prediction, its probabilities and every
    uncertainty score, plus flags for --threshold."""
    from etn_cli.stages.predict import output_format, parse_thresholds
    from etn_cli.stages.predict import predict as run_predict

    refuse_under_torchrun("predict")
    thresholds = parse_thresholds(threshold or [])
    output_format(out)
    plan = _plan(pipeline, data_dir, overrides, device=device)
    options = {"head": head, "seed": seed, "out": out, "thresholds": thresholds}
    typer.echo(run_predict(plan, inputs, device=_device(plan, device), **options).summary())


@app.command()
def report(
    sources: Annotated[
        list[Path],
        typer.Argument(help="Pipeline files (their current results) or metrics *.parquet files."),
    ],
    data_dir: DataDir = None,
    format: FormatOption = "table",
    metric: Annotated[
        str | None,
        typer.Option(
            help="One metric's full table: aupr, auroc, fpr95, aupr_in, aupr_out (per score), "
            "acc, ece, nll, brier, runtime. Default: the summary (ACC, ECE, AUROC, FPR95, AUPR)."
        ),
    ] = None,
    overrides: Overrides = None,
    only: Only = None,
) -> None:
    """Print the results table of pipelines or metrics files and write tables and plots.

    Tables, results.json and plots go to <data-dir>/reports/<pipeline>/ (their paths on
    stderr); the table in the chosen format goes to stdout. Nothing is trained or scored."""
    from etn_cli.report.views import check_metric
    from etn_cli.stages.report import report as run_report
    from etn_cli.stages.report import report_files

    refuse_under_torchrun("report")
    fmt, metric = check_format(format), check_metric(metric)
    parquet = [p for p in sources if p.suffix == ".parquet"]
    tables, written = [], []
    for source in sources:
        if source.suffix != ".parquet":
            plan = _plan(source, data_dir, overrides, only, read_only=True)
            table, files = run_report(plan, fmt=fmt, metric=metric)
            tables.append(table)
            written += files
    if parquet:
        tables.append(report_files(parquet, fmt=fmt, metric=metric))
    typer.echo("\n\n".join(t.rstrip("\n") for t in tables))
    for path in written:  # stdout stays the table
        typer.echo(f"wrote {path}", err=True)


@app.command()
def verify(
    data_dir: DataDir = None,
    clean_partials: Annotated[
        bool,
        typer.Option(
            "--clean-partials",
            help="Delete leftovers of interrupted runs that no running etn process holds.",
        ),
    ] = False,
) -> None:
    """Check every manifest, row count and checksum under the data directory.

    Prints one line per damaged item (what is wrong, how to fix it) and per leftover of an
    interrupted run, then a summary; exits 1 when anything is damaged.
    """
    from etn_cli.stages.verify import verify as run_verify

    refuse_under_torchrun("verify")
    data = resolve_data_dir(data_dir)
    if not data.is_dir():
        raise EtnError(
            f"No data directory at {data}: nothing has run there yet, so there is nothing to "
            "verify. Run `etn run PIPELINE` first, or pass --data-dir."
        )
    outcome = run_verify(data, clean_partials=clean_partials)
    typer.echo(outcome.render())
    if outcome.damaged:
        raise typer.Exit(1)


@app.command("ls")
def list_names(
    what: Annotated[str, typer.Argument(help="heads, backbones, datasets or pipelines.")],
    folder: Annotated[Path, typer.Option(help="Where to look for pipelines.")] = Path("pipelines"),
) -> None:
    """List the registered heads (with their family and needs), backbones, datasets, or the
    pipeline files in a folder."""
    from etn_cli.report.listing import listing

    typer.echo(listing(choose(what, LISTINGS, "listing"), folder))


@app.command()
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
    from etn_cli.stages.status import render_status
    from etn_cli.stages.status import status as unit_status

    refuse_under_torchrun("status")
    fmt = check_format(format)
    plan = _plan(pipeline, data_dir, overrides, only, read_only=True)
    typer.echo(render_status(plan, unit_status(plan), fmt))
    if prompt:
        from etn_cli.stages.prompt_example import render_prompt

        typer.echo(render_prompt(plan))


app.command("import")(import_command)  # etn import: features computed elsewhere


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 and domain errors 2, each as one line on stderr."""
    from etn_cli.cli_options import UsageError

    try:
        code = app(args=argv, prog_name="etn", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except (UsageError, EtnError) as err:
        fail(" ".join(str(err).split("\n")), 2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as err:  # usage errors of typer's own click
        if type(err).__name__ == "NoArgsIsHelpError":  # `etn run` with nothing: its help
            print(err.format_message(), file=sys.stderr)
            sys.exit(2)
        print(one_line(err), file=sys.stderr)
        sys.exit(getattr(err, "exit_code", 2))
    except OSError as err:  # a full disk or a read-only data directory is a user's problem
        from etn_cli.store.storage import is_storage_error, storage_error

        if not is_storage_error(err):
            raise
        fail(storage_error(err), 2)


if __name__ == "__main__":
    main()
