"""The command line as a person meets it, through the installed ``etn`` entry point in a
subprocess: usage errors are one line with exit status 2 and write nothing; output off a
terminal is plain lines; every ``--format`` parses; overrides reach the content keys; the
results table fits 100 columns; read-only commands create nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import h5py
import numpy as np
import polars as pl
import pytest
from cli_runner import STAMP
from conftest import QuickStart
from tiny_pipeline import tiny_pipeline

REPO = Path(__file__).resolve().parents[1]
ETN = [shutil.which("etn")] if shutil.which("etn") else [sys.executable, "-m", "etn_cli"]
PIPELINE = """
name = "conv"
seeds = [0, 1]
[features]
adapt = "mine/adapt"
test = "mine/test"
ood = ["mine/far", "mine/near"]
id_dataset = "toy"
backbone = "my-model"
[[heads]]
name = "etn"
epochs = 3
batch_size = 32
[[heads]]
name = "map"
[[heads]]
name = "mahalanobis"
"""


def etn(*args: object, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ETN, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {}), "COLUMNS": "200"},
        timeout=900,  # a hang guard: a full digits run on a loaded 2-core machine took 260 s
    )


def write_shards(folder: Path, rng: np.random.Generator, n: int, shift: float) -> None:
    folder.mkdir(parents=True)
    labels = rng.integers(0, 3, n)
    hidden = np.eye(3, 8)[labels] * 4 + rng.normal(size=(n, 8)) * (1 + shift)
    with h5py.File(folder / "shard-00000.h5", "w") as f:
        f.attrs["etn_format"] = 1
        f["hidden"] = hidden.astype(np.float32)
        f["logits"] = (hidden[:, :3] * 2).astype(np.float32)
        f["labels"] = labels.astype(np.int64)
        f["index"] = np.arange(n, dtype=np.int64)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("conv")
    rng = np.random.default_rng(0)
    for name, n, shift in (("adapt", 90, 0), ("test", 150, 0), ("far", 80, 2), ("near", 80, 1)):
        write_shards(root / "mine" / name, rng, n, shift)
    (root / "conv.toml").write_text(PIPELINE)
    return root


@pytest.fixture(scope="module")
def finished(project: Path) -> tuple[Path, Path, subprocess.CompletedProcess]:
    data = project / "data"
    done = etn("run", project / "conv.toml", "-d", data)
    assert done.returncode == 0, done.stderr
    return project / "conv.toml", data, done


def log_lines(stderr: str) -> list[str]:
    """The lines of a log written off a terminal, each checked for its ISO 8601 time stamp and
    returned without it; ``error:`` lines carry none (they start with ``error:``, as in git)."""
    lines = stderr.splitlines()
    assert all(STAMP.match(line) or line.startswith("error: ") for line in lines), stderr
    return [STAMP.sub("", line) for line in lines]


def one_line_usage_error(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["lst"], "Did you mean 'ls'?"),
        (["run"], "Missing argument"),
        (["ls", "heeds"], "Did you mean 'heads'?"),
        (["run", "--bogus"], "No such option"),  # click words it two ways across versions
        (["report", "--format", "xls", "{pipeline}"], "Unknown format 'xls'"),
        (["report", "--metric", "bogus", "{pipeline}"], "aupr, auroc, fpr95"),
        (["run", "--metric", "aurocc", "{pipeline}"], "Did you mean 'auroc'?"),
        (["report", "--metric", "auc", "{pipeline}"], "Did you mean 'auroc'?"),
        (["report", "--rows", "{pipeline}"], "add --format json"),
        (
            ["run", "{pipeline}", "--set", "heads.etn.epochs=-1"],
            "'epochs' must be an integer in 1 .. 100,000",
        ),
        (["run", "{pipeline}", "--set", "heads.etn.lr=-1"], "'lr' must be a number in (0, 1e6]"),
        (["run", "{pipeline}", "--set", "heads.etn.batch_size=0"], "'batch_size' must be"),
        (["run", "{pipeline}", "--set", "heads.etn.epoch=3"], "Did you mean 'epochs'?"),
        (["run", "{pipeline}", "--set", "heads.etn.prior_mode='x'"], "expected float"),
        (["run", "{pipeline}", "--set", "seeds=[]"], "seeds must be a non-empty list"),
        (["train", "{pipeline}", "--device", "gpu"], "Unknown device 'gpu'"),
        (["run", "--format", "csv"], "Missing argument 'PIPELINE'"),
        (["status", "{pipeline}", "-f", "yaml"], "Unknown format 'yaml'"),
    ],
)
def test_usage_errors_are_one_line_exit_2_and_write_nothing(
    project: Path, tmp_path: Path, args: list[str], phrase: str
) -> None:
    data = tmp_path / "data"
    args = [a.replace("{pipeline}", str(project / "conv.toml")) for a in args]
    done = etn(*args, "-d", data) if args[0] not in ("lst", "ls") else etn(*args)
    one_line_usage_error(done)
    assert phrase in done.stderr, done.stderr
    assert not data.exists()


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["run", "--format", "csv"], "Missing argument"),
        (["run", "{pipeline}", "--set", "seeds=[0, 0]"], "distinct"),
        (["run", "{pipeline}", "--set", "heads.etm.lr=1"], "Did you mean 'etn'?"),
        (["run", "{pipeline}", "--set", "nonsense"], "--set expects KEY=VALUE"),
        (["run", "{pipeline}", "--set", "data.batch_size=0"], "[features]"),
        (["run", "{pipeline}", "--only", "mpa"], "Did you mean 'map'?"),
        (["run", "{pipeline}", "--only", ","], "--only expects head names"),
        (["status", "{pipeline}", "-f", "yaml"], "Unknown format 'yaml'"),
    ],
)
def test_more_usage_errors_in_process(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], phrase: str
) -> None:
    from etn_cli.cli.app import main

    args = [a.replace("{pipeline}", str(project / "conv.toml")) for a in args]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "-d", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and phrase in err, err
    assert not (tmp_path / "data").exists()


DIGITS = tiny_pipeline("bad", backbone={"epochs": None}, heads=({"name": "etn", "epochs": 2},))


@pytest.mark.parametrize(
    ("edit", "phrases"),
    [
        (
            ("epochs = 2", "epochs = -1"),
            ["[[heads]] 'etn'", "'epochs' must be an integer in 1 .. 100,000"],
        ),
        (
            ('ood = ["digits_unseen"]', 'ood = ["digits_unsen"]'),
            ["[data] ood: Unknown dataset 'digits_unsen'", "Did you mean: digits_unseen"],
        ),
        (('id = "digits"', 'id = "digts"'), ["[data] id: Unknown dataset 'digts'"]),
        (
            ('name = "digits_cnn"', 'name = "digits_cnm"'),
            ["[backbone] name: Unknown backbone 'digits_cnm'", "Did you mean: digits_cnn?"],
        ),
    ],
)
def test_bad_values_and_names_in_a_pipeline_file_are_one_line_naming_file_and_key(
    tmp_path: Path, edit: tuple[str, str], phrases: list[str]
) -> None:
    pipeline, data = tmp_path / "bad.toml", tmp_path / "data"
    pipeline.write_text(DIGITS.replace(*edit))
    assert edit[0] in DIGITS
    for command in ("run", "status", "report"):
        done = etn(command, pipeline, "-d", data)
        one_line_usage_error(done)
        assert done.stderr.startswith(f"error: {pipeline}"), done.stderr
        assert all(phrase in done.stderr for phrase in phrases), done.stderr
        assert not data.exists()


def test_a_data_directory_that_cannot_be_created_is_one_line(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from etn_cli.cli.app import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for command in ("run", "extract"):
        with pytest.raises(SystemExit) as exit_:
            main([command, str(project / "conv.toml"), "-d", str(blocker / "data")])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1, err
        assert "Cannot create the data directory" in err and "Not a directory" in err
    with pytest.raises(SystemExit) as exit_:
        main(["ls", "pipelines", "--folder", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Expected a folder of pipeline files" in err


def test_device_cuda_without_a_gpu_says_what_to_use_instead(project: Path, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = etn("train", project / "conv.toml", "--device", "cuda", "-d", tmp_path / "d")
    one_line_usage_error(done)
    assert "no CUDA GPU" in done.stderr and "--device cpu" in done.stderr
    assert not (tmp_path / "d").exists()
    # planning the digits pipeline would train its CNN: the device is refused before that
    digits = REPO / "pipelines" / "digits.toml"
    done = etn("run", digits, "--device", "cuda", "--dry-run", "-d", tmp_path / "d")
    one_line_usage_error(done)
    assert "no CUDA GPU" in done.stderr and not (tmp_path / "d").exists()


@pytest.mark.slow  # five more starts of the entry point: about 20 s
def test_cuda_asked_for_any_way_without_a_gpu_is_refused_before_work(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    digits = REPO / "pipelines" / "digits.toml"
    for args in (
        ["run", digits, "--device", "cuda:1"],
        ["extract", digits, "--device", "cuda"],
        ["run", digits, "--set", "device=cuda"],
        ["run", digits, "--set", "device=cuda", "--dry-run"],
    ):
        done = etn(*args, "-d", tmp_path / "d")
        one_line_usage_error(done)
        assert "no CUDA GPU" in done.stderr and not (tmp_path / "d").exists(), args
    done = etn("run", digits, "--set", "device=tpu", "--dry-run", "-d", tmp_path / "d")
    one_line_usage_error(done)
    assert "Unknown device 'tpu'" in done.stderr


def test_every_option_names_itself_whatever_typer_derives() -> None:
    """Each option declares its own ``--name``: typer 0.27 derived ``--DEVICE`` from a
    metavar where none was declared, and refused ``--device``."""
    import inspect
    import typing

    import typer.models

    from etn_cli.cli.app import app

    undeclared = []
    for command in app.registered_commands:
        hints = typing.get_type_hints(command.callback, include_extras=True)
        for name in inspect.signature(command.callback).parameters:
            for info in getattr(hints.get(name), "__metadata__", ()):
                if not isinstance(info, typer.models.OptionInfo):
                    continue
                # in Annotated[...], typer keeps the first declaration where a default would be
                declared = [*info.param_decls, info.default]
                if not any(isinstance(d, str) and d.startswith("--") for d in declared):
                    undeclared.append(f"{command.callback.__name__}({name})")
    assert not undeclared, f"options without a declared --name: {undeclared}"


def test_help_version_and_completion_are_there() -> None:
    for args in (["-h"], ["--help"], ["run", "-h"], ["report", "-h"]):
        done = etn(*args)
        assert done.returncode == 0 and "Usage: etn" in done.stdout, args
    assert "--install-completion" in etn("--help").stdout
    version = etn("--version")
    assert version.returncode == 0 and version.stdout.startswith("etn ")


def test_off_a_terminal_each_unit_is_one_plain_line_with_its_time(finished) -> None:
    pipeline, _, done = finished
    err = done.stderr
    assert "\r" not in err and "\x1b[" not in err  # no bars, no colour in a log
    lines = log_lines(err)  # each line stamped with the time, for a cron log
    # own features: nothing to extract, each split one line saying so
    skipped = [line for line in lines if ": skipped, " in line]
    assert (
        len(skipped) == 4
        and skipped[0] == "[ 1/12] extract  toy (adapt): skipped, your own features"
    )
    units = [line for line in lines if not line.startswith("report ")]  # its slow steps vary
    started = [line for line in units if line.endswith(": started")]
    finished_lines = [line for line in units if ": done in " in line]
    # ETN x 2 seeds, MAP and Mahalanobis (seed-free: fitted once), trained and scored
    assert len(started) == len(finished_lines) == 8
    assert finished_lines[0].startswith("[ 5/12] train    ETN seed 0: done in ")
    assert lines[0].startswith("etn: data directory ")
    closing = lines[-1].replace(str(pipeline), "conv.toml")  # as a relative path would show
    assert closing.startswith("ok conv.toml (") and len(closing) <= 100, lines[-1]


def test_a_run_ends_with_the_full_paths_of_its_report(finished) -> None:
    """Not a path relative to a data directory printed hundreds of lines earlier: the main
    files' absolute paths as ``etn report`` names them, then the folder of the rest."""
    _, data, done = finished
    folder = (data / "reports" / "conv").resolve()
    *wrote, closing = log_lines(done.stderr)[-4:]
    assert wrote[:2] == [f"wrote {folder}/summary.txt", f"wrote {folder}/results.json"]
    rest = len([p for p in folder.iterdir() if p.suffix != ".json"]) - 1  # summary.txt shown
    assert wrote[2] == f"wrote {rest} more tables and plots in {folder}/ (etn report lists them)"
    assert re.fullmatch(r"ok \S+ \([\d.]+ s\): 8 built, 4 up to date", closing), closing


