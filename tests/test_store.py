"""The feature store: shard round trips, corruption checks, bring-your-own-features, locks."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from cli_runner import checksums

from etn_cli.errors import EtnError
from etn_cli.store.artefacts.classifier import load_classifier, save_classifier
from etn_cli.store.atomic import atomic_dir, atomic_write_text, unit_lock
from etn_cli.store.fingerprint import canonical_json, fingerprint_key
from etn_cli.store.reading.reader import read_split, write_manifest
from etn_cli.store.writing.writer import ShardWriter

FINGERPRINT = {"model": "vgg16", "dataset": "cifar10", "split": "test", "dtype": "float32"}


def make_arrays(rows: int = 50, d: int = 8, c: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "hidden": rng.normal(size=(rows, d)).astype(np.float32),
        "logits": rng.normal(size=(rows, c)).astype(np.float32),
        "labels": rng.integers(0, c, rows),
        "index": rng.permutation(rows) + 1000,  # not sorted: row order must survive
        "layers/block1": rng.normal(size=(rows, 5)).astype(np.float32),
    }


def write_split(split_dir: Path, arrays: dict, batch: int = 7, shard_rows: int = 16) -> None:
    with ShardWriter(split_dir, FINGERPRINT, shard_rows=shard_rows) as writer:
        for start in range(0, len(arrays["index"]), batch):
            part = {key: value[start : start + batch] for key, value in arrays.items()}
            writer.append(
                torch.from_numpy(part["hidden"]),  # tensors and arrays are both accepted
                part["logits"],
                part["labels"],
                part["index"],
                layers={"block1": part["layers/block1"]},
            )


def write_byof_shard(path: Path, arrays: dict, etn_format: int = 1) -> None:
    with h5py.File(path, "w") as handle:
        handle.attrs["etn_format"] = etn_format
        for key in ("hidden", "logits", "labels", "index"):
            handle.create_dataset(key, data=arrays[key])


@pytest.fixture
def split(tmp_path: Path) -> tuple[Path, dict]:
    arrays = make_arrays()
    write_split(tmp_path / "test", arrays)
    return tmp_path / "test", arrays


def test_round_trip_keeps_values_row_order_layers_and_manifest(split: tuple[Path, dict]) -> None:
    split_dir, arrays = split
    features = read_split(split_dir)
    for key in ("hidden", "logits", "labels", "index"):
        np.testing.assert_array_equal(getattr(features, key), arrays[key])
    np.testing.assert_array_equal(features.layers["block1"], arrays["layers/block1"])
    assert features.hidden.dtype == np.float32 and features.labels.dtype == np.int64
    manifest = json.loads((split_dir / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["kind"] == "etn-features" and manifest["complete"]
    assert [shard["rows"] for shard in manifest["shards"]] == [16, 16, 16, 2]
    assert (manifest["rows"], manifest["hidden_size"], manifest["num_classes"]) == (50, 8, 3)
    assert manifest["layers"] == ["block1"] and manifest["fingerprint"] == FINGERPRINT
    assert features.key == manifest["key"] == fingerprint_key(FINGERPRINT)
    record = manifest["provenance"]
    assert {"etn_version", "code_version", "python", "host", "command"} <= record.keys()
    assert {"torch", "h5py"} <= record["packages"].keys()
    assert sorted(p.name for p in split_dir.parent.iterdir()) == ["test"]


def test_half_precision_inputs_read_back_as_float32(tmp_path: Path) -> None:
    arrays = make_arrays(rows=6)
    with ShardWriter(tmp_path / "s", FINGERPRINT) as writer:
        hidden = torch.from_numpy(arrays["hidden"]).bfloat16()
        logits = arrays["logits"].astype(np.float16)
        writer.append(hidden, logits, arrays["labels"], arrays["index"])
    features = read_split(tmp_path / "s")
    assert features.hidden.dtype == features.logits.dtype == np.float32
    np.testing.assert_allclose(features.hidden, arrays["hidden"], rtol=1e-2, atol=1e-2)


def test_flipped_byte_in_a_shard_is_caught_by_its_checksum(split: tuple[Path, dict]) -> None:
    shard = split[0] / "shard-00001.h5"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(EtnError, match=r"test/shard-00001\.h5 has sha256"):
        read_split(split[0])


def test_reads_rehash_only_shards_whose_size_or_time_changed_and_verify_rehashes_all(
    split: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    from etn_cli.store.reading import reader

    hashed: list[str] = []
    real_sha256 = reader.file_sha256
    monkeypatch.setattr(reader, "file_sha256", lambda p: hashed.append(p.name) or real_sha256(p))
    manifest = json.loads((split[0] / "manifest.json").read_text())
    entry = manifest["shards"][1]
    shard = split[0] / entry["file"]
    assert (entry["bytes"], entry["mtime_ns"]) == (shard.stat().st_size, shard.stat().st_mtime_ns)
    read_split(split[0])
    assert hashed == []  # every shard as written: no sha256 pass
    os.utime(shard, ns=(entry["mtime_ns"], entry["mtime_ns"] + 1))  # touched, same bytes
    read_split(split[0])
    assert hashed == [entry["file"]]
    # changed bytes behind an unchanged size and time pass a read, but not etn verify
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(entry["mtime_ns"], entry["mtime_ns"]))
    with pytest.raises(EtnError, match=r"has sha256"):
        reader.check_split(split[0])


@pytest.mark.parametrize("checksums", [True, False])
def test_truncated_shard_is_rejected(split: tuple[Path, dict], checksums: bool) -> None:
    shard = split[0] / "shard-00002.h5"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(EtnError, match=r"shard-00002\.h5"):
        read_split(split[0], validate_checksums=checksums)


def test_shard_missing_from_a_manifest_split_is_reported(split: tuple[Path, dict]) -> None:
    (split[0] / "shard-00003.h5").unlink()
    with pytest.raises(EtnError, match=r"lists shard-00003\.h5, which is missing"):
        read_split(split[0])


def test_nan_in_logits_is_rejected_and_nothing_is_left_on_disk(tmp_path: Path) -> None:
    arrays = make_arrays()
    arrays["logits"][36:39, 1] = np.nan  # inside the batch of rows 35..41
    with pytest.raises(EtnError, match=r"Logits .* contain 3 NaN values \(rows 36\.\.38\)"):
        write_split(tmp_path / "test", arrays)
    assert list(tmp_path.iterdir()) == []


def test_exception_inside_the_writer_removes_the_partial_folder(tmp_path: Path) -> None:
    arrays = make_arrays()
    with pytest.raises(KeyboardInterrupt), ShardWriter(tmp_path / "s", FINGERPRINT, 4) as writer:
        writer.append(arrays["hidden"], arrays["logits"], arrays["labels"], arrays["index"])
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_batches_that_disagree(tmp_path: Path) -> None:
    a = make_arrays(rows=4)
    with pytest.raises(EtnError, match="earlier batches"), ShardWriter(tmp_path / "s", {}) as w:
        w.append(a["hidden"], a["logits"], a["labels"], a["index"])
        w.append(a["hidden"][:, :2], a["logits"], a["labels"], a["index"] + 4)
    with pytest.raises(EtnError, match=r"repeats 4 value"), ShardWriter(tmp_path / "s", {}) as w:
        w.append(a["hidden"], a["logits"], a["labels"], a["index"])
        w.append(a["hidden"], a["logits"], a["labels"], a["index"])
    assert list(tmp_path.iterdir()) == []


def test_existing_split_is_kept_unless_replace_is_asked(split: tuple[Path, dict]) -> None:
    other = make_arrays(rows=3, seed=1)
    with pytest.raises(EtnError, match="already exists; pass --force"):
        write_split(split[0], other)
    with ShardWriter(split[0], FINGERPRINT, replace=True) as writer:
        writer.append(other["hidden"], other["logits"], other["labels"], other["index"])
    assert len(read_split(split[0])) == 3
    assert sorted(p.name for p in split[0].parent.iterdir()) == ["test"]


def test_split_written_by_a_newer_etn_asks_for_an_upgrade(split: tuple[Path, dict]) -> None:
    path = split[0] / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 2}))
    with pytest.raises(EtnError, match=r"newer etn \(format 2\); this etn reads format 1\. Upgr"):
        read_split(split[0])


def test_byof_folder_reads_and_its_key_follows_the_files(tmp_path: Path) -> None:
    arrays = make_arrays(rows=20)
    halves = [{k: v[:10] for k, v in arrays.items()}, {k: v[10:] for k, v in arrays.items()}]
    for number, half in enumerate(halves):
        write_byof_shard(tmp_path / f"part{number}.h5", half)
    features = read_split(tmp_path)
    np.testing.assert_array_equal(features.index, arrays["index"])
    assert features.manifest["fingerprint"]["byof"] is True and features.layers == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part0.h5", "part1.h5"]
    write_byof_shard(tmp_path / "part1.h5", {**halves[1], "labels": halves[1]["labels"] * 0})
    assert read_split(tmp_path).key != features.key


def test_byof_shard_with_an_infinite_value_names_the_shard_and_row(tmp_path: Path) -> None:
    arrays = make_arrays(rows=4)
    arrays["hidden"][2, 0] = np.inf
    write_byof_shard(tmp_path / "a.h5", arrays)
    with pytest.raises(EtnError, match=r"a\.h5 contain 1 infinite value \(row 2\)"):
        read_split(tmp_path)


def test_byof_shard_from_a_newer_format_is_rejected(tmp_path: Path) -> None:
    write_byof_shard(tmp_path / "a.h5", make_arrays(rows=4), etn_format=2)
    with pytest.raises(EtnError, match=r"Shard .*a\.h5 was written by a newer etn \(format 2\)"):
        read_split(tmp_path)


def test_write_manifest_turns_hand_written_shards_into_a_split(tmp_path: Path) -> None:
    write_byof_shard(tmp_path / "shard-00000.h5", make_arrays(rows=12))
    manifest = write_manifest(tmp_path, {"model": "mine"})
    features = read_split(tmp_path)
    assert features.manifest == manifest and features.key == fingerprint_key({"model": "mine"})
    assert manifest["shards"][0]["rows"] == 12


@dataclasses.dataclass
class Transform:
    size: tuple[int, int]
    root: Path


def test_fingerprint_key_ignores_dict_order_and_types_but_not_values() -> None:
    a = {"lr": 0.001, "transform": Transform((32, 32), Path("/data")), "seeds": (1, 2)}
    b = {"seeds": [1, 2], "transform": {"root": "/data", "size": [32, 32]}, "lr": 1e-3}
    assert canonical_json(a) == canonical_json(b) and fingerprint_key(a) == fingerprint_key(b)
    assert fingerprint_key({**a, "lr": 0.0011}) != fingerprint_key(a)
    assert len(fingerprint_key(a)) == 16 and " " not in canonical_json(a)


def test_classifier_round_trip_and_missing_file(tmp_path: Path) -> None:
    weight, bias = torch.randn(10, 8), torch.randn(10)
    save_classifier(tmp_path / "head.safetensors", weight, bias, {"model": "vgg16"})
    loaded_weight, loaded_bias = load_classifier(tmp_path / "head.safetensors")
    np.testing.assert_array_equal(loaded_weight, weight.numpy())
    np.testing.assert_array_equal(loaded_bias, bias.numpy())
    with pytest.raises(EtnError, match="Expected the backbone's classifier"):
        load_classifier(tmp_path / "other.safetensors")


def test_atomic_write_text_replaces_the_whole_file(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a.txt", "old")
    atomic_write_text(tmp_path / "a.txt", "new")
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]
    assert (tmp_path / "a.txt").read_text() == "new"


def _try_lock(path: Path, timeout: float, die_holding: bool) -> None:
    """Child process: exit 0 if the lock was acquired, 3 if it timed out."""
    try:
        with unit_lock(path, timeout=timeout):
            if die_holding:
                os._exit(0)  # no cleanup: the kernel must release the lock
    except EtnError:
        os._exit(3)
    os._exit(0)


def _run_child(path: Path, timeout: float, die_holding: bool = False) -> int | None:
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_try_lock, args=(path, timeout, die_holding))
    child.start()
    child.join(10)
    return child.exitcode


def test_unit_lock_is_exclusive_between_processes(tmp_path: Path) -> None:
    unit = tmp_path / "test"
    with unit_lock(unit):
        assert _run_child(unit, timeout=0.2) == 3
    assert _run_child(unit, timeout=1.0) == 0
    assert _run_child(unit, timeout=1.0, die_holding=True) == 0
    with unit_lock(unit, timeout=1.0):  # released by the kernel when the holder died
        pass


# ------------------------------------------------------------------------ resumable writing
def append_batches(writer: ShardWriter, arrays: dict, batches: range, batch: int = 6) -> None:
    for number in batches:
        part = {key: value[number * batch : (number + 1) * batch] for key, value in arrays.items()}
        writer.append(part["hidden"], part["logits"], part["labels"], part["index"])


def interrupted_write(split_dir: Path, arrays: dict, batches: int, **options) -> None:
    """A resumable write killed (here: interrupted) after ``batches`` batches."""
    settings = {"batch_size": 6} | options
    writer = ShardWriter(split_dir, FINGERPRINT, 12, resume=settings)
    with pytest.raises(KeyboardInterrupt), writer:
        append_batches(writer, arrays, range(batches))
        raise KeyboardInterrupt


def test_resumed_write_adopts_journaled_shards_and_equals_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    arrays = make_arrays(rows=50)
    with ShardWriter(tmp_path / "whole", FINGERPRINT, 12, resume={"batch_size": 6}) as writer:
        append_batches(writer, arrays, range(9))
    interrupted_write(tmp_path / "split", arrays, batches=5)
    (partial,) = tmp_path.glob("split.partial-*")
    journal = json.loads((partial / "journal.json").read_text())
    entries = [(e["file"], e["first_row"], e["stop_row"], e["batches"]) for e in journal["shards"]]
    assert entries == [("shard-00000.h5", 0, 12, 2), ("shard-00001.h5", 12, 24, 4)]
    # shards end at batch boundaries; the fifth batch was only buffered when it stopped
    with ShardWriter(tmp_path / "split", FINGERPRINT, 12, resume={"batch_size": 6}) as writer:
        assert (writer.resumed_batches, writer.rows) == (4, 24)
        np.testing.assert_array_equal(writer.resumed_index, arrays["index"][:24])
        append_batches(writer, arrays, range(4, 9))
    whole = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    resumed = json.loads((tmp_path / "split" / "manifest.json").read_text())
    assert checksums(resumed) == checksums(whole)  # byte-identical shards
    assert resumed["resumed"] == {"shards": 2, "rows": 24, "batches": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split", "whole"]
    assert not (tmp_path / "split" / "journal.json").exists()


def test_a_journaled_shard_that_no_longer_hashes_is_dropped_with_all_after_it(
    tmp_path: Path,
) -> None:
    arrays = make_arrays(rows=50)
    interrupted_write(tmp_path / "split", arrays, batches=7)
    (partial,) = tmp_path.glob("split.partial-*")
    shard = partial / "shard-00001.h5"
    shard.write_bytes(shard.read_bytes()[:-10])  # torn by a power cut after its journal entry
    with ShardWriter(tmp_path / "split", FINGERPRINT, 12, resume={"batch_size": 6}) as writer:
        assert writer.resumed_batches == 2 and sorted(p.name for p in partial.iterdir()) == [
            "journal.json",
            "shard-00000.h5",
        ]
        append_batches(writer, arrays, range(2, 9))
    np.testing.assert_array_equal(read_split(tmp_path / "split").hidden, arrays["hidden"])


def test_a_journal_made_with_other_settings_is_not_adopted(tmp_path: Path) -> None:
    arrays = make_arrays(rows=50)
    interrupted_write(tmp_path / "split", arrays, batches=5, batch_size=5)
    with ShardWriter(tmp_path / "split", FINGERPRINT, 12, resume={"batch_size": 6}) as writer:
        assert writer.resumed_batches == 0
        assert len(list(tmp_path.glob("split.partial-*"))) == 1  # the stale one was deleted
        append_batches(writer, arrays, range(9))
    assert len(read_split(tmp_path / "split")) == 50


def test_refused_data_discards_even_journaled_shards(tmp_path: Path) -> None:
    arrays = make_arrays(rows=50)
    arrays["logits"][40, 0] = np.nan
    with pytest.raises(EtnError, match="NaN"):
        with ShardWriter(tmp_path / "s", FINGERPRINT, 12, resume={"batch_size": 6}) as writer:
            append_batches(writer, arrays, range(9))
    assert list(tmp_path.iterdir()) == []


def test_replace_swaps_folders_so_a_reader_never_finds_none(tmp_path: Path) -> None:
    final = tmp_path / "unit"
    with atomic_dir(final) as folder:
        (folder / "value.txt").write_text("0")
    seen, stop = [], threading.Event()

    def read_forever() -> None:
        while not stop.is_set():
            try:
                seen.append((final / "value.txt").read_text())
            except FileNotFoundError:
                seen.append("none")

    reader = threading.Thread(target=read_forever)
    reader.start()
    for value in range(1, 40):
        with atomic_dir(final, replace=True) as folder:
            (folder / "value.txt").write_text(str(value))
    stop.set()
    reader.join()
    assert "none" not in seen and (final / "value.txt").read_text() == "39"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit"]
