"""The ``etn`` command: parse options, load the pipeline, call one stage, exit.

Heavy libraries (torch, h5py, polars) are imported inside the commands, so ``--help`` is fast.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from etn_cli.distributed import is_main_process, refuse_under_torchrun
from etn_cli.errors import EtnError

app = typer.Typer(
    help="Evidential Transformation Network: trustworthy confidence and OOD scores for any "
    "pretrained classifier, from cached features.\n\nTypical use: `etn run pipelines/digits.toml`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        "-d",
        envvar="ETN_DATA_DIR",
        help="Where features, heads, metrics and reports live (env ETN_DATA_DIR).",
    ),
]
Device = Annotated[
    str | None,
    typer.Option(help="cpu, cuda, cuda:1 … (default: the pipeline's `device`, else auto)."),
]
PipelineArg = Annotated[Path, typer.Argument(help="A pipeline file, e.g. pipelines/digits.toml.")]
Force = Annotated[bool, typer.Option("--force", help="Redo finished units (new copy swapped in).")]
DEFAULT_DATA = Path("data")


class Format(StrEnum):
    md = "md"
    csv = "csv"
    tex = "tex"


class Listing(StrEnum):
    heads = "heads"
    backbones = "backbones"
    datasets = "datasets"
    pipelines = "pipelines"


def _plan(pipeline: Path, data_dir: Path):  # noqa: ANN202
    from etn_cli.pipeline import load_pipeline
    from etn_cli.plan import make_plan

    return make_plan(load_pipeline(pipeline), data_dir)


def _device(plan, device: str | None) -> str:  # noqa: ANN001
    from etn_cli.stages.run import resolve_device

    return resolve_device(device or plan.pipeline.device)


def _run_stage(stage, pipeline: Path, data_dir: Path, device: str | None, **options) -> None:  # noqa: ANN001, ANN003
    """Plan the pipeline, run one stage on it and print what it built and skipped."""
    plan = _plan(pipeline, data_dir)
    typer.echo(stage(plan, device=_device(plan, device), **options).summary())


@app.command()
def run(
    pipelines: Annotated[list[Path], typer.Argument(help="Pipeline files or folders of them.")],
    data_dir: DataDir = DEFAULT_DATA,
    device: Device = None,
    format: Annotated[Format, typer.Option(help="Table format printed.")] = Format.md,
) -> None:
    """Run (finetune,) extract, train, evaluate and report per pipeline, skipping finished work.

    Safe to rerun (e.g. from cron): finished units are found by their content keys and kept.
    Several pipelines run in turn; a failing one does not stop the others, and the exit code
    is non-zero if any failed. Under torchrun the ranks share extraction, then rank 0 alone
    trains, evaluates and prints the tables.
    """
    from etn_cli.stages.run import run_many

    outcomes = run_many(pipelines, data_dir, device=device, fmt=format.value)
    if not is_main_process():
        raise typer.Exit(0 if all(o.ok for o in outcomes) else 1)
    for outcome in outcomes:
        if outcome.ok:
            typer.echo(f"\n## {outcome.path}\n\n{outcome.table}")
    typer.echo("")
    for outcome in outcomes:
        typer.echo(outcome.line(), err=not outcome.ok)
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)


@app.command()
def finetune(
    pipeline: PipelineArg,
    data_dir: DataDir = DEFAULT_DATA,
    device: Device = None,
    force: Force = False,
) -> None:
    """Stage zero: train the backbone on the split named by the pipeline's finetune table.

    The weights (or adapter) land in <data-dir>/backbones/<backbone>-finetune-<key>/ with a
    finetune.json record; extract then uses them. Skipped when already complete.
    """
    from etn_cli.stages.finetune import finetune as run_finetune

    refuse_under_torchrun("finetune")
    plan = _plan(pipeline, data_dir)
    if plan.finetune is None:
        raise EtnError(
            f"{pipeline} has no [finetune] table, so there is nothing to fine-tune. Add one "
            '(e.g. [finetune] split = "train") or run `etn extract`.'
        )
    typer.echo(run_finetune(plan, device=_device(plan, device), force=force).summary())


@app.command()
def extract(pipeline: PipelineArg, data_dir: DataDir = DEFAULT_DATA, device: Device = None) -> None:
    """Run the backbone once per dataset split and cache hidden states + logits as HDF5 shards.

    Under torchrun (torchrun --nproc-per-node N -m etn_cli extract ...) each rank extracts a
    share of every split on its own GPU and rank 0 merges them; the result is the same."""
    from etn_cli.stages.extract import extract as run_extract

    plan = _plan(pipeline, data_dir)
    summary = run_extract(plan, device=_device(plan, device)).summary()
    if is_main_process():
        typer.echo(summary)


@app.command()
def train(
    pipeline: PipelineArg,
    data_dir: DataDir = DEFAULT_DATA,
    device: Device = None,
    force: Force = False,
) -> None:
    """Fit every head of the pipeline (per seed) on the cached adaptation features."""
    from etn_cli.stages.train import train as run_train

    refuse_under_torchrun("train")
    _run_stage(run_train, pipeline, data_dir, device, force=force)


@app.command()
def evaluate(
    pipeline: PipelineArg,
    data_dir: DataDir = DEFAULT_DATA,
    device: Device = None,
    force: Force = False,
) -> None:
    """Score every trained head on the ID test set and each OOD set; write Parquet metrics."""
    from etn_cli.stages.evaluate import evaluate as run_evaluate

    refuse_under_torchrun("evaluate")
    _run_stage(run_evaluate, pipeline, data_dir, device, force=force)


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
    data_dir: DataDir = DEFAULT_DATA,
    device: Device = None,
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
    plan = _plan(pipeline, data_dir)
    options = {"head": head, "seed": seed, "out": out, "thresholds": thresholds}
    typer.echo(run_predict(plan, inputs, device=_device(plan, device), **options).summary())


@app.command()
def report(
    sources: Annotated[
        list[Path],
        typer.Argument(help="Pipeline files (their current results) or metrics *.parquet files."),
    ],
    data_dir: DataDir = DEFAULT_DATA,
    format: Annotated[Format, typer.Option(help="md, csv or tex, printed to stdout.")] = Format.md,
    metric: Annotated[str, typer.Option(help="aupr (main tables) or auroc (appendix).")] = "aupr",
) -> None:
    """Print the paper's results table: per method ID ACC, MP, UM; per OOD set MP, MI, DE."""
    from etn_cli.stages.report import report as run_report
    from etn_cli.stages.report import report_files

    refuse_under_torchrun("report")
    parquet = [p for p in sources if p.suffix == ".parquet"]
    tables, plots = [], []
    for source in sources:
        if source.suffix != ".parquet":
            table, drawn = run_report(_plan(source, data_dir), fmt=format.value, metric=metric)
            tables.append(table)
            plots += [p for p in drawn if p.suffix == ".png"]
    if parquet:
        tables.append(report_files(parquet, fmt=format.value, metric=metric))
    typer.echo("\n\n".join(tables))
    for plot in plots:  # PNG paths (a PDF lies beside each) on stderr: stdout stays the table
        typer.echo(f"plot: {plot}", err=True)


