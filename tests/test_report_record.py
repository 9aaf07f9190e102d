"""Report metadata is checked like any artefact (issue 31.3): ``plots.json`` is sealed, names
only files of its own folder, is repaired by the next ``etn report`` when damaged and reported
by ``etn verify``; nothing a damaged record names is deleted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import etn_process as etn
from cli_runner import unstamped
from test_bad_inputs import byof_pipeline
from test_bad_inputs import etn as etn_here

from etn_cli.report.plot_record import PLOT_RECORD, plain_name
from etn_cli.stages.run import run_pipeline
from etn_cli.stages.verify import verify


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("record")
    pipeline = byof_pipeline(root)
    assert run_pipeline(pipeline, root / "data").ok
    return pipeline, root / "data"


@pytest.fixture
def reported(finished, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of a finished run of the tiny own-shards pipeline: (pipeline, data, report)."""
    pipeline, data = finished
    shutil.copytree(pipeline.parent / "mine", tmp_path / "mine")
    shutil.copytree(data, tmp_path / "data")
    (tmp_path / pipeline.name).write_text(pipeline.read_text())
    return tmp_path / pipeline.name, tmp_path / "data", tmp_path / "data" / "reports" / "byof"


def damaged(data: Path) -> list[str]:
    return [d.line() for d in verify(data).damaged]


def test_names_of_other_folders_are_not_plain_names() -> None:
    assert plain_name("summary.md") and plain_name("frontier-aupr.png")
    for name in ("../x", "a/b", "/etc/passwd", ".", "..", ".hidden", "", 3, None, "a\\b"):
        assert not plain_name(name), name


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"files": ["../../../victim.txt"]}),
        json.dumps({"key": "k", "drawn": {}, "files": ["../../../victim.txt"], "sha256": {}}),
        "[]",
        "[" * 100_000,
    ],
    ids=["escaping", "escaping-unsealed", "list", "deep"],
)
def test_a_damaged_plot_record_is_redrawn_and_deletes_nothing_outside(
    reported,
    text,
    capsys,
) -> None:
    pipeline, data, folder = reported
    victim = data.parent / "victim.txt"
    victim.write_text("keep me")
    figures = sorted(p.name for p in folder.glob("*.png"))
    (folder / PLOT_RECORD).write_text(text)
    assert f"DAMAGED {folder / PLOT_RECORD}" in "\n".join(damaged(data))
    code, err = etn_here(capsys, "report", pipeline, "-d", data)
    first = unstamped(err)[0]  # off a terminal, lines start with the time
    assert code == 0 and first.startswith("repair: ") and "Redrawing every figure" in err, err
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in folder.glob("*.png")) == figures
    assert damaged(data) == []
    assert json.loads((folder / PLOT_RECORD).read_text())["folder"] == "byof"


def test_an_empty_plot_record_does_not_stop_the_next_run_of_the_installed_command(
    reported,
) -> None:
    pipeline, data, folder = reported
    (folder / PLOT_RECORD).write_text("")
    done = etn("run", pipeline, "-d", data)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "repair: " in done.stderr and damaged(data) == []


def test_a_changed_figure_is_redrawn_and_reported_by_verify(reported, capsys) -> None:
    pipeline, data, folder = reported
    record = json.loads((folder / PLOT_RECORD).read_text())
    figure = folder / sorted(record["sha256"])[0]
    before = figure.read_bytes()
    figure.write_bytes(b"not the figure")
    assert "no longer matches" in "\n".join(damaged(data))
    code, err = etn_here(capsys, "report", pipeline, "-d", data)
    assert code == 0, err
    assert figure.read_bytes()[:8] == before[:8]  # a PNG or PDF again
    assert damaged(data) == []


def test_a_record_copied_from_another_report_folder_is_refused(reported) -> None:
    _, data, folder = reported
    other = data / "reports" / "other"
    other.mkdir()
    (other / PLOT_RECORD).write_text((folder / PLOT_RECORD).read_text())
    assert "belongs to the report folder 'byof'" in "\n".join(damaged(data))