def test_quiet_prints_only_the_table_and_verbose_says_why(finished) -> None:
    pipeline, data, _ = finished
    quiet = etn("run", pipeline, "-d", data, "-q")
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert "ETN" in quiet.stdout and "seeds" in quiet.stdout
    # a rerun off a terminal (cron, | tee): one line per unit found done, none started
    again = log_lines(etn("run", pipeline, "-d", data).stderr)
    skipped = [line for line in again if ": skipped, " in line]
    assert len(skipped) == 12 and not any(line.endswith(": started") for line in again)
    assert "[ 5/12] train    ETN seed 0: skipped, up to date" in skipped
    verbose = etn("run", pipeline, "-d", data, "-v")
    assert "train    ETN seed 1: skipped, up to date" in verbose.stderr
    assert "extract  far (ood): skipped, your own features" in verbose.stderr


def test_the_default_table_fits_100_columns_and_shows_calibration(finished) -> None:
    pipeline, data, _ = finished
    out = etn("report", pipeline, "-d", data).stdout
    assert max(len(line) for line in out.splitlines()) <= 100
    header = out.splitlines()[1].split()
    assert header[:3] == ["Method", "ACC", "ECE"] and "AUROC" in header and "FPR95" in header
    assert "AUPR(MP)" in header and "95% CI over 2 seeds" in out
    assert "Mahalanobis [md]" in out  # its own score, named
    single = etn("report", pipeline, "-d", data, "--set", "seeds=[0]").stdout
    assert "±" not in single and "one seed" in single


