"""The ``etn`` command end to end on a tiny digits configuration in ``tmp_path``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import polars as pl
import pytest
import tiny_pipeline as tiny
from cli_runner import etn, without_progress

from etn_cli.errors import EtnError
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.plan import make_plan


def write_pipeline(folder: Path, name: str = "tiny", etn_epochs: int = 3) -> Path:
    etn = {"name": "etn", "epochs": etn_epochs, "batch_size": 64}
    return tiny.write_pipeline(
        folder, name, seeds=(0, 1), backbone={"epochs": 3}, data={"ood": tiny.BOTH_OOD},
        heads=(etn, "map", "mahalanobis"),
    )  # fmt: skip


def unit_files(data: Path) -> dict[Path, int]:
    """Every file etn wrote (locks excepted) with its modification time."""
    return {p: p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file() and p.suffix != ".lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("run")
    pipeline = write_pipeline(root)
    code, output = etn("run", pipeline, "--data-dir", root / "data", "-f", "md", "--metric", "aupr")
    assert code == 0, output
    return pipeline, root / "data", output


def test_run_builds_every_stage_and_prints_the_table(finished: tuple[Path, Path, str]) -> None:
    _, data, output = finished
    assert "| ETN |" in output and "| MAP |" in output and "| Mahalanobis [md] |" in output
    assert "digits → digits-OOD MP" in output
    assert len(list((data / "heads").iterdir())) >= 4  # ETN x 2 seeds, MAP, Mahalanobis
    frame = pl.read_parquet(next((data / "metrics" / "tiny").glob("etn-*.parquet")))
    assert {"pipeline", "eval_set", "task", "method", "seed", "metric", "score", "value"} <= set(
        frame.columns
    )
    assert set(frame["eval_set"]) == {"digits", "digits_unseen", "digits_noise"}
    assert frame["code_version"].n_unique() == 1 and frame["head_key"].n_unique() == 1


def test_rerun_of_a_finished_pipeline_does_no_work(finished: tuple[Path, Path, str]) -> None:
    pipeline, data, _ = finished
    before = unit_files(data)
    code, output = etn("run", pipeline, "--data-dir", data)
    assert code == 0
    assert "extract: 0 built, 5 up to date" in output  # 4 splits and the classifier
    # 2 seeds of ETN; MAP and Mahalanobis are seed-free, fitted once
    assert "train: 0 built, 4 up to date" in output
    assert "evaluate: 0 built, 4 up to date" in output
    after = unit_files(data)
    changed = [p for p in before if after.get(p) != before[p] and "reports" not in p.parts]
    assert changed == []


def test_changing_one_head_setting_redoes_only_that_head(tmp_path: Path, finished) -> None:
    _, data, _ = finished
    pipeline = write_pipeline(tmp_path, etn_epochs=4)
    code, output = etn("run", pipeline, "--data-dir", data)
    assert code == 0, output
    assert "train: 2 built, 2 up to date" in output
    assert "evaluate: 2 built, 2 up to date" in output


def test_stages_run_on_their_own_and_report_prints_every_format(tmp_path: Path) -> None:
    pipeline, data = write_pipeline(tmp_path), tmp_path / "data"
    with pytest.raises(EtnError, match="metrics files of pipeline 'tiny' are missing"):
        etn("report", pipeline, "--data-dir", data)
    for stage in ("extract", "train", "evaluate"):
        code, output = etn(stage, pipeline, "--data-dir", data)
        assert code == 0 and "built" in output, output
    # the output mixes in stderr: a report step past 2 s (the first plots) says so first
    _, md = etn("report", pipeline, "--data-dir", data, "--format", "md")
    _, tex = etn("report", pipeline, "--data-dir", data, "--format", "tex")
    _, csv = etn("report", pipeline, "--data-dir", data, "--format", "csv")
    md, tex, csv = map(without_progress, (md, tex, csv))
    assert md.startswith("| Method") and "\\toprule" in tex and "\\textbf" in tex
    assert csv.splitlines()[0].startswith("Method")
    assert (data / "reports" / "tiny" / "aupr.tex").is_file()


def test_report_reads_parquet_files_directly(finished: tuple[Path, Path, str]) -> None:
    pipeline, data, _ = finished
    files = [unit.path for unit in make_plan(load_pipeline(pipeline), data).metrics]
    code, output = etn("report", *files, "--metric", "auroc", "--format", "md")
    assert code == 0 and "| ETN" in output
    # the folder also holds the files of an earlier ETN setting: the same heads and seeds
    # reported twice are refused instead of averaged together
    everything = sorted((data / "metrics" / "tiny").glob("*.parquet"))
    assert len(everything) > len(files)
    with pytest.raises(EtnError, match="would count twice"):
        etn("report", *everything)


def test_a_bad_pipeline_refuses_the_batch_before_any_work(tmp_path: Path, finished) -> None:
    _, data, _ = finished
    write_pipeline(tmp_path, "good")
    bad = write_pipeline(tmp_path, "bad")
    bad.write_text(bad.read_text().replace('name = "map"', 'name = "mpa"'))
    with pytest.raises(EtnError, match="Unknown head 'mpa'. Did you mean: map?"):
        etn("run", tmp_path, "--data-dir", data)
    assert not (data / "metrics" / "good").exists()


def test_a_pipeline_failing_at_run_time_does_not_stop_the_others(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, n, ood in (("adapt", 60, False), ("test", 90, False), ("far", 60, True)):
        write_own_shards(tmp_path / "mine" / name, rng, n, ood)
    with h5py.File(tmp_path / "mine" / "adapt" / "shard-00000.h5", "a") as f:
        f["logits"][3, 0] = np.nan  # found when the shards are read, not when planned
    write_own_shards(tmp_path / "mine" / "clean", rng, 60)
    for name, adapt in (("a-bad", "adapt"), ("b-good", "clean")):
        (tmp_path / f"{name}.toml").write_text(
            f'name = "{name}"\nseeds = [0]\n[features]\nadapt = "mine/{adapt}"\n'
            'test = "mine/test"\nood = ["mine/far"]\n[[heads]]\nname = "map"\n'
        )
    code, output = etn("run", tmp_path, "--data-dir", tmp_path / "data", "-f", "md")
    assert code == 2  # the user's data to fix: exit status 2, as every other `error:` line
    error = next(line for line in output.splitlines() if line.startswith("error: "))
    assert error.startswith(f"error: {tmp_path / 'a-bad.toml'}: ")
    assert "1 NaN value (row 3)" in error
    assert f"ok {tmp_path / 'b-good.toml'}" in output


def test_ls_prints_registered_names_one_per_line() -> None:
    paper = "etn map static adats map_edl ib_edl dmm laplace mcd ensemble mahalanobis odin energy"
    rows = [line.split("  ")[0] for line in etn("ls", "heads")[1].splitlines()[1:]]
    assert set(paper.split()) | {"duq", "sngp"} <= set(rows) and rows == sorted(rows)
    header, etn_row = etn("ls", "heads")[1].splitlines()[0], next(r for r in rows if r == "etn")
    assert header.split() == ["name", "family", "label", "needs", "also"] and etn_row == "etn"
    knn = next(line for line in etn("ls", "heads")[1].splitlines() if line.startswith("knn "))
    assert knn.split()[1] == "posthoc" and "ID statistics" in knn
    msp = next(line for line in etn("ls", "heads")[1].splitlines() if line.startswith("map "))
    assert msp.split()[-1] == "msp"  # the alias people search for
    assert "digits_cnn" in etn("ls", "backbones")[1].split()
    assert {"digits", "digits_unseen", "digits_noise"} <= set(etn("ls", "datasets")[1].split())
    repo = Path(__file__).resolve().parents[1]
    assert "digits.toml" in etn("ls", "pipelines", "--folder", repo / "pipelines")[1]


def write_own_shards(folder: Path, rng: np.random.Generator, n: int, ood: bool = False) -> None:
    """Features from 'someone else's model', written with plain h5py in the README format."""
    folder.mkdir(parents=True)
    labels = rng.integers(0, 3, n)
    centres = np.eye(3, 8) * 4
    hidden = centres[labels] + rng.normal(size=(n, 8)) * (3.0 if ood else 1.0)
    logits = hidden[:, :3] * 2
    with h5py.File(folder / "shard-00000.h5", "w") as f:
        f.attrs["etn_format"] = 1
        f["hidden"] = hidden.astype(np.float32)
        f["logits"] = logits.astype(np.float32)
        f["labels"] = labels.astype(np.int64)
        f["index"] = np.arange(n, dtype=np.int64)


