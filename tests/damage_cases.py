"""Damage at rest, case by case: a finished digits run, one artefact flipped, truncated or
deleted, then ``etn run`` again. Shared by ``tests/test_integrity.py`` (a seeded sample) and
``benchmarks/bench_damage.py`` (every bit of every artefact).

A case passes when the run ends either with the clean run's exact results (the damaged unit was
rebuilt, or never read) or with one error line and a non-zero exit; it fails on a silently
changed result, a traceback, or a process killed by a signal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tiny_pipeline import tiny_pipeline

# The smallest pipeline that writes every kind of artefact: a backbone etn trains itself, its
# stored classifier, shards, a head with weights (map_edl starts from the classifier), metrics.
PIPELINE = tiny_pipeline("damage", heads=({"name": "map_edl", "epochs": 2},))

# artefact kind -> glob under the data directory (each matches one file)
KINDS = {
    "shard": "features/*/digits.test-*/shard-00000.h5",
    "manifest": "features/*/digits.test-*/manifest.json",
    "head weights": "heads/map_edl-*/weights.safetensors",
    "head.json": "heads/map_edl-*/head.json",
    "train.json": "heads/map_edl-*/train.json",
    "backbone weights": "backbones/digits_cnn-*/model.safetensors",
    "backbone meta.json": "backbones/digits_cnn-*/meta.json",
    "classifier": "features/*/classifier.safetensors",
    "classifier checksum": "features/*/classifier.safetensors.sha256",
    "metrics file": "metrics/damage/*.parquet",
    "metrics checksum": "metrics/damage/*.parquet.sha256",
}


# Shards are checked in full where they are read (recorded value checksums), and a rerun of a
# finished pipeline reads none: for these kinds the metrics files go too, so the run reads them.
READ_AGAIN = {"shard": "metrics/damage/*.parquet*"}


@dataclass(frozen=True)
class Case:
    kind: str
    damage: str  # "flip", "truncate" or "delete"
    offset: int = 0  # byte of the flip, or the length kept by a truncation
    bit: int = 0

    def __str__(self) -> str:
        where = {"flip": f" byte {self.offset} bit {self.bit}", "truncate": f" to {self.offset}"}
        return f"{self.kind}: {self.damage}{where.get(self.damage, '')}"


@dataclass(frozen=True)
class Outcome:
    verdict: str  # "same", "refused", "changed", "left damaged", "traceback" or "killed"
    detail: str


def target(data: Path, kind: str) -> Path:
    found = sorted(data.glob(KINDS[kind]))
    assert len(found) == 1, (kind, found)
    return found[0]


def apply(case: Case, data: Path) -> None:
    """Damage one file in place, keeping its modification time (bit rot does not touch it)."""
    path = target(data, case.kind)
    for other in data.glob(READ_AGAIN.get(case.kind, "nothing")):
        other.unlink()
    if case.damage == "delete":
        path.unlink()
        return
    stat = path.stat()
    raw = bytearray(path.read_bytes())
    if case.damage == "flip":
        raw[case.offset] ^= 1 << case.bit
    else:
        del raw[case.offset :]
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def sample(data: Path, flips: int, seed: int = 0) -> Iterator[Case]:
    """Per kind: a flip in the first byte (a format's signature), ``flips`` seeded single-bit
    flips, half in the first 512 bytes (headers) and half anywhere, a truncation to half the
    size, and deletion."""
    rng = np.random.default_rng(seed)
    for kind in KINDS:
        size = target(data, kind).stat().st_size
        head = rng.integers(0, min(size, 512), flips - flips // 2)
        body = rng.integers(0, size, flips // 2)
        yield Case(kind, "flip", 0, 0)
        for offset in np.concatenate([head, body]):
            yield Case(kind, "flip", int(offset), int(rng.integers(0, 8)))
        yield Case(kind, "truncate", size // 2)
        yield Case(kind, "delete")


def every_bit(data: Path, kinds: list[str], stride: int = 1) -> Iterator[Case]:
    """Every bit of every ``stride``-th byte of each kind's file, then truncations and deletion."""
    for kind in kinds:
        size = target(data, kind).stat().st_size
        for offset in range(0, size, stride):
            for bit in range(8):
                yield Case(kind, "flip", offset, bit)
        for keep in (0, 1, size // 2, size - 1):
            yield Case(kind, "truncate", keep)
        yield Case(kind, "delete")


def results(data: Path) -> list[dict]:
    """Every figure the report computed except measured run times, which differ run to run."""
    record = json.loads((data / "reports" / "damage" / "results.json").read_text())
    return [row for row in record["results"] if not row["metric"].startswith("runtime")]


def finished_run(root: Path) -> tuple[Path, Path]:
    """Write the pipeline and run it once into ``root/clean``; return (pipeline, data)."""
    pipeline = root / "damage.toml"
    pipeline.write_text(PIPELINE)
    data = root / "clean"
    run_cli(pipeline, data)
    return pipeline, data


def run_cli(pipeline: Path, data: Path) -> subprocess.CompletedProcess:
    """``etn run`` through the installed entry point, as a person's shell would start it."""
    etn = Path(sys.executable).with_name("etn")
    command = [str(etn), "run", str(pipeline), "--data-dir", str(data), "-f", "csv"]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def run_in_process(pipeline: Path, data: Path) -> tuple[int, str, str]:
    """``etn run`` in this process (no interpreter start): exit code, stdout, stderr; an
    exception that escapes the command comes back as a traceback on stderr."""
    import traceback

    from typer.testing import CliRunner

    from etn_cli.cli.app import app

    args = ["run", str(pipeline), "--data-dir", str(data), "-f", "csv"]
    result = CliRunner().invoke(app, args)
    stderr = result.stderr
    if result.exception and not isinstance(result.exception, SystemExit):
        error = result.exception
        stderr += "Traceback\n" + "".join(traceback.format_exception(error))
    return result.exit_code, result.stdout, stderr


def judge(code: int, stdout: str, stderr: str, clean: list[dict], data: Path) -> Outcome:
    """Whether one damaged run ended acceptably (see the module docstring)."""
    if code < 0:
        return Outcome("killed", f"signal {-code}")
    if "Traceback" in stderr:
        return Outcome("traceback", stderr.strip().splitlines()[-1])
    if code == 0:
        same = results(data) == clean
        return Outcome("same" if same else "changed", stdout.splitlines()[0] if stdout else "")
    errors = [line for line in stderr.splitlines() if line.startswith(("error:", "FAILED"))]
    if len(errors) == 1:
        return Outcome("refused", errors[0])
    return Outcome("traceback", f"exit {code} without one error line: {stderr[-300:]!r}")


def run_case(
    case: Case, pipeline: Path, clean: Path, work: Path, *, in_process: bool = False
) -> Outcome:
    """Copy the clean data directory (modification times kept), damage it, run, judge."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(clean, work)
    apply(case, work)
    if in_process:
        code, stdout, stderr = run_in_process(pipeline, work)
    else:
        done = run_cli(pipeline, work)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    outcome = judge(code, stdout, stderr, results(clean), work)
    if outcome.verdict == "same":  # repaired, or never read: either way nothing is left damaged
        from etn_cli.stages.verify import verify

        left = verify(work).damaged
        if left:
            return Outcome("left damaged", left[0].line())
    return outcome