def in_process(*args: object) -> tuple[int, str]:
    """``etn ARGS`` in this process: exit status and standard output. For the loops over many
    formats and metrics, where the output is under test rather than the process (each start of
    ``etn`` costs seconds); the other commands of these tests go through the entry point."""
    from typer.testing import CliRunner

    from etn_cli.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout


def test_every_format_parses(finished) -> None:
    pipeline, data, _ = finished
    # in process: the formats are under test here; the entry point's report is tested above
    run = lambda *a: in_process("report", pipeline, "-d", data, *a)[1]  # noqa: E731
    csv = pl.read_csv(run("-f", "csv").encode())
    assert csv.columns[0] == "Method" and csv.height == 3
    shown = json.loads(run("-f", "json"))  # what the table shows: methods x columns
    assert (
        shown["view"] == "summary"
        and [r["method"] for r in shown["rows"]] == csv["Method"].to_list()
    )
    cell = shown["rows"][0]["cells"]["toy ACC"]
    assert cell["metric"] == "acc" and {"mean", "ci95", "n_seeds"} <= set(cell)
    records = json.loads(run("-f", "json", "--rows"))["results"]  # every row, as results.json
    keys = {"method", "metric", "score", "eval_set", "mean", "ci95_half_width", "n_seeds"}
    assert keys <= set(records[0]) and {r["metric"] for r in records} >= {"acc", "ece", "auroc"}
    assert len(records) > 5 * len(shown["rows"])
    assert run("-f", "markdown").startswith("| Method")
    tex = run("-f", "latex", "--metric", "aupr")
    assert r"\toprule" in tex and r"\textbf{" in tex and r"\underline{" in tex
    for fmt in ("table", "markdown", "csv", "json", "latex"):
        code, status = in_process("status", pipeline, "-d", data, "-f", fmt)
        assert code == 0 and "ETN seed 1" in status, fmt
    results = json.loads((data / "reports" / "conv" / "results.json").read_text())
    assert results["etn_version"] and len(results["metrics_keys"]) == 4


