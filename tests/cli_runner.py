"""Run the ``etn`` command in-process for tests, the way a user's shell would."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from etn_cli.cli import app


def etn(*args: str | Path) -> tuple[int, str]:
    """Exit code and output of ``etn ARGS``; an unexpected exception (a bug, not a user error
    that exits with a status) is raised so the test shows its traceback."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output
