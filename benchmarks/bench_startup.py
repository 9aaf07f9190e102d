"""How fast does etn answer ``--help`` and refuse a mistake in a pipeline file?

Method: each command runs ``--repeats`` times as a new process (wall time of the whole
command; best and median), beside the reference measured in the same run, also as new
processes: ``python -c "import torch"``, the floor of any command that plans heads. The
figures are the times and their ratio to that reference, so they compare across machines.

* ``etn --help``
* ``etn run bad.toml``: the digits pipeline with one misspelt head setting (``prior_mod``),
  refused in one line; nothing else happens
* the same kind of refusal for a misspelt ``[backbone]`` option (``--set backbone.epochz=3``),
  an option given to a dataset that takes none (``--set data.options.digits.size=3``), and
  ``etn predict`` with a threshold that is no number, an ``--out`` that is no Parquet or CSV
  or an input path that does not exist, and ``[data] root`` naming no folder
* ``etn run pipelines/digits.toml --dry-run`` into an empty data directory: plans every unit
  (this one loads torch and the heads) and prints what a run would build

    python benchmarks/bench_startup.py [--repeats 5]

To compare two checkouts, run it with each on ``PYTHONPATH`` (the commands inherit it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "pipelines" / "digits.toml"
IMAGES = ROOT / "examples" / "images.toml"


def wall(command: list[str], repeats: int, expect: int = 0) -> list[float]:
    """Wall seconds of ``repeats`` runs of ``command``, which must exit with ``expect``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if done.returncode != expect:
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    return times


def etn_command() -> list[str]:
    """The installed ``etn`` script of this interpreter, else ``python -m etn_cli``."""
    script = Path(sys.executable).with_name("etn")
    found = str(script) if script.is_file() else shutil.which("etn")
    return [found] if found else [sys.executable, "-m", "etn_cli"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    etn = etn_command()
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad.toml"
        bad.write_text(DIGITS.read_text().replace("prior_mode = 10", "prior_mod = 10", 1))
        data = str(Path(tmp) / "data")
        run = [*etn, "run", str(DIGITS), "-d", data]
        predict = [*etn, "predict", str(DIGITS), "digits:test", "-d", data]
        missing_input = [*etn, "predict", str(DIGITS), "nothere/", "-d", data]
        cases = [
            ('python -c "import torch"', [sys.executable, "-c", "import torch"], 0),
            ("etn --help", [*etn, "--help"], 0),
            ("etn run bad.toml (misspelt key)", [*etn, "run", str(bad), "-d", data], 2),
            ("etn run --set backbone.epochz=3", [*run, "--set", "backbone.epochz=3"], 2),
            (
                "etn run --set data.options.digits.size=3",
                [*run, "--set", "data.options.digits.size=3"],
                2,
            ),
            ("etn predict --threshold mi=abc", [*predict, "--threshold", "mi=abc"], 2),
            ("etn predict --out rows.txt", [*predict, "--out", "rows.txt"], 2),
            ("etn predict nothere/ (no such input)", missing_input, 2),
            (
                "etn run examples/images.toml --set data.root=nowhere",
                [*etn, "run", str(IMAGES), "-d", data, "--set", "data.root='nowhere'"],
                2,
            ),
            (
                "etn run pipelines/digits.toml --dry-run",
                [*etn, "run", str(DIGITS), "--dry-run", "-d", data],
                0,
            ),
        ]
        wall([sys.executable, "-c", "pass"], 1)  # warm the file cache
        results = [(name, wall(command, args.repeats, code)) for name, command, code in cases]
    reference = statistics.median(results[0][1])
    print(f"etn: {' '.join(etn)}; {args.repeats} runs each, new processes\n")
    print(f"| {'command':<40} | best s | median s | x import torch |")
    print(f"|{'-' * 42}|--------|----------|----------------|")
    for name, times in results:
        median = statistics.median(times)
        print(f"| {name:<40} | {min(times):6.2f} | {median:8.2f} | {median / reference:14.2f} |")


if __name__ == "__main__":
    main()