def test_metric_chooses_any_metric_the_evaluation_writes(finished) -> None:
    pipeline, data, _ = finished
    for metric in ("aupr", "auroc", "fpr95", "acc", "ece", "nll", "brier", "runtime"):
        code, out = in_process("report", pipeline, "-d", data, "--metric", metric)
        assert code == 0 and "ETN" in out, (metric, out)
    ece = in_process("report", pipeline, "-d", data, "--metric", "ece")[1]
    assert "ECE" in ece and "NLL" in ece and "BRIER" in ece


def test_every_metric_table_fits_100_columns_and_explains_own(finished) -> None:
    from etn_cli.report.metric_names import METRICS, RANKING

    pipeline, data, _ = finished
    for metric in METRICS:
        code, out = in_process("report", pipeline, "-d", data, "--metric", metric, "-f", "table")
        lines = out.splitlines()
        assert code == 0 and max(map(len, lines)) <= 100, (metric, out)
        if metric in RANKING:  # cut into blocks, each repeating the Method column
            assert sum(line.startswith("Method ") for line in lines) >= 2, metric
            assert "Mahalanobis [md]" in out
            own = "Own: the method's own OOD score, named in brackets after it"
            assert own in out, metric
    wide = etn("report", pipeline, "-d", data, "--metric", "auroc", "-f", "csv").stdout
    assert max(map(len, wide.splitlines())) > 100  # other formats keep one wide table


