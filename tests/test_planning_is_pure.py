"""Planning reads files and computes keys: it trains, builds and loads nothing. A dry run and a
read-only command on a fresh data directory leave it as they found it and construct no torch
module, not even the digits CNN that a run trains first (checked in a new process, through the
command line, with ``torch.nn.Module.__init__`` watched)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tiny_pipeline import write_pipeline

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "pipelines" / "digits.toml"

WATCHED_CLI = """
import sys
import torch

built = []
construct = torch.nn.Module.__init__


def watched(self, *args, **kwargs):
    built.append(type(self).__name__)
    construct(self, *args, **kwargs)


torch.nn.Module.__init__ = watched
from etn_cli.cli.app import main

try:
    main(sys.argv[1:])
    code = 0
except SystemExit as exit_:
    code = exit_.code
print("torch modules constructed: " + ",".join(built), file=sys.stderr)
sys.exit(code)
"""


def watched_etn(*args: str | Path) -> tuple[int, str, str, list[str]]:
    """``etn ARGS`` in a new process: exit code, stdout, stderr (less the watch's line) and
    the torch modules it constructed."""
    command = [sys.executable, "-c", WATCHED_CLI, *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    *lines, watch = done.stderr.rstrip("\n").split("\n")
    assert watch.startswith("torch modules constructed: "), done.stderr
    modules = [name for name in watch.split(": ", 1)[1].split(",") if name]
    return done.returncode, done.stdout, "\n".join(lines), modules


def test_a_dry_run_on_a_fresh_data_directory_writes_nothing_and_builds_no_model(
    tmp_path: Path,
) -> None:
    data = tmp_path / "fresh"
    code, out, err, modules = watched_etn("run", DIGITS, "-d", data, "--dry-run")
    assert code == 0, err
    assert "would build features   adapt" in out and "0 cached" in out, out
    assert modules == [], modules  # the digits CNN is neither trained nor loaded
    assert not data.exists()


def test_predict_with_an_unknown_head_refuses_before_building_anything(tmp_path: Path) -> None:
    data = tmp_path / "fresh"
    code, out, err, modules = watched_etn(
        "predict", DIGITS, "digits:test", "--head", "nosuch", "-d", data
    )
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 0, err
    assert "nosuch" in err and out == ""
    assert modules == [], modules
    assert not data.exists()


def test_a_dry_run_after_a_run_plans_the_keys_the_run_built(tmp_path: Path) -> None:
    """The plan is made once: a command that extracts builds the digits CNN (stage zero, keyed
    by its recipe) before the features are keyed, and a dry run after it plans the same keys
    from the record the build left. The plan holds specs and cannot be changed."""
    import dataclasses

    import pytest

    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan
    from etn_cli.stages.prepare import plan_for_extract

    data = tmp_path / "data"
    pipeline = write_pipeline(tmp_path, "small", backbone={"epochs": 1})
    plan = make_plan(load_pipeline(pipeline), data)
    unbuilt = [unit.path for unit in plan.feature_units]
    assert plan.backbone.fingerprint["weights_sha256"] == "not built"
    assert not plan.backbone.cache_folder.exists()  # planning built nothing
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.heads = ()  # type: ignore[misc]
    built = plan_for_extract(load_pipeline(pipeline), data)
    assert (built.backbone.cache_folder / "meta.json").is_file()
    assert built.backbone.cache_folder == plan.backbone.cache_folder  # keyed by its recipe
    assert built.backbone.fingerprint["weights_sha256"] != "not built"
    assert [unit.path for unit in built.feature_units] != unbuilt  # keyed by the weights
    again = make_plan(load_pipeline(pipeline), data)
    assert [u.path for u in again.feature_units] == [u.path for u in built.feature_units]
    assert [u.path for u in again.heads] == [u.path for u in built.heads]
