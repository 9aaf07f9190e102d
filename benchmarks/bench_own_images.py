"""How long does a rerun take on your own image folder, now that images are keyed by content?

Method: ``--images`` tiny PNG images (16 x 16, each different) in two class folders, split
20% adapt and 80% test, read by the ``image_folder`` dataset with a randomly initialised
resnet18 and one MAP head. For each checkout given with ``--code`` (e.g. the main branch
before, this one after) the pipeline runs once into a fresh data directory (timed, not part
of the figures), then ``--repeats`` reruns find everything done, each a new process as cron
would start it. Reference in the same run: ``import torch``, and the digits default's rerun
for the same checkout.

    python benchmarks/bench_own_images.py --code /path/to/before /path/to/after [--images N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from tiny_pipeline import image_folder, resnet18, tiny_pipeline  # noqa: E402

PIPELINE = tiny_pipeline(
    "own_images", backbone=resnet18(2), data=image_folder(batch_size=256), heads=("map",)
)


def write_images(root: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        split = "adapt" if i % 5 == 0 else "test"
        folder = root / "images" / split / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:05d}.png")
    (root / "own_images.toml").write_text(PIPELINE)


def wall(command: list[str], code: Path, repeats: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=code, env=env, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    python = sys.executable
    rows: list[tuple[str, list[float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        write_images(project, args.images)
        rows.append(("python -c 'import torch'", wall([python, "-c", "import torch"], ROOT, 3)))
        for code in args.code:
            for name, pipeline in (
                ("own images", project / "own_images.toml"),
                ("digits", code / "pipelines" / "digits.toml"),
            ):
                data = project / f"data-{code.name}-{name.replace(' ', '_')}"
                command = [python, "-m", "etn_cli", "run", str(pipeline), "-d", str(data), "-q"]
                first = wall(command, code, 1)[0]
                print(f"{code}: first run of {name}: {first:.1f} s (not repeated)", flush=True)
                rows.append(
                    (f"{code.name}: etn run {name} (rerun)", wall(command, code, args.repeats))
                )
    reference = min(rows[0][1])
    print(f"\n{args.images:,} images\n| command | best s | median s | x import torch |")
    print("|---|---:|---:|---:|")
    for name, times in rows:
        best, median = min(times), statistics.median(times)
        print(f"| {name} | {best:.2f} | {median:.2f} | {best / reference:.2f} |")


if __name__ == "__main__":
    main()