@app.command()
def verify(
    data_dir: DataDir = DEFAULT_DATA,
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
    outcome = run_verify(data_dir, clean_partials=clean_partials)
    typer.echo(outcome.render())
    if outcome.damaged:
        raise typer.Exit(1)


@app.command("ls")
def list_names(
    what: Annotated[Listing, typer.Argument(help="heads, backbones, datasets or pipelines.")],
    folder: Annotated[Path, typer.Option(help="Where to look for pipelines.")] = Path("pipelines"),
) -> None:
    """Print the registered names, one per line."""
    if what is Listing.pipelines:
        names = [str(p) for p in sorted(folder.glob("*.toml"))]
    elif what is Listing.heads:
        from etn_cli.heads import heads

        names = heads.names()
    elif what is Listing.backbones:
        from etn_cli.backbones import backbones

        names = backbones.names()
    else:
        from etn_cli.datasets import datasets

        names = datasets.names()
    typer.echo("\n".join(names))


@app.command()
def status(pipeline: PipelineArg, data_dir: DataDir = DEFAULT_DATA) -> None:
    """Show which units of a pipeline are done, partial or missing.

    Units are the fine-tuned backbone, the feature splits, the classifier, heads x seeds and
    metrics files; partial means in progress or interrupted (with the shards done so far)."""
    from etn_cli.stages.status import render_status
    from etn_cli.stages.status import status as unit_status

    refuse_under_torchrun("status")
    plan = _plan(pipeline, data_dir)
    typer.echo(render_status(plan, unit_status(plan)))


def main() -> None:
    """Entry point: a domain error is one line on stderr and exit status 2."""
    try:
        status = app(standalone_mode=False)  # click returns an Exit's code in this mode
        if isinstance(status, int) and status:
            sys.exit(status)
    except EtnError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except OSError as err:  # a full disk or a read-only data directory is a user's problem
        from etn_cli.store.storage import is_storage_error, storage_error

        if not is_storage_error(err):
            raise
        typer.echo(f"error: {storage_error(err)}", err=True)
        sys.exit(2)
    except Exception as err:
        import click

        if isinstance(err, click.ClickException):
            err.show()
            sys.exit(err.exit_code)
        raise


if __name__ == "__main__":
    main()