def test_overrides_change_the_keys_of_exactly_the_units_they_touch(finished) -> None:
    pipeline, data, _ = finished
    plan = etn("run", pipeline, "-d", data, "--dry-run", "--set", "heads.etn.epochs=4").stdout
    building = [line.split(None, 3)[3] for line in plan.splitlines() if "would build" in line]
    assert building == ["ETN seed 0", "ETN seed 1", "ETN seed 0", "ETN seed 1"]
    same = etn("run", pipeline, "-d", data, "--dry-run", "--set", "heads.etn.epochs=3").stdout
    assert "0 to build" in same  # the file's own value: the same keys
    only = etn("run", pipeline, "-d", data, "--dry-run", "--only", "map").stdout
    assert "ETN" not in only and "MAP seed 0" in only


def test_overrides_are_recorded_in_the_head_provenance(finished, tmp_path: Path) -> None:
    pipeline, data, _ = finished
    done = etn("train", pipeline, "-d", data, "--set", "heads.etn.epochs=2", "--only", "etn")
    assert done.returncode == 0, done.stderr
    records = [json.loads(p.read_text()) for p in (data / "heads").glob("etn-*/train.json")]
    two = [r for r in records if r["config"]["epochs"] == 2]
    assert len(two) == 2 and "--set heads.etn.epochs=2" in two[0]["provenance"]["command"]


def test_a_subset_or_override_run_reports_into_its_own_folder(finished) -> None:
    from etn_cli.planning.pipeline import load_pipeline

    pipeline, data, _ = finished
    full = data / "reports" / "conv" / "results.json"
    etn("report", pipeline, "-d", data)
    before = full.read_bytes()
    done = etn("run", pipeline, "-d", data, "--only", "map", "-f", "json")
    assert done.returncode == 0, done.stderr
    key = load_pipeline(pipeline, only=("map",)).selection_key
    folder = data / "reports" / f"conv+{key}"
    assert f"wrote {folder.resolve()}/results.json" in done.stderr  # its full path
    assert full.read_bytes() == before  # the whole pipeline's report is left alone
    subset = json.loads((folder / "results.json").read_text())
    assert subset["selection"] == {"set": [], "only": ["map"], "key": key}
    assert len(subset["metrics_keys"]) == 1 and {r["method"] for r in subset["results"]} == {"map"}
    assert json.loads(before)["selection"] == {"set": [], "only": [], "key": None}
    again = etn("report", pipeline, "-d", data, "--only", "map")  # the same options, same folder
    assert again.returncode == 0 and f"wrote {folder / 'results.json'}" in again.stderr
    assert full.read_bytes() == before


def test_the_report_folder_is_keyed_by_the_effect_of_the_options(finished) -> None:
    from etn_cli.planning.pipeline import load_pipeline

    pipeline, _, _ = finished

    def key(*overrides: str, only: tuple[str, ...] = ()) -> str | None:
        return load_pipeline(pipeline, overrides, only).selection_key

    one = key("seeds=[0]", "heads.etn.epochs=5", only=("etn", "map"))
    assert one == key("heads.etn.epochs = 5", "seeds=[0]", only=("map", "etn"))
    assert one != key("heads.etn.epochs=6", "seeds=[0]", only=("etn", "map"))
    # the last of two values wins, so the two orders are two pipelines with two folders
    assert key("heads.etn.epochs=5", "heads.etn.epochs=7") == key("heads.etn.epochs=7")
    assert key("heads.etn.epochs=5", "heads.etn.epochs=7") != key(
        "heads.etn.epochs=7", "heads.etn.epochs=5"
    )
    assert key() is None and key("heads.etn.epochs=3") is None  # the file's own value
    assert key(only=("map", "etn", "mahalanobis")) is None and len(one) == 8


