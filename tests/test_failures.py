"""One method's failure is one method's failure (issue 36): a head that refuses its data fails
alone, through the installed ``etn`` entry point in a subprocess. The tiny digits pipeline of
the reliability tests gets a Mahalanobis head fitted on 5 rows of the train split, too few to
hold every class, which Mahalanobis refuses (:func:`~etn_cli.heads.scorers.base.check_every_class`);
ETN and MAP fit on the adaptation split as before. The failure record the run leaves beside the
head lets ``etn evaluate``, ``etn report`` and ``etn status`` on their own say it failed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_runner import unstamped
from test_refusals import etn
from test_reliability import PIPELINE

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.plan import make_plan
from etn_cli.stages.failure_records import recorded_failure, remember_failure
from etn_cli.stages.result import StageResult, UnitFailure
from etn_cli.stages.units import Unit, build_units
from etn_cli.store.artefacts.predictions import predictions_path
from etn_cli.store.artefacts.sealed import sidecar

FAILING = PIPELINE.replace("shard_rows = 16\n", 'shard_rows = 16\nfit = "train"\nfit_rows = 5\n')
FAILING += '[[heads]]\nname = "mahalanobis"\n'
REFUSAL = "Mahalanobis needs ID samples of every class; classes "
SEED_REFUSAL = "ETN's loss is NaN at epoch 1 with this seed."


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
    found["records"] = sorted(p.name.split("-")[0] for p in data.rglob("*.failed.json"))
    for command in ("evaluate", "report", "status"):  # each on its own, after the run
        found[command] = etn(command, pipeline, "-d", data)
    found["status json"] = json.loads(etn("status", pipeline, "-d", data, "-f", "json").stdout)
    found["dry run"] = etn("run", pipeline, "-d", data, "--dry-run")
    found["rerun"] = etn("run", pipeline, "-d", data)
    found["train"] = etn("train", pipeline, "-d", data)
    found["train fail-fast"] = etn("train", pipeline, "-d", data, "--force", "--fail-fast")
    found.update(one_seed_failed(root, data))
    (map_metrics,) = data.glob("metrics/tiny/map-*.parquet")
    map_metrics.unlink()  # missing with no failure recorded: the report refuses as before
    found["report without a file"] = etn("report", pipeline, "-d", data)
    return found


def one_seed_failed(root: Path, data: Path) -> dict[str, object]:
    """``etn report`` and ``etn status`` of a two-seed pipeline whose ETN seed 1 failed to
    train. No head of the digits pipeline refuses one seed's data and not another's, so after
    a whole run that seed's head and metrics are removed and its failure recorded, as the unit
    driver records a refusal (:func:`~etn_cli.stages.failure_records.remember_failure`)."""
    pipeline = root / "two.toml"
    text = FAILING.replace('name = "tiny"', 'name = "two"').replace("seeds = [0]", "seeds = [0, 1]")
    pipeline.write_text(text.replace('[[heads]]\nname = "mahalanobis"\n', ""))
    whole = etn("run", pipeline, "-d", data)
    assert whole.returncode == 0, whole.stderr[-2000:]
    plan = make_plan(load_pipeline(pipeline), data)
    (unit,) = [u for u in plan.metrics if u.head.label == "ETN" and u.head.seed == 1]
    shutil.rmtree(unit.head.path)
    for path in (unit.path, predictions_path(unit.path)):
        path.unlink()
        sidecar(path).unlink()
    remember_failure(UnitFailure("train", "ETN seed 1", str(unit.head.path), SEED_REFUSAL))
    return {
        "two report": etn("report", pipeline, "-d", data),
        "two results": json.loads((data / "reports" / "two" / "results.json").read_text()),
        "two status": etn("status", pipeline, "-d", data),
    }


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
def test_fail_fast_stops_at_the_first_head_that_refuses_as_before(runs) -> None:
    done = runs["fail-fast"]
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and REFUSAL in errors[0], done.stderr[-2000:]
    lines = unstamped(done.stderr)
    assert "train    Mahalanobis seed 0: FAILED after" in "\n".join(lines)
    assert not any(line.startswith("[") and "evaluate" in line for line in lines), lines
    assert runs["fail-fast files"] == [] and done.stdout == ""


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
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
    assert runs["records"] == ["mahalanobis"]  # heads/mahalanobis-<key>.failed.json


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
def test_etn_evaluate_on_its_own_scores_the_trained_heads_and_skips_the_failed_one(runs) -> None:
    done = runs["evaluate"]
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout == "evaluate: 0 built, 2 up to date, 1 skipped\n"
    lines = [line.split("] ", 1)[-1] for line in unstamped(done.stderr)]
    assert "evaluate Mahalanobis seed 0: skipped, its head failed to train" in lines, lines
    assert lines[-1].startswith("1 unit failed (train Mahalanobis seed 0), the rest ran")


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
def test_etn_report_on_its_own_shows_the_failed_row_and_why_and_exits_1(runs) -> None:
    done = runs["report"]
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout == runs["run"].stdout  # the table etn run printed, failed row and note
    closing = unstamped(done.stderr)[-1]
    assert closing.startswith("1 unit failed (train Mahalanobis seed 0), reported with the")
    assert closing.endswith("retries only the failed unit."), closing


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
def test_etn_status_shows_the_failed_head_with_its_reason(runs) -> None:
    done = runs["status"]
    assert done.returncode == 0, done.stderr
    rows = {(r["unit"], r["name"]): r for r in runs["status json"]}
    head = rows["head", "Mahalanobis seed 0"]
    assert head["state"] == "failed" and head["detail"].startswith(f"train: {REFUSAL}")
    metrics = rows["metrics", "Mahalanobis seed 0"]
    assert (metrics["state"], metrics["detail"]) == ("missing", "its head failed")
    assert rows["head", "MAP seed 0"]["state"] == "done"
    summary = done.stdout.splitlines()[-1]
    assert "1 missing, 1 failed; `etn run " in summary and "retries the failed" in summary
    assert "  would retry head       Mahalanobis seed 0\n" in runs["dry run"].stdout


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
def test_a_method_missing_a_seed_says_how_many_seeds_its_numbers_come_from(runs) -> None:
    done = runs["two report"]
    assert done.returncode == 1, done.stderr[-2000:]
    table = done.stdout.splitlines()
    assert any(line.startswith("ETN ‡ ") for line in table), done.stdout
    assert any(line.startswith("MAP ") for line in table) and "(failed)" not in done.stdout
    note = " ".join(done.stdout[done.stdout.index("‡ ETN:") :].split())
    assert note == f"‡ ETN: 1 of 2 seeds; seed 1 failed in train: {SEED_REFUSAL}", note
    (entry,) = runs["two results"]["failed"]
    assert (entry["method"], entry["seed"], entry["method_seeds"]) == ("etn", 1, [0, 1])
    etn_rows = [r for r in runs["two results"]["results"] if r["method"] == "etn"]
    assert etn_rows and {r["n_seeds"] for r in etn_rows} == {1}
    rows = [line.split()[:5] for line in runs["two status"].stdout.splitlines()]
    assert ["head", "ETN", "seed", "1", "failed"] in rows, runs["two status"].stdout


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
def test_a_metrics_file_missing_without_a_recorded_failure_still_refuses_the_report(runs) -> None:
    done = runs["report without a file"]
    assert done.returncode == 2, done.stderr[-2000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "1 of 3 metrics files of pipeline 'tiny' are missing" in error, error


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
def test_a_rerun_retries_only_the_failed_head(runs) -> None:
    done = runs["rerun"]
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line.split("] ", 1)[-1] for line in unstamped(done.stderr)]
    started = [line for line in lines if line.endswith(": started")]
    assert started == ["train    Mahalanobis seed 0: started"], lines
    for unit in ("train    ETN seed 0", "train    MAP seed 0", "evaluate ETN seed 0"):
        assert f"{unit}: skipped, up to date" in lines
    assert "1 unit failed (train Mahalanobis seed 0)" in lines[-1]


@pytest.mark.slow  # the module's 14 runs of the entry point: about 90 s
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


def test_only_a_refusal_is_isolated_and_only_its_failure_record_is_left(tmp_path: Path) -> None:
    """An EtnError fails its unit alone, leaving a failure record that the unit's later build
    removes; damage (which etn run repairs) and a bug (which keeps its traceback) stop the
    stage as before."""
    units = [
        Refusing(tmp_path / "a", EtnError("no rows of class 3")),
        Refusing(tmp_path / "b", None),
    ]
    result = build_units(units, StageResult("train", isolate=True))
    assert [f.line() for f in result.failed] == ["train a: no rows of class 3"]
    assert result.done == [str(tmp_path / "b")] and sorted(os.listdir(tmp_path)) == [
        "a.failed.json", "a.lock", "b", "b.lock"
    ]  # fmt: skip
    assert recorded_failure(tmp_path / "a").reason == "no rows of class 3"
    for error in (DamagedArtefact(tmp_path / "x", "damaged"), ValueError("a bug")):
        with pytest.raises(type(error)):
            build_units([Refusing(tmp_path / "c", error)], StageResult("train", isolate=True))
    with pytest.raises(EtnError, match="no rows"):
        build_units(units[:1], StageResult("train"))  # --fail-fast
    build_units([Refusing(tmp_path / "a", None)], StageResult("train", isolate=True))
    assert recorded_failure(tmp_path / "a") is None  # built at last: its record is gone
    assert not (tmp_path / "a.failed.json").exists()
