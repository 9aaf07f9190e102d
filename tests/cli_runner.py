"""Helpers shared by the CLI tests: run ``etn`` in-process the way a user's shell would, start
from an empty data directory, compare shard contents."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from etn_cli.cli.app import app


def etn(*args: str | Path) -> tuple[int, str]:
    """Exit code and output of ``etn ARGS``; an unexpected exception (a bug, not a user error
    that exits with a status) is raised so the test shows its traceback."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def etn_process(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``etn ARGS`` through its entry point in a new process, as a shell starts it."""
    command = [sys.executable, "-m", "etn_cli", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd)


def fresh_data(tmp_path: Path, reference: tuple[Path, Path]) -> Path:
    """An empty data dir holding only the digits CNN a reference run trained (a cache)."""
    data = tmp_path / "data"
    shutil.copytree(reference[1] / "backbones", data / "backbones")
    return data


def finished_run(root: Path, text: str) -> tuple[Path, Path]:
    """The pipeline ``text`` run once, in this process: (pipeline file, data dir)."""
    from etn_cli.stages.run import run_pipeline

    pipeline = root / "tiny.toml"
    pipeline.write_text(text)
    outcome = run_pipeline(pipeline, root / "data")
    assert outcome.ok, outcome.message
    return pipeline, root / "data"


def checksums(manifest: dict) -> list[tuple[str, int, str]]:
    """What a manifest says about its shards' content (the recorded file times differ)."""
    return [(e["file"], e["rows"], e["sha256"]) for e in manifest["shards"]]


PROGRESS = re.compile(
    r"^(\d{4}-\d\d-\d\dT\S+ )?(\[\s*\d+/\d+\] )?(finetune|extract|train|evaluate|report)\s+.+: "
    r"(started( \(.*\))?|done in [\d.]+ s|(FAILED|interrupted) after [\d.]+ s|skipped, .*)$"
    r"|^(\d{4}-\d\d-\d\dT\S+ )?etn: data directory "
)


STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d ")


def unstamped(output: str) -> list[str]:
    """The lines of ``output`` without the time stamps written off a terminal."""
    return [STAMP.sub("", line) for line in output.splitlines()]


def without_progress(stderr: str) -> str:
    """``stderr`` less the progress lines a run prints for each unit (what is left is what the
    person must read: the error)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not PROGRESS.match(line))