def test_read_only_commands_create_nothing(project: Path, tmp_path: Path) -> None:
    data = tmp_path / "empty"
    status = etn("status", project / "conv.toml", "-d", data)
    assert status.returncode == 0 and "no data directory" in status.stdout
    report = etn("report", project / "conv.toml", "-d", data)
    assert report.returncode == 2 and "etn run" in report.stderr
    assert etn("verify", "-d", data).returncode == 2
    digits = etn("status", REPO / "pipelines" / "digits.toml", "-d", data)  # no CNN trained
    assert digits.returncode == 0 and "missing" in digits.stdout
    assert not data.exists()


def test_the_data_directory_defaults_to_the_user_cache(project: Path, tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "ETN_DATA_DIR": ""}
    plan = etn("run", project / "conv.toml", "--dry-run", env=env).stdout
    assert f"(data directory {tmp_path / 'cache' / 'etn'})" in plan
    env["ETN_DATA_DIR"] = str(tmp_path / "mine")
    assert (
        f"(data directory {tmp_path / 'mine'})"
        in etn("run", project / "conv.toml", "--dry-run", env=env).stdout
    )
    file = tmp_path / "afile"
    file.write_text("x")
    one_line_usage_error(etn("status", project / "conv.toml", "-d", file))


def test_each_report_view_keeps_its_files_through_the_other_reports(finished) -> None:
    from etn_cli.report.plot_record import read_plot_record, write_plot_record

    pipeline, data, _ = finished
    folder = data / "reports" / "conv"
    done = etn("report", pipeline, "-d", data, "--metric", "auroc")
    written = [line.removeprefix("wrote ") for line in done.stderr.splitlines()]
    assert str(folder / "frontier-auroc.png") in written and str(folder / "results.json") in written
    assert etn("report", pipeline, "-d", data, "--compare", "map").returncode == 0
    record = read_plot_record(folder)  # as if an earlier etn had written a summary table more
    (folder / "retired.txt").write_text("an old table")
    views = {**record["views"], "summary": [*record["views"]["summary"], "retired.txt"]}
    write_plot_record(folder, record["key"], record["drawn"], views)
    assert etn("report", pipeline, "-d", data).returncode == 0
    for name in ("frontier-auroc.png", "frontier-auroc.pdf", "auroc.md", "compare-map.txt"):
        assert (folder / name).is_file(), name
    assert not (folder / "retired.txt").exists()  # the summary view's own stale file
    assert (folder / "frontier-aupr.png").is_file() and (folder / "summary.txt").is_file()
    assert {"summary", "auroc", "compare-map"} <= set(read_plot_record(folder)["views"])


def test_a_report_says_each_step_slower_than_two_seconds(finished, monkeypatch) -> None:
    from cli_runner import etn as etn_here

    from etn_cli import progress

    pipeline, data, _ = finished
    monkeypatch.setattr(progress, "SLOW_S", 0.0)  # every step is slow
    code, output = etn_here("report", pipeline, "-d", data, "--compare", "map")
    assert code == 0, output
    lines = [STAMP.sub("", line) for line in output.splitlines() if STAMP.match(line)]
    for step in ("summary of 4 metrics files", "paired bootstrap against map", "plots"):
        assert f"report   conv: {step}: started" in lines, output
        assert any(line.startswith(f"report   conv: {step}: done in ") for line in lines), output


def test_a_quiet_report_prints_the_table_alone(finished) -> None:
    pipeline, data, _ = finished
    done = etn("report", pipeline, "-d", data, "-q", "--metric", "aurc")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "AURC" in done.stdout


@pytest.mark.parametrize(
    "override", ["heads.etn.epochs=-1", "heads.etn.epoch=3", "seeds=[0, 0]", "bogus=1"]
)
def test_a_bad_override_names_its_set_option_not_the_file(
    project: Path, tmp_path: Path, override: str
) -> None:
    done = etn("report", project / "conv.toml", "-d", tmp_path / "data", "--set", override)
    one_line_usage_error(done)
    assert f"--set {override}" in done.stderr and "conv.toml" not in done.stderr, done.stderr


