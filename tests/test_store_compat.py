"""A data directory written by an earlier etn reads, verifies and resumes with this one.

``fixtures/store-687f761.tar.gz`` was written by etn at commit 687f761, before the store was
regrouped, with ``fixtures/make_store_687f761.py`` (see its docstring): three split folders,
the classifier, three trained heads and their metrics, an extraction killed after one
journaled shard and the pieces one rank of a killed torchrun left. Its arrays are small
multiples of 1/4, so the values read back are compared exactly with the ones written.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
from fixtures.make_store_687f761 import (
    BATCH,
    FEATURES,
    SHARD_ROWS,
    SPLITS,
    arrays,
    batches,
    classifier,
    fingerprint,
    folder_name,
)

from etn_cli.heads import Head
from etn_cli.stages.report import report_files
from etn_cli.stages.verify import verify
from etn_cli.store.artefacts.classifier import load_classifier
from etn_cli.store.artefacts.headfiles import check_head_folder
from etn_cli.store.fingerprint import fingerprint_key
from etn_cli.store.reading.reader import read_split
from etn_cli.store.writing.merge import merge_pieces
from etn_cli.store.writing.pieces import Layout, PieceWriter, pieces_folder, reusable
from etn_cli.store.writing.writer import ShardWriter

ARCHIVE = Path(__file__).parent / "fixtures" / "store-687f761.tar.gz"


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """The data directory of 687f761, unpacked with its names and modification times."""
    with tarfile.open(ARCHIVE) as archive:
        options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(tmp_path, **options)
    return tmp_path / "store-687f761" / "data"


def assert_holds(split_dir: Path, split: str) -> dict:
    """The split folder reads back the arrays written into it; returns its manifest."""
    found, expected = read_split(split_dir), arrays(split)
    for name in ("hidden", "logits", "labels", "index"):
        np.testing.assert_array_equal(getattr(found, name), expected[name])
    assert found.layers.keys() == {"block1"}
    np.testing.assert_array_equal(found.layers["block1"], expected["layers/block1"])
    assert found.path.name == folder_name(split)  # the content key is still the same
    return found.manifest


def test_splits_classifier_heads_and_metrics_written_before_read_back(old: Path) -> None:
    features = old / FEATURES
    for split in ("adapt", "test", "ood"):
        manifest = assert_holds(features / folder_name(split), split)
        assert manifest["fingerprint"] == fingerprint(split) and len(manifest["shards"]) == 3
    weight, bias = load_classifier(features / "classifier.safetensors")
    np.testing.assert_array_equal(weight, classifier()[0])
    np.testing.assert_array_equal(bias, classifier()[1])
    test = arrays("test")
    heads = sorted(p for p in (old / "heads").iterdir() if p.is_dir())
    assert [p.name.split("-")[0] for p in heads] == ["mahalanobis", "map", "mcd"]
    for folder in heads:
        check_head_folder(folder)
        probs = Head.load(folder).predict(test["hidden"], test["logits"]).probs
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    logits = test["logits"].astype(np.float64)
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(Head.load(heads[1]).predict(test["hidden"], logits).probs, softmax)
    table = report_files(sorted((old / "metrics").rglob("*.parquet")), fmt="csv")
    assert all(name in table for name in ("MAP", "MC dropout", "Mahalanobis"))


def test_verify_finds_nothing_damaged_and_names_both_interrupted_extractions(old: Path) -> None:
    found = verify(old)
    assert not found.damaged, [d.line() for d in found.damaged]
    assert dict(found.checked) == {
        "classifiers": 1, "feature splits": 3, "heads": 3, "metrics files": 3
    }  # fmt: skip
    lines = sorted(left.line() for left in found.leftovers)
    assert len(lines) == 2
    assert "tiny.merged-" in lines[0] and "2 journaled shard(s) (12 rows)" in lines[0]
    assert "tiny.resumed-" in lines[1] and "1 journaled shard(s) (8 rows)" in lines[1]


def test_an_extraction_killed_before_resumes_from_its_journaled_shard(old: Path) -> None:
    path = old / FEATURES / folder_name("resumed")
    (partial,) = path.parent.glob(f"{path.name}.partial-*")
    kept = (partial / "shard-00000.h5").stat().st_ino
    resume = {"batch_size": BATCH}
    with ShardWriter(path, fingerprint("resumed"), SHARD_ROWS, resume=resume) as writer:
        assert (writer.resumed_batches, writer.rows) == (2, 8)
        for batch in batches("resumed")[writer.resumed_batches :]:
            writer.append(*batch)
    manifest = assert_holds(path, "resumed")
    assert manifest["resumed"] == {"shards": 1, "rows": 8, "batches": 2}
    assert (path / "shard-00000.h5").stat().st_ino == kept  # adopted, not rewritten


def test_pieces_a_killed_torchrun_left_before_are_reused_and_merged(old: Path) -> None:
    path = old / FEATURES / folder_name("merged")
    folder, layout = pieces_folder(path), Layout(SPLITS["merged"], BATCH, SHARD_ROWS, 2)
    key = fingerprint_key(fingerprint("merged"))
    assert all(reusable(folder, piece, key) for piece in layout.pieces(1))
    kept = (folder / "shard-00001.batches-2-4" / "shard-00000.h5").stat().st_ino
    rank0 = layout.pieces(0)  # the rank that was killed before it finished a piece
    with PieceWriter(folder, rank0, fingerprint("merged"), {}) as writer:
        for batch in batches("merged")[: sum(piece.batches for piece in rank0)]:
            writer.append(*batch)
    merge_pieces(path, layout, fingerprint("merged"), {}, {})
    assert_holds(path, "merged")
    assert (path / "shard-00001.h5").stat().st_ino == kept  # linked, not rewritten
    assert not folder.exists()
