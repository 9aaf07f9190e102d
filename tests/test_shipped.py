"""etn works where it is installed, not only in a clone (issue 41): the pipelines and examples
are package data, a shipped pipeline runs by its name from any folder, a path always means a
file. Command-line behaviour through the installed ``etn`` entry point in a subprocess, run
from an empty folder outside the clone."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_refusals import etn, refused

from etn_cli.errors import EtnError
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.shipped import EXAMPLES, PIPELINES, find_pipeline, shipped_pipelines

REPO = Path(__file__).resolve().parents[1]


def test_ls_pipelines_outside_a_clone_lists_the_shipped_ones_by_name(tmp_path: Path) -> None:
    done = etn("ls", "pipelines", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert set(rows) == set(shipped_pipelines()) and "digits_ablation_mc" in rows
    assert "scikit-learn's bundled handwritten digits" in rows["digits"]
    assert all(len(line) <= 100 for line in done.stdout.splitlines())
    assert "etn run digits" in done.stderr  # stdout stays one pipeline a line


def test_ls_examples_says_where_they_are_and_how_to_copy_one(tmp_path: Path) -> None:
    done = etn("ls", "examples", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        f"Examples in {EXAMPLES}" in done.stdout
        and f"cp {EXAMPLES / 'images.toml'} ." in done.stdout
    )
    for name in ("images.toml", "questions.toml", "features.toml", "images_api.py"):
        assert any(line.startswith(f"{name} ") for line in done.stdout.splitlines()), name
    refused(etn("ls", "examples", "--folder", tmp_path, cwd=tmp_path), "--folder lists pipeline")


def test_a_shipped_name_runs_from_any_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = etn("run", "digits", "--dry-run", "-d", data, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("digits (data directory") and "would build" in done.stdout
    assert not data.exists()


def test_a_missing_path_outside_a_clone_names_the_shipped_pipeline(tmp_path: Path) -> None:
    for command in ("run", "status", "report"):
        done = etn(command, "pipelines/digits.toml", "-d", tmp_path / "data", cwd=tmp_path)
        refused(done, "pipelines/digits.toml does not exist here", "runs with `etn run digits`")
    assert not (tmp_path / "data").exists()


def test_an_unknown_name_gets_did_you_mean(tmp_path: Path) -> None:
    done = etn("status", "digts", "-d", tmp_path / "data", cwd=tmp_path)
    refused(done, "Unknown pipeline 'digts'. Did you mean 'digits'?", "No file digts here")


def test_an_existing_file_wins_over_a_shipped_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_pipeline("digits") == PIPELINES / "digits.toml"
    assert load_pipeline(Path("digits")).name == "digits"
    mine = (PIPELINES / "digits.toml").read_text().replace('name = "digits"', 'name = "mine"')
    Path("digits").write_text(mine)
    assert find_pipeline("digits") == Path("digits")
    assert load_pipeline(Path("digits")).name == "mine"


def test_a_path_never_falls_back_to_a_shipped_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for path in ("digits.toml", "pipelines/digits", "pipelines/digits.toml"):
        with pytest.raises(EtnError, match="does not exist here; the shipped pipeline 'digits'"):
            find_pipeline(path)
    with pytest.raises(EtnError, match="nowhere.toml does not exist. List shipped ones"):
        find_pipeline("nowhere.toml")


def test_the_python_api_takes_a_shipped_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import etn_cli

    monkeypatch.chdir(tmp_path)  # no head trained: the name was found, the head was not
    with pytest.raises(EtnError, match=r"is not trained.*Run `etn train digits`"):
        etn_cli.load_head(pipeline="digits", head="etn", seed=0, data_dir=tmp_path / "data")
    with pytest.raises(EtnError, match="shipped pipeline 'digits' runs with `etn run digits`"):
        etn_cli.EvidentialModel.from_pipeline("pipelines/digits.toml", data_dir=tmp_path)


def test_the_clone_paths_are_links_to_the_package_data() -> None:
    for name in ("pipelines", "examples"):
        assert (REPO / name).is_symlink() and (REPO / name).resolve() == REPO / "etn_cli" / name
    assert (REPO / "pipelines" / "digits.toml").is_file()


def test_the_wheel_holds_every_pipeline_and_example(tmp_path: Path) -> None:
    """Built from a copy of the sources, so no stale build/ folder of the clone can add a file
    the package data would miss."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "my_*", "model.safetensors")
    shutil.copytree(REPO / "etn_cli", source / "etn_cli", ignore=skip)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*command, "-w", tmp_path / "wheel", source], capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("etn_cli-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [*PIPELINES.glob("*.toml"), *EXAMPLES.glob("*.toml"), *EXAMPLES.glob("*.py")]
    expected = {f"etn_cli/{p.parent.name}/{p.name}" for p in shipped}
    assert len(expected) >= 19 and expected <= names, sorted(expected - names)
    assert not any("/my_" in name for name in names)
