"""``etn extract`` and ``etn run`` under torchrun: real ``torch.distributed.run`` subprocesses
with two CPU ranks (gloo) on a tiny digits pipeline, compared with a single-process run.

Shards written by two ranks must equal a single process's to the byte (same boundaries, same
sha256); a killed run resumes from the pieces its ranks finished; a rerun does no work; a rank
that fails makes every rank fail and publishes nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from cli_runner import checksums, etn, finished_run, fresh_data
from tiny_pipeline import tiny_pipeline
from torch.utils.data import DataLoader, Dataset

from etn_cli.errors import EtnError
from etn_cli.stages.extract_batches import batches_in
from etn_cli.stages.verify import verify
from etn_cli.store.reading.reader import read_split
from etn_cli.store.writing.pieces import Layout
from etn_cli.store.writing.writer import ShardWriter

REPO = Path(__file__).resolve().parents[1]
PIPELINE = tiny_pipeline(
    backbone={"layers": ["features.3", "features.1"], "odin": True},
    data={"ood": ["digits_noise"], "batch_size": 16, "shard_rows": 40},
)
SPLITS = ("digits.adapt-", "digits.test-", "digits_noise.test-")
POISON_LAST_TEST_IMAGE = """
import sys

from etn_cli.datasets import digits

clean = digits.Digits.load_split


def poisoned(self, split):
    found = clean(self, split)
    if split == "test":  # the last image: only the last rank reads it
        images, labels = found.data.tensors
        images = images.clone()
        images[-1] = float("nan")
        found.data = type(found.data)(images, labels)
    return found


digits.Digits.load_split = poisoned
from etn_cli.cli.app import main

sys.argv = ["etn", *sys.argv[1:]]
main()
"""
KILL_RANK_1_AFTER_4_PIECES = """
import os, signal, sys

from etn_cli.store.writing import writer

real_publish = writer.publish
published = []


def publish_then_die(partial, final, **options):
    real_publish(partial, final, **options)
    if ".partial-ranks" in str(final) and os.environ["RANK"] == "1":
        published.append(final)
        if len(published) == 4:
            os.kill(os.getpid(), signal.SIGKILL)


writer.publish = publish_then_die
from etn_cli.cli.app import main