def test_bring_your_own_features_train_evaluate_and_report(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, n, ood in (("adapt", 120, False), ("test", 200, False), ("far", 150, True)):
        write_own_shards(tmp_path / "mine" / name, rng, n, ood)
    pipeline = tmp_path / "byof.toml"
    pipeline.write_text(
        'name = "byof"\nseeds = [0]\n[features]\nadapt = "mine/adapt"\ntest = "mine/test"\n'
        'ood = ["mine/far"]\nid_dataset = "toy"\nbackbone = "my-model"\n'
        '[[heads]]\nname = "etn"\nepochs = 5\nbatch_size = 32\n[[heads]]\nname = "energy"\n'
    )
    code, output = etn("run", pipeline, "-d", tmp_path / "data", "-f", "md", "--metric", "aupr")
    assert code == 0, output
    assert "toy → far MP" in output and "| ETN |" in output
    assert sorted(p.name for p in (tmp_path / "mine" / "adapt").iterdir()) == ["shard-00000.h5"]


def test_bad_input_is_one_line_on_stderr_with_exit_status_2(tmp_path: Path) -> None:
    pipeline = write_pipeline(tmp_path)
    pipeline.write_text(pipeline.read_text().replace("[data]", "[data]\nbatchsize = 3"))
    done = subprocess.run(
        [sys.executable, "-m", "etn_cli", "run", str(pipeline), "-d", str(tmp_path / "d")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2  # run: a bad file refuses the batch before any work
    assert "Unknown key 'batchsize'" in done.stderr and "Did you mean 'batch_size'?" in done.stderr
    assert done.stderr.count("\n") == 1
    done = subprocess.run(
        [sys.executable, "-m", "etn_cli", "train", str(pipeline), "-d", str(tmp_path / "d")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: Unknown key")
    assert not (tmp_path / "d").exists()


def test_a_terminal_gets_tqdm_bars_and_a_log_gets_none(
    tmp_path: Path,
    finished,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cli_runner import fresh_data

    from etn_cli import progress

    pipeline, data, _ = finished
    outputs = {}
    for terminal in (True, False):
        monkeypatch.setattr(progress, "on_terminal", lambda terminal=terminal: terminal)
        code, outputs[terminal] = etn(
            "extract", pipeline, "-d", fresh_data(tmp_path / str(terminal), (pipeline, data))
        )
        assert code == 0, outputs[terminal]
    # extraction steps through batches: a bar per split on a terminal, drawn with "\r"
    bar = re.compile(r"extract digits\.test-[0-9a-f]+:\s+\d+%\|.*\| \d+/\d+ \[")
    assert bar.search(outputs[True]) and "\r" in outputs[True], outputs[True]
    assert "extract  digits.test: done in " in outputs[True]  # the unit's line stays
    assert not bar.search(outputs[False]) and "\r" not in outputs[False]
    assert "extract  digits.test: done in " in outputs[False]


def test_skipped_units_are_listed_in_a_log_and_only_counted_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from etn_cli import progress

    for terminal, quiet, verbose, shown in (
        (False, False, False, True),  # a cron log shows what was already done
        (True, False, False, False),  # a terminal keeps the counter compact
        (True, False, True, True),
        (False, True, False, False),  # -q: nothing
    ):
        monkeypatch.setattr(progress, "on_terminal", lambda terminal=terminal: terminal)
        progress.configure(quiet=quiet, verbose=verbose)
        with progress.counting(3):
            progress.skipped("train", "ETN seed 0")
            progress.skipped("train", "ETN seed 1", "finished by another run")
            with progress.unit("evaluate", "ETN seed 0"):
                pass
        err = capsys.readouterr().err
        expected = [
            "[1/3] train    ETN seed 0: skipped, up to date",
            "[2/3] train    ETN seed 1: skipped, finished by another run",
        ]
        assert all((line in err) == shown for line in expected), (terminal, quiet, err)
        assert ("[3/3] evaluate ETN seed 0: done in " in err) == (not quiet)
    progress.configure()


def test_a_terminal_shows_one_line_per_unit_and_a_started_line_only_for_slow_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import time

    from etn_cli import progress

    monkeypatch.setattr(progress, "SLOW_S", 0.2)
    for terminal in (True, False):
        monkeypatch.setattr(progress, "on_terminal", lambda terminal=terminal: terminal)
        progress.configure()
        with progress.counting(2):
            with progress.unit("train", "ETN seed 0"):
                pass
            with progress.unit("train", "ETN seed 1"):
                time.sleep(0.6)
        lines = capsys.readouterr().err.splitlines()
        stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d "
        if terminal:  # as written to the screen: no time stamps, the quick unit in one line
            assert [line.split(": ")[1][:7] for line in lines] == ["done in", "started", "done in"]
            assert lines[0].startswith("[1/2] train    ETN seed 0: done in ")
        else:  # a log: every unit started and done, each line stamped with the local time
            assert len(lines) == 4 and all(re.match(stamp, line) for line in lines), lines
            assert lines[0].endswith("[1/2] train    ETN seed 0: started")


def test_the_run_counts_the_units_status_lists_and_logs_the_backbone(finished) -> None:
    pipeline, data, output = finished
    totals = set(re.findall(r"\[\s*\d+/(\d+)\] ", output))
    _, status = etn("status", pipeline, "-d", data)
    listed = re.search(r": (\d+) units, (\d+) done", status)
    assert listed and totals == {listed[1]} and listed[2] == listed[1], (totals, status)
    assert re.search(r"\] extract  classifier \(backbone's final layer\): done in ", output)
    assert "extract  digits_cnn backbone: done in " in output  # trained on first use, uncounted
    _, again = etn("run", pipeline, "-d", data)
    assert "extract  classifier (backbone's final layer): skipped, up to date" in again
