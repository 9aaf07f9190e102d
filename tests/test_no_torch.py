"""Reading a plan needs no torch: ``etn status``, ``etn report``, ``etn run --dry-run`` and
``etn ls`` run where torch cannot be imported. Each runs through the entry point in a new
process whose ``import torch`` (and torchvision's, timm's, transformers', peft's) raises
ImportError, as on a machine without them, against the Quick start's finished run; the test
then reads which heavy modules the process loaded, as ``tests/test_startup.py`` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import QuickStart

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "pipelines" / "digits.toml"
BLOCKED = ("torch", "torchvision", "timm", "transformers", "peft")
HEAVY = ("torch", "etn_cli.heads.base", "etn_cli.backbones.base", "etn_cli.backbones.digits_cnn")
# the entry point as `etn` runs it, with the blocked packages unimportable (None in
# sys.modules: ``import torch`` raises ImportError), then its exit code and the heavy modules
# it loaded, as JSON on the last line of stdout
PROBE = f"""
import json, runpy, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None
sys.argv = ["etn", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("etn_cli", run_name="__main__")
except SystemExit as exit_:
    code = exit_.code
except ImportError as err:  # a command that needs torch
    code = f"ImportError: {{err}}"
heavy = [m for m in {HEAVY!r} if sys.modules.get(m) is not None]
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def etn_without_torch(*args: object, data: Path) -> tuple[int, list[str], str, str]:
    """``etn ARGS`` where torch cannot be imported: exit code, heavy modules, stdout, stderr."""
    env = {**os.environ, "ETN_DATA_DIR": str(data), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip
    *out, last = done.stdout.rstrip("\n").split("\n")
    result = json.loads(last)
    return result["code"], result["heavy"], "\n".join(out), done.stderr


def test_the_probe_really_blocks_torch(tmp_path: Path) -> None:
    """A command that needs torch fails in the probe: the block is real."""
    code, heavy, _, err = etn_without_torch("train", DIGITS, "-d", tmp_path / "d", data=tmp_path)
    assert code != 0 and "torch" in f"{code} {err}", (code, err[-2000:])
    assert "torch" not in heavy


@pytest.mark.parametrize("what", ["heads", "backbones", "datasets", "pipelines"])
def test_ls_runs_without_torch(tmp_path: Path, what: str) -> None:
    code, heavy, out, err = etn_without_torch("ls", what, data=tmp_path)
    assert code == 0 and heavy == [], (err[-2000:], heavy)
    assert {"heads": "etn", "backbones": "digits_cnn", "datasets": "digits"}.get(
        what, "digits"
    ) in out


def test_status_dry_run_and_report_of_a_finished_run_need_no_torch(
    quick_start: QuickStart,
) -> None:
    data = quick_start.data
    code, heavy, out, err = etn_without_torch("status", DIGITS, data=data)
    assert code == 0 and heavy == [], (err[-2000:], heavy)
    units = out.splitlines()[-1]
    assert " 0 partial, 0 missing" in units and "damaged" not in units, out[-2000:]
    code, heavy, out, err = etn_without_torch("run", DIGITS, "--dry-run", data=data)
    assert code == 0 and heavy == [], (err[-2000:], heavy)
    assert out.splitlines()[-1].endswith(" to build") and " 0 to build" in out, out[-2000:]
    assert "would build" not in out
    # a selection reports into a folder of its own: the run's report stays as it was
    code, heavy, out, err = etn_without_torch("report", DIGITS, "--only", "mcd", data=data)
    assert code == 0 and heavy == [], (err[-2000:], heavy)
    assert "MC dropout" in out, out[-2000:]