sys.argv = ["etn", *sys.argv[1:]]
main()
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A single-process ``etn run``: (pipeline file, data dir)."""
    return finished_run(tmp_path_factory.mktemp("single"), PIPELINE)


def torchrun(*args: str | Path, script: Path | None = None) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 -m etn_cli ARGS`` (or ``script ARGS``)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2"]
    command += [str(script)] if script else ["-m", "etn_cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        command + [str(a) for a in args], cwd=REPO, capture_output=True, text=True, env=env
    )


def split_dirs(data: Path) -> dict[str, Path]:
    """The finished split folders under ``data``, by name prefix (leftovers aside)."""
    found = {}
    for prefix in SPLITS:
        for path in data.glob(f"features/*/{prefix}*"):
            if path.is_dir() and re.fullmatch(r"[0-9a-f]+", path.name.removeprefix(prefix)):
                found[prefix] = path
    return found


def assert_same_features(data: Path, reference: Path, *, same_shards: bool = True) -> None:
    ours, theirs = split_dirs(data), split_dirs(reference)
    assert ours.keys() == theirs.keys() == set(SPLITS)
    for prefix, path in ours.items():
        assert path.name == theirs[prefix].name  # the same content key
        a, b = read_split(path), read_split(theirs[prefix])
        for name in ("hidden", "logits", "labels", "index"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert a.layers.keys() == b.layers.keys() == {"features.1", "features.3", "odin"}
        for name in a.layers:
            np.testing.assert_array_equal(a.layers[name], b.layers[name])
        assert a.manifest["key"] == b.manifest["key"]
        if same_shards:  # boundaries, rows and bytes
            assert checksums(a.manifest) == checksums(b.manifest), prefix


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def metrics(data: Path) -> dict[str, pl.DataFrame]:
    columns = ["eval_set", "method", "seed", "metric", "score", "value"]
    return {
        p.name: pl.read_parquet(p).select(columns).sort(columns[:5])
        for p in sorted((data / "metrics").rglob("*.parquet"))
    }


# ------------------------------------------------------------------------ failures
def test_bad_data_on_one_rank_fails_every_rank_and_a_rank_without_batches_takes_part(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """One batch per split: rank 0 has nothing to extract, rank 1 everything. The adapt split
    is merged from rank 1 alone; the test split's batch holds a NaN image, so both fail."""
    pipeline = tmp_path / "one_batch.toml"
    text = PIPELINE.replace("batch_size = 16", "batch_size = 512")
    pipeline.write_text(text)
    data = fresh_data(tmp_path, reference)
    script = tmp_path / "poisoned.py"
    script.write_text(POISON_LAST_TEST_IMAGE)
    done = torchrun("extract", pipeline, "--data-dir", data, script=script)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2, done.stderr  # one line from each rank
    assert any("NaN" in line and "Rank" not in line for line in errors)  # rank 1: the cause
    assert any("Rank 1 of 2 failed on digits.test-" in line and "NaN" in line for line in errors)
    folders = split_dirs(data)
    assert list(folders) == ["digits.adapt-"]  # the failed split and the next: not published
    adapt = folders["digits.adapt-"]
    assert not list(data.glob("features/*/digits.test-*.partial-*"))  # refused: nothing kept
    ranks = manifest(adapt)["distributed"]["ranks"]
    assert [rank["batches"] for rank in ranks] == [0, 1]
    ours, theirs = read_split(adapt), read_split(split_dirs(reference[1])["digits.adapt-"])
    assert ours.key == theirs.key
    np.testing.assert_array_equal(ours.hidden, theirs.hidden)
    np.testing.assert_array_equal(ours.layers["odin"], theirs.layers["odin"])
    assert not verify(data).damaged


