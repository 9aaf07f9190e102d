"""Feature store speed on a CIFAR-shaped split, against plain ``numpy.save`` / ``numpy.load``.

Writes 50,000 rows of 512-wide hidden states and 10 logits (plus labels and index) with
:class:`ShardWriter` in batches of 1,024 as ``extract`` would, reads them back with
:func:`read_split` as ``train`` and ``evaluate`` do (every dataset's values checked against the
checksum its shard records; a shard's sha256 is recomputed only when its size or modification
time changed since it was written), with every shard re-hashed (as after copying the cache, and
as ``etn verify`` checks) and with the sha256 pass off, and times numpy on the same arrays. Files
stay in the page cache between runs, so both sides are measured warm; the best of ``--repeats``
counts.

    python benchmarks/bench_store.py [--rows 50000] [--hidden 512] [--classes 10] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from etn_cli.store.reading.reader import read_split
from etn_cli.store.writing.writer import ShardWriter

BATCH = 1024


def make_arrays(rows: int, hidden: int, classes: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "hidden": rng.standard_normal((rows, hidden), dtype=np.float32),  # (N, D)
        "logits": rng.standard_normal((rows, classes), dtype=np.float32),  # (N, C)
        "labels": rng.integers(0, classes, rows),  # (N,)
        "index": np.arange(rows),  # (N,)
    }


def write_store(folder: Path, arrays: dict[str, np.ndarray]) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    with ShardWriter(folder, {"bench": "cifar-shaped"}) as writer:
        for start in range(0, len(arrays["index"]), BATCH):
            writer.append(*(arrays[k][start : start + BATCH] for k in arrays))


def write_numpy(folder: Path, arrays: dict[str, np.ndarray]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)


def read_numpy(folder: Path, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.load(folder / f"{name}.npy") for name in arrays}


def best_seconds(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder (default: temp)")
    args = parser.parse_args()
    arrays = make_arrays(args.rows, args.hidden, args.classes)
    megabytes = sum(array.nbytes for array in arrays.values()) / 1e6
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        store, plain = Path(scratch) / "store" / "train", Path(scratch) / "numpy"
        rows = measure(store, plain, arrays, args.repeats)
    print(f"{args.rows} rows x {args.hidden} hidden, C = {args.classes}: {megabytes:.1f} MB")
    print(f"{'operation':<34}{'seconds':>9}{'MB/s':>9}{'vs numpy':>10}")
    for label, seconds, baseline in rows:
        ratio = seconds / baseline
        print(f"{label:<34}{seconds:>9.3f}{megabytes / seconds:>9.0f}{ratio:>9.2f}x")


def measure(store: Path, plain: Path, arrays: dict, repeats: int) -> list[tuple[str, float, float]]:
    """Return (label, seconds, numpy seconds for the same direction) per operation."""
    save = best_seconds(lambda: write_numpy(plain, arrays), repeats)
    load = best_seconds(lambda: read_numpy(plain, arrays), repeats)
    write = best_seconds(lambda: write_store(store, arrays), repeats)
    default = best_seconds(lambda: read_split(store), repeats)
    unchecked = best_seconds(lambda: read_split(store, validate_checksums=False), repeats)
    rehashed = best_seconds(lambda: (touch_shards(store), read_split(store)), repeats)
    features = read_split(store)
    assert np.array_equal(features.hidden, arrays["hidden"]), "store changed the values"
    return [
        ("numpy.save", save, save),
        ("ShardWriter (batches of 1024)", write, save),
        ("numpy.load", load, load),
        ("read_split (default)", default, load),
        ("read_split (every shard re-hashed)", rehashed, load),
        ("read_split (sha256 pass off)", unchecked, load),
    ]


def touch_shards(store: Path) -> None:
    """New modification times, same bytes: the next read re-hashes every shard."""
    for shard in store.glob("*.h5"):
        os.utime(shard)


if __name__ == "__main__":
    main()