@pytest.mark.parametrize("given", ["digits", "pipelines/digits.toml", "linked"])
def test_a_bad_override_of_a_shipped_or_linked_pipeline_names_its_set_option(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is named by a shipped name, a path through the clone's ``pipelines`` link, or
    an absolute path: the error names the ``--set`` whole, never a path with the option spliced
    into it (``.../pipelines/--set heads.etn.lr=-1.toml``)."""
    from etn_cli.cli.build import checked_pipeline
    from etn_cli.errors import EtnError

    monkeypatch.chdir(REPO)
    path = REPO / "pipelines" / "digits.toml" if given == "linked" else Path(given)
    with pytest.raises(EtnError) as refused:
        checked_pipeline(path, ["heads.etn.lr=-1"])
    message = str(refused.value)
    assert message.startswith("--set heads.etn.lr=-1 [[heads]] 'etn': key 'lr'"), message


def test_the_docs_show_the_shipped_digits_pipeline() -> None:
    readme = (REPO / "docs" / "pipelines.md").read_text()
    shipped = (REPO / "pipelines" / "digits.toml").read_text()
    start = readme.index("```toml\n# pipelines/digits.toml") + len(
        "```toml\n# pipelines/digits.toml\n"
    )
    listed = readme[start : readme.index("```", start)]
    assert tomllib.loads(listed) == tomllib.loads(shipped)
    assert listed.strip() == shipped.strip()


def readme_figures():
    """``benchmarks/readme_figures.py``, the script that renders the README's figure blocks."""
    import importlib.util

    path = REPO / "benchmarks" / "readme_figures.py"
    spec = importlib.util.spec_from_file_location("readme_figures", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_stale_block_is_told_from_a_value_rounding_the_other_way() -> None:
    figures = readme_figures()
    shown = "<!-- figures: t -->\nETN  97.5±0.0  88.5±0.8*\nMAP  97.5  0.683\n<!-- /figures -->\n"
    fresh = {"t": "ETN  97.5±0.0  88.4±0.8*\nMAP  97.5  0.684\n"}
    assert figures.stale_blocks(shown, fresh, last_digits=1) == []  # rounding the other way
    assert figures.stale_blocks(shown, fresh) == ["t"]  # exactly as printed
    for stale in ("ETN  97.5±0.0  88.2±0.8*\n", "Energy  97.5±0.0  88.5±0.8*\n"):
        assert figures.stale_blocks(shown, {"t": stale + "MAP  97.5  0.683\n"}, 1) == ["t"]
    assert figures.stale_blocks(shown, {"t": fresh["t"] + "DUQ  96.8\n"}, 1) == ["t"]
    assert figures.rewrite(shown, fresh).count("88.4") == 1


def test_the_quick_start_prints_the_table_the_readme_shows(quick_start: QuickStart) -> None:
    """The README's first screen is the real output, and so is every figure the README and
    ``docs/`` quote from the digits default: the Quick start's run, in a fresh data directory,
    renders each marked block (``benchmarks/readme_figures.py``) as the documents show it, up
    to one unit of the last printed digit (a value on a rounding boundary, where another
    processor's float kernels differ in the last bits; the digits CNN itself is the same on
    every processor). A rerun prints the same table again. (``tests/test_docs.py`` runs the
    documents' other commands and snippets.)"""
    figures = readme_figures()
    documents = figures.documents_text()
    first = quick_start.done
    assert max(map(len, first.stdout.splitlines())) <= 100
    run = figures.read_results(figures.Run(quick_start.data, first.stdout))
    rendered = figures.blocks(run)
    assert set(rendered) <= set(figures.readme_blocks(documents))
    stale = figures.stale_blocks(documents, rendered, last_digits=1)
    assert not stale, {name: rendered[name] for name in stale}
    again = quick_start.etn("run", REPO / "pipelines" / "digits.toml")
    assert again.stdout == first.stdout and "0 built" in again.stderr


def test_the_docs_predict_command_runs_on_the_quick_starts_heads(
    quick_start: QuickStart,
    tmp_path: Path,
) -> None:
    """docs/api.md's command on the Quick start's heads, as written (from the repository)."""
    out = tmp_path / "preds.parquet"
    digits = REPO / "pipelines/digits.toml"
    predict = quick_start.etn("predict", digits, "digits:test", "--head", "etn", "--out", out)
    assert predict.returncode == 0 and out.is_file(), predict.stderr