@pytest.mark.slow  # a torchrun of two processes killed and rerun: about 30 s
def test_a_killed_torchrun_resumes_and_its_run_equals_a_single_process_run(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """Rank 1 dies inside the test split; ``etn run`` under torchrun then reuses the pieces
    finished so far, extracts the rest, and rank 0 alone trains, evaluates and prints. The
    features equal a single process's to the byte, and so do the metrics; a rerun does no work."""
    pipeline, reference_data = reference
    data = fresh_data(tmp_path, reference)
    script = tmp_path / "killed.py"
    script.write_text(KILL_RANK_1_AFTER_4_PIECES)
    killed = torchrun("extract", pipeline, "--data-dir", data, script=script)
    assert killed.returncode != 0
    # Not a hang: rank 0 says it lost contact, unless torchrun's agent, seeing rank 1 killed,
    # stopped rank 0 before it noticed (a race that a loaded machine sometimes loses).
    assert (
        "lost contact with the other ranks" in killed.stderr
        or "Signal 9 (SIGKILL) received" in killed.stderr
    ), killed.stderr[-2000:]
    assert list(split_dirs(data)) == ["digits.adapt-"]  # rank 1 died inside the test split
    pieces = next(data.glob("features/*/digits.test-*.partial-ranks"))
    test = pieces.with_name(pieces.name.removesuffix(".partial-ranks"))
    inode = (pieces / "shard-00004.batches-12-15" / "shard-00000.h5").stat().st_ino
    found = verify(data)  # a whole shard rank 1 finished before it died, above
    assert not found.damaged and [left.path for left in found.leftovers] == [pieces]
    assert "journaled shard(s)" in found.leftovers[0].line()  # the finished pieces

    done = torchrun("run", pipeline, "--data-dir", data, "--format", "markdown")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("| MAP |") == 1  # rank 0 alone trains, evaluates and prints
    assert "extract: 3 built, 1 up to date" in done.stderr  # 2 splits and the classifier built
    assert (test / "shard-00004.h5").stat().st_ino == inode  # reused, not recomputed
    record = manifest(test)
    assert record["resumed"]["pieces"] >= 2 and record["distributed"]["world_size"] == 2
    shares = [rank["rows"] for rank in record["distributed"]["ranks"]]
    assert sum(shares) == record["rows"] and abs(shares[0] - shares[1]) <= 16  # one batch
    assert_same_features(data, reference_data)
    ours, theirs = metrics(data), metrics(reference_data)
    assert ours.keys() == theirs.keys() and len(ours) == 1
    assert all(frame.equals(theirs[name]) for name, frame in ours.items())
    assert not verify(data).leftovers and not verify(data).damaged

    before = {p: p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file()}
    again = torchrun("extract", pipeline, "--data-dir", data)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "extract: 0 built, 4 up to date"  # printed by rank 0 only
    assert {p: p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file()} == before


# ------------------------------------------------------------------------ in-process
@pytest.mark.parametrize(
    ("rows", "batch", "shard_rows", "world"),
    [(316, 16, 40, 2), (189, 16, 40, 3), (5, 16, 40, 4), (1000, 7, 10, 8), (48, 16, 16, 5)],
)
def test_pieces_cover_every_batch_once_and_merge_into_a_single_process_s_shards(
    rows: int, batch: int, shard_rows: int, world: int, tmp_path: Path
) -> None:
    layout = Layout(rows, batch, shard_rows, world)
    blocks = [layout.pieces(rank) for rank in range(world)]
    covered = [b for pieces in blocks for p in pieces for b in range(p.first_batch, p.stop_batch)]
    assert covered == list(range(layout.batches))
    sizes = [sum(p.batches for p in pieces) for pieces in blocks]
    assert max(sizes) - min(sizes) <= 1  # even work, whatever the shard size
    index = np.arange(rows)
    with ShardWriter(tmp_path / "single", {}, shard_rows, resume={}) as writer:
        for start in range(0, rows, batch):
            part = index[start : start + batch]
            writer.append(np.zeros((len(part), 2)), np.zeros((len(part), 3)), part, part)
    assert writer.manifest is not None
    single = [shard["rows"] for shard in writer.manifest["shards"]]
    assert [sum(p.rows for p in group) for group in layout.shards()] == single
    for group in layout.shards():
        assert all(p.first_row == p.first_batch * batch for p in group)


class Recorded(Dataset):
    """Integers 0..n-1 that remember which rows were read."""

    def __init__(self, n: int) -> None:
        self.n, self.read = n, set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self.read.add(i)
        return torch.tensor(i)


def test_a_rank_reads_only_its_rows_from_a_data_loader_and_its_batches_from_any_loader() -> None:
    layout = Layout(50, 4, 10, 3)
    tensors = list(DataLoader(Recorded(50), batch_size=4))
    everything = [b.tolist() for b in tensors]
    for rank in range(3):
        pieces = layout.pieces(rank)
        first, stop = layout.block(rank)
        data = Recorded(50)
        ours = [b.tolist() for b in batches_in(DataLoader(data, batch_size=4), pieces)]
        assert ours == everything[first:stop]
        assert data.read == set(range(first * 4, min(stop * 4, 50)))
        assert [b.tolist() for b in batches_in(iter(tensors), pieces)] == ours
    pieces = layout.pieces(1)  # a middle piece reused from a killed run
    rest = [pieces[0], *pieces[2:]]
    wanted = [everything[b] for p in rest for b in range(p.first_batch, p.stop_batch)]
    assert [b.tolist() for b in batches_in(DataLoader(Recorded(50), batch_size=4), rest)] == wanted
    assert [b.tolist() for b in batches_in(iter(tensors), rest)] == wanted


def test_commands_without_a_multi_process_mode_refuse_torchrun(
    reference: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline, data = reference
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    for command in ("train", "evaluate", "status"):
        with pytest.raises(EtnError, match=f"etn {command} runs in one process, but torchrun"):
            etn(command, pipeline, "--data-dir", data)
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc-per-node 1: one ordinary process
    code, output = etn("status", pipeline, "--data-dir", data)
    assert code == 0 and "tiny: " in output
