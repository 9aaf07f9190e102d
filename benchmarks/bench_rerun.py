"""How long does rerunning a finished pipeline take, and where does the time go?

Method: ``etn run PIPELINE`` once into a fresh data directory (timed, not part of the figures),
then ``--repeats`` reruns that find everything done, each a new process as cron would start it
(wall time of the whole command, best and median). References measured in the same run, also
as new processes: the Python interpreter alone, ``import torch`` (the floor for any command
that plans heads, whose classes are torch modules) and ``import etn_cli.stages.run`` (every
import a rerun pays before it looks at the data directory).

    python benchmarks/bench_rerun.py [--pipeline pipelines/digits.toml] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall(command: list[str], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` runs of ``command``; a failing run stops the benchmark."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="pipelines/digits.toml")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as data_dir:
        etn = [python, "-m", "etn_cli", "run", args.pipeline, "--data-dir", data_dir]
        first = wall(etn, 1)[0]
        rows = {
            "python -c pass": wall([python, "-c", "pass"], args.repeats),
            "python -c 'import torch'": wall([python, "-c", "import torch"], args.repeats),
            "import etn_cli.stages.run": wall(
                [python, "-c", "import etn_cli.stages.run"], args.repeats
            ),
            f"etn run {args.pipeline} (rerun)": wall(etn, args.repeats),
        }
    print(f"first run into an empty data directory: {first:.1f} s (not repeated)")
    reference = min(rows["python -c 'import torch'"])
    print("| command | best s | median s | × import torch |\n|---|---:|---:|---:|")
    for name, times in rows.items():
        best, median = min(times), statistics.median(times)
        print(f"| {name} | {best:.2f} | {median:.2f} | {best / reference:.2f} |")


if __name__ == "__main__":
    main()
