"""The ``etn`` command: parse options, load the pipeline, call one stage, exit.

This module is the list of commands; they live in :mod:`etn_cli.cli.build` (those that build
units) and :mod:`etn_cli.cli.inspect` (those that look at them), their shared options in
:mod:`etn_cli.cli.options`. Heavy libraries (torch, h5py, polars) are imported inside the
commands, so ``--help`` is fast. Usage errors are one line on stderr and exit status 2; domain
errors (:class:`EtnError`) are one line too; only a bug keeps its traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from etn_cli.cli import build as cli_build
from etn_cli.cli import inspect as cli_inspect
from etn_cli.cli.options import error_lines, fail, one_line
from etn_cli.errors import EtnError
from etn_cli.progress import write_line

app = typer.Typer(
    help="Evidential Transformation Network: trustworthy confidence and OOD scores for any "
    "pretrained classifier, from cached features.\n\nTypical use: `etn run digits`.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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
    pretrained classifier, from cached features. Typical use: `etn run digits`."""


# In the order `etn --help` lists them.
app.command(short_help="Every stage of each pipeline; reruns skip finished work.")(cli_build.run)
app.command(short_help="Stage zero: train the backbone (optional).")(cli_build.finetune)
app.command(short_help="Run the backbone once per split; cache the features.")(cli_build.extract)
app.command("import", short_help="Your own feature files as split folders.")(
    cli_build.import_command
)
app.command(short_help="Fit every head x seed on the cached features.")(cli_build.train)
app.command(short_help="Score every trained head; write Parquet metrics.")(cli_build.evaluate)
app.command(short_help="Run a trained head on new inputs.")(cli_build.predict)
app.command(short_help="Print the results table; write tables and plots.")(cli_inspect.report)
app.command(short_help="Check (and clean) everything under the data directory.")(cli_inspect.verify)
app.command("ls", short_help="List heads, backbones, datasets or pipelines.")(
    cli_inspect.list_names
)
app.command(short_help="Which units of a pipeline are done, partial or missing.")(
    cli_inspect.status
)


def usage_errors() -> tuple[type[Exception], ...]:
    """The exceptions of a usage error: typer 0.22 and later raise their own (a click of their
    own inside), earlier typer click's; both where both are installed."""
    found: list[type[Exception]] = []
    if hasattr(typer, "TyperException"):
        found.append(typer.TyperException)
    try:
        import click
    except ImportError:  # typer with its own click needs none
        return tuple(found)
    return (*found, click.ClickException)


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 and domain errors 2, each as one line on stderr."""
    from etn_cli.errors import UsageError

    try:
        code = app(args=argv, prog_name="etn", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except (UsageError, EtnError) as err:
        *lines, last = error_lines(str(err))
        for line in lines:  # every problem of a list on its own line
            write_line(f"error: {line}")
        fail(last, 2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except usage_errors() as err:  # usage errors of the click typer runs on
        if type(err).__name__ == "NoArgsIsHelpError":  # `etn run` with nothing: its help
            print(err.format_message(), file=sys.stderr)
            sys.exit(2)
        write_line(one_line(err))
        sys.exit(getattr(err, "exit_code", 2))
    except OSError as err:  # a full disk or a read-only data directory is a user's problem
        from etn_cli.store.storage import is_storage_error, storage_error

        if not is_storage_error(err):
            raise
        fail(storage_error(err), 2)


if __name__ == "__main__":
    main()
