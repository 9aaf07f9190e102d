"""``etn --help`` and every usage or pipeline-file error answer without importing torch,
h5py, numpy or any head: the entry point runs in a new process and the test reads which
modules it loaded (how fast that is, ``benchmarks/bench_startup.py`` measures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "pipelines" / "digits.toml"
HEAVY = ("torch", "h5py", "numpy", "safetensors", "xxhash", "polars", "etn_cli.heads.base")
# the entry point as `etn` runs it, then the heavy modules it loaded, as JSON on stdout
PROBE = f"""
import json, runpy, sys
sys.argv = ["etn", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("etn_cli", run_name="__main__")
except SystemExit as exit_:
    code = exit_.code
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def run_etn(*args: str, cwd: Path) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["code"], result["heavy"], done.stderr


def misspelt(tmp_path: Path, old: str, new: str) -> str:
    text = DIGITS.read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def test_help_loads_no_heavy_module(tmp_path: Path) -> None:
    for args in (["--help"], ["run", "--help"], ["report", "--help"], ["ls", "backbones"]):
        code, heavy, _ = run_etn(*args, cwd=tmp_path)
        assert code == 0 and heavy == [], (args, heavy)


REFUSALS = {  # what is wrong -> (how to make it, in the refusal's line)
    "misspelt top-level key": ("seeds = [0, 1, 2]", "seed = [0, 1, 2]", "Did you mean 'seeds'"),
    "misspelt head setting": ("prior_mode = 10", "prior_mod = 10", "Did you mean 'prior_mode'"),
    "unknown head": ('name = "etn_offset"', 'name = "etn_ofset"', "Unknown head 'etn_ofset'"),
    "unknown dataset": ('id = "digits"', 'id = "digit"', "Unknown dataset 'digit'"),
    "unknown backbone": ('name = "digits_cnn"', 'name = "digit_cnn"', "Unknown backbone"),
    "bad head value": ("prior_mode = 10", "prior_mode = -1", "'prior_mode' must be"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
@pytest.mark.parametrize("command", ["run", "train", "status"])
def test_a_mistake_in_the_pipeline_file_is_refused_before_torch_loads(
    tmp_path: Path, case: str, command: str
) -> None:
    old, new, said = REFUSALS[case]
    bad = misspelt(tmp_path, old, new)
    code, heavy, stderr = run_etn(command, bad, "-d", str(tmp_path / "data"), cwd=tmp_path)
    assert code == 2 and said in stderr and heavy == [], (stderr, heavy)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--set", "heads.etn.epochs=abc"], "expected int"),
        (["--set", "sed=1"], "Unknown key 'sed'"),
        (["--device", "gpu"], "Unknown device 'gpu'"),
        (["--set", "device=tpu"], "Unknown device 'tpu'"),
        (["--only", "etm"], "has no [[heads]] named 'etm'"),
        (["--metric", "aurpc"], "Unknown metric 'aurpc'"),
        (["--format", "xml"], "Unknown format 'xml'"),
    ],
)
def test_a_bad_option_is_refused_before_torch_loads(
    tmp_path: Path, args: list[str], said: str
) -> None:
    code, heavy, stderr = run_etn("run", str(DIGITS), *args, "-d", str(tmp_path), cwd=tmp_path)
    assert code == 2 and said in stderr and heavy == [], (stderr, heavy)


def test_a_missing_pipeline_file_is_refused_before_torch_loads(tmp_path: Path) -> None:
    code, heavy, stderr = run_etn("run", "nothere.toml", cwd=tmp_path)
    assert code == 2 and "does not exist" in stderr and heavy == [], (stderr, heavy)
