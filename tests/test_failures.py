"""One method's failure is one method's failure (issue 36): a head that refuses its data fails
alone, through the installed ``etn`` entry point in a subprocess. The tiny digits pipeline of
the reliability tests gets a Mahalanobis head fitted on 5 rows of the train split, too few to
hold every class, which Mahalanobis refuses (:func:`~etn_cli.heads.scorers.base.check_every_class`);
ETN and MAP fit on the adaptation split as before."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_runner import unstamped
from test_refusals import etn
from test_reliability import PIPELINE

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.stages.result import StageResult
from etn_cli.stages.units import Unit, build_units

FAILING = PIPELINE.replace("shard_rows = 16\n", 'shard_rows = 16\nfit = "train"\nfit_rows = 5\n')
FAILING += '[[heads]]\nname = "mahalanobis"\n'
REFUSAL = "Mahalanobis needs ID samples of every class; classes "


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """On one data directory, in turn: ``etn run --fail-fast``, ``etn run``, ``etn run``
    again, ``etn train`` and ``etn train --force --fail-fast``."""
    root = tmp_path_factory.mktemp("failing")
    pipeline, data = root / "tiny.toml", root / "data"
    pipeline.write_text(FAILING)
    found = {"fail-fast": etn("run", pipeline, "-d", data, "--fail-fast")}
    found["fail-fast files"] = sorted(p.name for p in data.glob("metrics/*/*.parquet"))
    found["run"] = etn("run", pipeline, "-d", data)
    found["results"] = json.loads((data / "reports" / "tiny" / "results.json").read_text())
    found["partials"] = [str(p) for p in data.rglob("*.partial-*")]
    found["heads"] = sorted(p.name.split("-")[0] for p in data.glob("heads/*") if p.is_dir())
    found["rerun"] = etn("run", pipeline, "-d", data)
    found["train"] = etn("train", pipeline, "-d", data)
    found["train fail-fast"] = etn("train", pipeline, "-d", data, "--force", "--fail-fast")
    return found


def test_fail_fast_stops_at_the_first_head_that_refuses_as_before(runs) -> None:
    done = runs["fail-fast"]
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and REFUSAL in errors[0], done.stderr[-2000:]
    lines = unstamped(done.stderr)
    assert "train    Mahalanobis seed 0: FAILED after" in "\n".join(lines)
    assert not any(line.startswith("[") and "evaluate" in line for line in lines), lines
    assert runs["fail-fast files"] == [] and done.stdout == ""


def test_a_head_that_refuses_its_data_fails_alone_and_the_run_exits_1(runs) -> None:
    done = runs["run"]
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line.split("] ", 1)[-1] for line in unstamped(done.stderr)]
    failed = [line for line in lines if "FAILED after" in line]
    assert len(failed) == 1 and failed[0].startswith("train    Mahalanobis seed 0: FAILED after")
    assert REFUSAL in failed[0] and "Traceback" not in done.stderr
    assert "evaluate Mahalanobis seed 0: skipped, its head failed to train" in lines
    assert any(line.startswith("evaluate MAP seed 0: done in") for line in lines), lines
    closing = lines[-1]
    assert closing.startswith("FAILED ") and "1 unit failed (train Mahalanobis seed 0)" in closing
    assert closing.endswith("a rerun retries only the failed unit."), closing
    table = done.stdout.splitlines()
    assert any(line.startswith("ETN ") for line in table), done.stdout
    assert any(line.startswith("Mahalanobis (failed) ") for line in table), done.stdout
    note = " ".join(done.stdout[done.stdout.index("Failed (a rerun retries it)") :].split())
    assert note.startswith(f"Failed (a rerun retries it): Mahalanobis seed 0 in train: {REFUSAL}")
    results = runs["results"]
    assert {r["method"] for r in results["results"]} == {"etn", "map"}
    (entry,) = results["failed"]
    assert (entry["method"], entry["seed"], entry["stage"]) == ("mahalanobis", 0, "train")
    assert entry["reason"].startswith(REFUSAL)
    assert runs["partials"] == [] and runs["heads"] == ["etn", "map"]


def test_a_rerun_retries_only_the_failed_head(runs) -> None:
    done = runs["rerun"]
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line.split("] ", 1)[-1] for line in unstamped(done.stderr)]
    started = [line for line in lines if line.endswith(": started")]
    assert started == ["train    Mahalanobis seed 0: started"], lines
    for unit in ("train    ETN seed 0", "train    MAP seed 0", "evaluate ETN seed 0"):
        assert f"{unit}: skipped, up to date" in lines
    assert "1 unit failed (train Mahalanobis seed 0)" in lines[-1]


def test_etn_train_says_what_failed_and_exits_1_or_stops_with_fail_fast(runs) -> None:
    done = runs["train"]
    assert done.returncode == 1 and done.stdout == "train: 0 built, 2 up to date, 1 failed\n"
    assert unstamped(done.stderr)[-1].startswith("1 unit failed (train Mahalanobis seed 0)")
    done = runs["train fail-fast"]
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and REFUSAL in errors[0], done.stderr
    started = [line for line in unstamped(done.stderr) if line.endswith(": started")]
    assert started[-1].endswith("train    Mahalanobis seed 0: started"), started


class Refusing(Unit):
    """A unit whose build raises ``error`` after writing a file into its private folder."""

    def __init__(self, path: Path, error: Exception | None) -> None:
        self.path, self.name, self.error = path, path.name, error

    def damage(self) -> str | None:
        return None if self.path.exists() else "missing"

    def build(self, folder: Path) -> None:
        (folder / "half.txt").write_text("half")
        if self.error is not None:
            raise self.error


def test_only_a_refusal_is_isolated_and_nothing_of_it_is_left(tmp_path: Path) -> None:
    """An EtnError fails its unit alone; damage (which etn run repairs) and a bug (which keeps
    its traceback) stop the stage as before."""
    units = [
        Refusing(tmp_path / "a", EtnError("no rows of class 3")),
        Refusing(tmp_path / "b", None),
    ]
    result = build_units(units, StageResult("train", isolate=True))
    assert [f.line() for f in result.failed] == ["train a: no rows of class 3"]
    assert result.done == [str(tmp_path / "b")] and sorted(os.listdir(tmp_path)) == [
        "a.lock", "b", "b.lock"
    ]  # fmt: skip
    for error in (DamagedArtefact(tmp_path / "x", "damaged"), ValueError("a bug")):
        with pytest.raises(type(error)):
            build_units([Refusing(tmp_path / "c", error)], StageResult("train", isolate=True))
    with pytest.raises(EtnError, match="no rows"):
        build_units(units[:1], StageResult("train"))  # --fail-fast
