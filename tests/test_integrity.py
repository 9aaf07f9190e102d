"""Integrity at rest (issue 20): every artefact kind of a finished run is damaged in turn (seeded
single-bit flips over header and payload, truncation, deletion) and ``etn run`` runs again. Each
case must give the clean run's exact results with nothing left damaged, or one error line and a
non-zero exit: never a silent change, a traceback or a killed process. The exhaustive sweep is
``benchmarks/bench_damage.py``."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_runner import unstamped
from damage_cases import KINDS, Case, apply, finished_run, run_case, sample, target

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store.artefacts.sealed import read_sealed, seal_record, sidecar, write_sealed
from etn_cli.store.reading.reader import read_split
from etn_cli.store.writing.shardfile import write_shard
from etn_cli.store.writing.valuecheck import ATTRIBUTE, value_checksum

OK = ("same", "refused")


@contextlib.contextmanager
def store_warnings() -> Iterator[list[logging.LogRecord]]:
    """The warnings the ``etn.store`` logger emits inside the block, whatever level ``-q`` in
    an earlier test left it at."""
    said: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = said.append  # type: ignore[method-assign]
    logger = logging.getLogger("etn.store")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.WARNING
    try:
        yield said
    finally:
        logger.removeHandler(handler)
        logger.level = level


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return finished_run(tmp_path_factory.mktemp("damage"))


def sweep(clean, tmp_path: Path, flips: int, seed: int, kinds: tuple[str, ...] = ()) -> Counter:
    """Damage ``clean`` one case at a time (``flips`` seeded flips per kind, half in the first
    512 bytes, plus the signature byte, a truncation and deletion), run each, check every
    outcome, and return the tally of (kind, verdict). ``kinds`` keeps only those kinds' cases
    of the same seeded sample (all kinds if empty)."""
    pipeline, data = clean
    cases = list(sample(data, flips=flips, seed=seed))
    assert len(cases) == (flips + 3) * len(KINDS)
    cases = [case for case in cases if not kinds or case.kind in kinds]
    outcomes = {
        str(case): run_case(case, pipeline, data, tmp_path / "work", in_process=True)
        for case in cases
    }
    # A shard's values are checked on every read (recorded checksums), its whole file by `etn
    # verify`: a flip in an HDF5 header byte that no read uses is harmless and may stay
    allowed = {"shard": (*OK, "left damaged")}
    bad = {c: o for c, o in outcomes.items() if o.verdict not in allowed.get(c.split(":")[0], OK)}
    assert not bad, bad
    return Counter((c.split(":")[0], o.verdict) for c, o in outcomes.items())


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_damaged_at_its_signature_header_body_end_and_whole_is_repaired_or_refused(
    clean: tuple[Path, Path],
    tmp_path: Path,
    kind: str,
) -> None:
    """CI's sweep, one test per kind: the signature byte, one seeded flip in the first 512
    bytes and one anywhere, a truncation to half and deletion (5 cases per kind, 55 in all):
    every kind and every form of damage, each run after a copy of one finished run. The
    samples of 24 and 96 flips per kind below (-m slow) and ``benchmarks/bench_damage.py``
    (every bit) look for the rare byte."""
    tally = sweep(clean, tmp_path, flips=2, seed=20, kinds=(kind,))
    assert sum(tally.values()) == 5, tally


@pytest.mark.slow
def test_a_sweep_of_24_flips_per_kind_is_repaired_or_refused_in_one_line(clean, tmp_path) -> None:
    """The issue's "a few dozen per kind": 24 seeded flips (12 in the first 512 bytes, 12
    anywhere) plus the signature byte, a truncation and deletion, for each of the 11 kinds
    (297 cases; the README's reliability section gives their counts, printed with -s)."""
    print(sorted(sweep(clean, tmp_path, flips=24, seed=20).items()))


def test_a_header_flip_that_h5py_reports_as_a_missing_object_is_repaired(clean, tmp_path) -> None:
    # found by the slow sweep: h5py raised KeyError ("number of children is greater than
    # maximum") while the splits' labels were checked, which became a traceback
    pipeline, data = clean
    case = Case("shard", "flip", 143, 2)
    assert run_case(case, pipeline, data, tmp_path / "work", in_process=True).verdict == "same"


@pytest.mark.slow
def test_a_sweep_of_96_more_flips_per_kind_is_repaired_or_refused_in_one_line(
    clean,
    tmp_path,
) -> None:
    """A denser sample than CI's, other bytes: 96 flips per kind (1,089 cases)."""
    print(sorted(sweep(clean, tmp_path, flips=96, seed=21).items()))


@pytest.mark.parametrize(
    "case",
    [Case("shard", "flip", 30000, 3), Case("backbone weights", "truncate", 100)],
    ids=str,
)
def test_the_installed_command_repairs_damage_in_a_new_process(clean, tmp_path, case) -> None:
    pipeline, data = clean
    assert run_case(case, pipeline, data, tmp_path / "work").verdict == "same"


def test_a_flipped_bit_in_a_shard_with_its_time_unchanged_is_caught_on_read(tmp_path) -> None:
    from etn_cli.store.writing.writer import ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(tmp_path / "split", {"test": 1}, shard_rows=64) as writer:
        writer.append(rng.normal(size=(50, 8)), rng.normal(size=(50, 3)),
                      np.arange(50) % 3, np.arange(50))  # fmt: skip
    shard = tmp_path / "split" / "shard-00000.h5"
    with h5py.File(shard, "r") as handle:
        offset = handle["hidden"].id.get_offset()  # where the hidden values start
    stat = shard.stat()
    raw = bytearray(shard.read_bytes())
    raw[offset + 17] ^= 0x10
    shard.write_bytes(bytes(raw))
    import os

    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # bit rot leaves the time alone
    with pytest.raises(DamagedArtefact, match="do not match the checksum") as caught:
        read_split(tmp_path / "split")
    assert caught.value.path == tmp_path / "split"


def test_old_shards_without_value_checksums_still_read(tmp_path) -> None:
    from etn_cli.store.reading.reader import write_manifest

    folder = tmp_path / "old"
    folder.mkdir()
    rng = np.random.default_rng(1)
    with h5py.File(folder / "shard-00000.h5", "w") as handle:  # as etn wrote them before
        handle.attrs["etn_format"] = 1
        handle["hidden"], handle["logits"] = rng.normal(size=(6, 4)), rng.normal(size=(6, 2))
        handle["labels"], handle["index"] = np.arange(6) % 2, np.arange(6)
    write_manifest(folder, {"old": True})
    with store_warnings() as said:
        assert len(read_split(folder)) == 6
        read_split(folder)
    notes = [r for r in said if "carry no checksums of their values" in r.getMessage()]
    assert len(notes) == 1  # said once (the CLI shows the etn logger on stderr)


def test_new_shards_carry_value_checksums_and_are_byte_identical(tmp_path) -> None:
    arrays = {"hidden": np.ones((5, 3), np.float32), "labels": np.arange(5)}
    write_shard(tmp_path / "a.h5", arrays)
    write_shard(tmp_path / "b.h5", arrays)
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()
    with h5py.File(tmp_path / "a.h5", "r") as handle:
        for name in arrays:
            assert handle[name].attrs[ATTRIBUTE] == value_checksum(arrays[name])


def test_the_value_checksum_catches_sampled_single_and_double_bit_flips() -> None:
    values = np.random.default_rng(0).standard_normal((70, 300)).astype(np.float32)  # 84,000 B
    raw = values.view(np.uint8).reshape(-1)
    clean = value_checksum(values)
    rng = np.random.default_rng(1)
    for byte in [*range(8), *range(81912, 81928), *rng.integers(0, len(raw), 3000)]:
        bit = rng.integers(0, 8)
        raw[byte] ^= 1 << bit
        assert value_checksum(values) != clean, (byte, bit)
        raw[byte] ^= 1 << bit
    words = raw[: 8 * 1024 * 10].view(np.uint64)
    for _ in range(2000):  # pairs, the cases a plain sum misses: same bit, opposite directions
        i, j = rng.choice(len(words), 2, replace=False)
        bit = np.uint64(1) << np.uint64(rng.choice([31, 62, 63]))
        if bool(words[i] & bit) == bool(words[j] & bit):
            continue
        words[i] ^= bit
        words[j] ^= bit
        assert value_checksum(values) != clean, (i, j, bit)
        words[i] ^= bit
        words[j] ^= bit
    assert value_checksum(values) == clean


def test_fletcher32_shards_of_the_previous_format_still_read_checked(tmp_path) -> None:
    from etn_cli.store.reading.reader import write_manifest

    folder = tmp_path / "f32"
    folder.mkdir()
    rng = np.random.default_rng(2)
    with h5py.File(folder / "shard-00000.h5", "w") as handle:
        handle.attrs["etn_format"] = 1
        for name, array in {"hidden": rng.normal(size=(6, 4)), "logits": rng.normal(size=(6, 2)),
                            "labels": np.arange(6) % 2, "index": np.arange(6)}.items():  # fmt: skip
            handle.create_dataset(name, data=array, fletcher32=True, chunks=array.shape)
    write_manifest(folder, {"f32": True})
    assert len(read_split(folder)) == 6


def test_a_sealed_file_is_checked_before_it_is_parsed(tmp_path) -> None:
    path = tmp_path / "m.parquet"
    write_sealed(path, b"PAR1 payload")
    assert sidecar(path).read_text().endswith("  m.parquet\n")
    assert read_sealed(path) == b"PAR1 payload"
    path.write_bytes(b"PAR1 pAyload")
    with pytest.raises(DamagedArtefact, match="the file changed or is corrupt"):
        read_sealed(path)
    sidecar(path).write_text("garbage\n")
    with pytest.raises(DamagedArtefact, match="checksum file .* is damaged"):
        read_sealed(path)


def test_an_edited_record_is_refused_even_where_it_still_parses(tmp_path) -> None:
    from etn_cli.store.artefacts.sealed import check_record_seal

    record = seal_record({"rows": 10, "fit_split": "digits:adapt (190 rows)"})
    check_record_seal(json.loads(json.dumps(record)), tmp_path / "r.json", tmp_path)
    with pytest.raises(DamagedArtefact, match="does not match its own checksum"):
        check_record_seal(record | {"rows": 11}, tmp_path / "r.json", tmp_path)
    check_record_seal({"rows": 10}, tmp_path / "r.json", tmp_path)  # an older etn's: no seal


def test_damage_to_the_users_own_features_is_refused_not_rebuilt(tmp_path) -> None:
    from cli_runner import etn
    from conftest import make_features

    from etn_cli.store.writing.writer import ShardWriter  # the user's folders, with etn's manifest

    for name, split in (("adapt", 0), ("test", 1)):
        f = make_features(split=split)
        with ShardWriter(tmp_path / name, {"mine": name}, shard_rows=512) as writer:
            writer.append(f.hidden, f.logits, f.labels, np.arange(len(f.labels)))
    shard = tmp_path / "test" / "shard-00000.h5"
    shard.write_bytes(shard.read_bytes()[:-100])
    pipeline = tmp_path / "own.toml"
    pipeline.write_text(
        'name = "own"\nseeds = [0]\n[features]\nadapt = "adapt"\ntest = "test"\n'
        '[[heads]]\nname = "map"\n'
    )
    code, output = etn("run", pipeline, "--data-dir", tmp_path / "data")
    assert code != 0 and "test" in output and "Rebuilding" not in output, output
    assert shard.is_file()  # the user's file is left as it is
    with pytest.raises(EtnError):
        read_split(tmp_path / "test")


def test_verify_repair_removes_damaged_units_and_the_next_run_rebuilds_them(
    clean, tmp_path
) -> None:
    import shutil

    from cli_runner import etn
    from damage_cases import Case, apply, results

    pipeline, data = clean
    work = tmp_path / "work"
    shutil.copytree(data, work)
    for case in (Case("head.json", "flip", 20, 1), Case("backbone weights", "flip", 900, 4)):
        apply(case, work)
    code, output = etn("verify", "--data-dir", work)
    assert code == 1 and output.count("DAMAGED") == 2, output
    code, output = etn("verify", "--data-dir", work, "--repair")
    assert code == 0 and output.count("removed damaged") == 2, output
    assert "2 damaged (2 removed for the next etn run)" in output and " 0 removed" not in output
    assert etn("run", pipeline, "--data-dir", work)[0] == 0
    assert results(work) == results(data)
    code, output = etn("verify", "--data-dir", work)
    assert code == 0 and " 0 damaged" in output, output


def test_two_ood_folders_with_one_last_segment_stay_apart_and_keyed(tmp_path) -> None:
    from conftest import make_features

    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan
    from etn_cli.store.writing.writer import ShardWriter

    for name, split in (("adapt", 0), ("test", 1), ("x/svhn", 2), ("y/svhn", 3)):
        f = make_features(split=split)
        with ShardWriter(tmp_path / name, {"mine": name}, shard_rows=512) as writer:
            writer.append(f.hidden, f.logits, f.labels, np.arange(len(f.labels)))
    text = (
        'name = "own"\nseeds = [0]\n[features]\nadapt = "adapt"\ntest = "test"\n'
        'ood = ["x/svhn", "y/svhn"{more}]\n[[heads]]\nname = "map"\n'
    )
    path = tmp_path / "own.toml"
    path.write_text(text.format(more=""))
    plan = make_plan(load_pipeline(path), tmp_path / "data")
    assert [u.name for u in plan.ood] == ["x/svhn", "y/svhn"]
    key = plan.metrics[0].key
    f = make_features(split=4)  # y/svhn changes: the metrics key follows it
    with ShardWriter(tmp_path / "y/svhn", {"mine": "new"}, 512, replace=True) as writer:
        writer.append(f.hidden, f.logits, f.labels, np.arange(len(f.labels)))
    assert make_plan(load_pipeline(path), tmp_path / "data").metrics[0].key != key
    path.write_text(text.format(more=', "x/svhn"'))
    with pytest.raises(EtnError, match=r"lists \['x/svhn'\] twice"):
        make_plan(load_pipeline(path), tmp_path / "data")


@pytest.mark.parametrize("key", ["backbone", "id_dataset"])
def test_a_features_name_that_would_leave_the_data_directory_is_refused(tmp_path, key) -> None:
    from etn_cli.planning.pipeline import load_pipeline

    path = tmp_path / "own.toml"
    path.write_text(
        f'[features]\nadapt = "a"\ntest = "t"\n{key} = "../../x"\n[[heads]]\nname = "map"\n'
    )
    with pytest.raises(EtnError, match=f"{key} = '../../x' names folders in the data directory"):
        load_pipeline(path)


def test_every_file_and_folder_follows_the_umask(clean, tmp_path) -> None:
    import os

    from cli_runner import etn

    pipeline, _ = clean
    previous = os.umask(0o007)  # a group shares the data directory
    try:
        code, output = etn("run", pipeline, "--data-dir", tmp_path / "data")
    finally:
        os.umask(previous)
    assert code == 0, output
    modes = {p.relative_to(tmp_path): p.stat().st_mode & 0o777 for p in tmp_path.rglob("*")}
    odd = {
        p: oct(m) for p, m in modes.items() if m != (0o770 if (tmp_path / p).is_dir() else 0o660)
    }
    assert not odd, odd


def test_predict_refuses_an_output_that_is_a_folder_before_any_work(clean, tmp_path) -> None:
    from cli_runner import etn

    pipeline, data = clean
    (tmp_path / "out.csv").mkdir()
    with pytest.raises(EtnError, match="is a folder; expected a file"):  # one line, exit 2
        etn("predict", pipeline, "digits:test", "--head", "map_edl", "--data-dir", data,
            "--out", tmp_path / "out.csv")  # fmt: skip
    assert not list((tmp_path / "out.csv").iterdir())


@pytest.mark.parametrize(
    "case", [Case("train.json", "delete"), Case("manifest", "delete")], ids=str
)
def test_a_repair_is_announced_in_one_line_naming_the_damage(clean, tmp_path, case) -> None:
    import shutil

    from damage_cases import apply, run_in_process

    pipeline, data = clean
    shutil.copytree(data, tmp_path / "work")
    apply(case, tmp_path / "work")
    code, _, stderr = run_in_process(pipeline, tmp_path / "work")
    repairs = [line for line in unstamped(stderr) if line.startswith("repair: ")]
    assert code == 0 and len(repairs) == 1, stderr
    assert "found none" in repairs[0] and "Delete" not in repairs[0], repairs


def test_status_calls_a_damaged_unit_damaged_and_a_dry_run_would_build_it(clean, tmp_path) -> None:
    import shutil

    from cli_runner import etn
    from damage_cases import apply

    pipeline, data = clean
    shutil.copytree(data, tmp_path / "work")
    apply(Case("head weights", "flip", 40, 2), tmp_path / "work")
    code, output = etn("status", pipeline, "--data-dir", tmp_path / "work")
    assert code == 0 and "damaged  Head file" in output and ", 1 damaged;" in output, output
    code, output = etn("run", pipeline, "--data-dir", tmp_path / "work", "--dry-run")
    assert "would build head" in output and "1 to build" in output, output


def test_a_head_saved_from_python_is_checked_when_loaded(tmp_path) -> None:
    from conftest import make_features

    import etn_cli
    from etn_cli.heads import heads

    f = make_features()
    head = heads.get("map")().fit(f.hidden, f.logits, f.labels)
    head.save(tmp_path)
    assert len((tmp_path / "checksums.sha256").read_text().splitlines()) == 2
    np.testing.assert_array_equal(
        etn_cli.load_head(tmp_path).predict(f.hidden, f.logits).probs,
        head.predict(f.hidden, f.logits).probs,
    )
    weights = tmp_path / "weights.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0x04  # a value, not the header: the file still parses
    weights.write_bytes(bytes(raw))
    with pytest.raises(DamagedArtefact, match="damaged: weights.safetensors has sha256 .*corrupt"):
        etn_cli.load_head(tmp_path)
    (tmp_path / "checksums.sha256").write_text("garbage\n")
    with pytest.raises(DamagedArtefact, match="checksums.sha256 is damaged"):
        etn_cli.load_head(tmp_path)


def test_a_head_folder_an_older_etn_saved_without_checksums_loads_with_a_note(tmp_path) -> None:
    from conftest import make_features

    import etn_cli
    from etn_cli.heads import heads

    f = make_features()
    heads.get("map")().fit(f.hidden, f.logits, f.labels).save(tmp_path)
    (tmp_path / "checksums.sha256").unlink()
    with store_warnings() as said:
        assert etn_cli.load_head(tmp_path).n_classes_ == 4
    assert any("carries no checksums" in r.getMessage() for r in said)


def installed_etn(*args: str | Path) -> subprocess.CompletedProcess:
    """``etn ARGS`` through the installed entry point in a new process, as a shell runs it."""
    command = [str(Path(sys.executable).with_name("etn")), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def test_a_repair_is_said_even_with_quiet_and_no_failed_line_comes_first(clean, tmp_path) -> None:
    from damage_cases import apply, results

    pipeline, data = clean
    work = tmp_path / "work"
    shutil.copytree(data, work)
    apply(Case("shard", "flip", value_offset(target(work, "shard")), 2), work)
    done = installed_etn("run", pipeline, "--data-dir", work, "-q", "-f", "csv")
    assert done.returncode == 0, done.stderr
    lines = unstamped(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("repair: Hidden states in shard"), lines
    assert "do not match the checksum" in lines[0] and "Rebuilding digits.test-" in lines[0]
    assert results(work) == results(data)
    apply(Case("head weights", "flip", 2000, 1), work)
    for metrics in work.glob("metrics/damage/*"):  # the run reads the head again
        metrics.unlink()
    done = installed_etn("run", pipeline, "--data-dir", work, "-f", "csv")
    assert done.returncode == 0 and "FAILED" not in done.stderr, done.stderr
    assert [line for line in unstamped(done.stderr) if line.startswith("repair: ")]


def test_evaluate_on_a_damaged_shard_refuses_before_taking_any_lock(clean, tmp_path) -> None:
    pipeline, data = clean
    work = tmp_path / "work"
    shutil.copytree(data, work)
    for metrics in work.glob("metrics/damage/*"):
        metrics.unlink()
    shard = target(work, "shard")
    apply(Case("shard", "flip", value_offset(shard), 5), work)
    done = installed_etn("evaluate", pipeline, "--data-dir", work)
    errors = [line for line in unstamped(done.stderr) if not line.startswith("evaluate ")]
    assert done.returncode != 0 and len(errors) == 1, done.stderr
    assert errors[0].startswith("error: Hidden states in shard") and "FAILED" not in done.stderr
    assert "run etn extract again" in errors[0]
    assert not list(work.glob("metrics/damage/*")), list(work.glob("metrics/damage/*"))


def test_report_of_a_damaged_metrics_file_says_how_to_rebuild_it(clean, tmp_path) -> None:
    pipeline, data = clean
    work = tmp_path / "work"
    shutil.copytree(data, work)
    apply(Case("metrics file", "flip", 300, 3), work)
    for args in (
        ["report", pipeline, "--data-dir", work],
        ["report", target(work, "metrics file")],
    ):
        done = installed_etn(*args)
        assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
        assert "the file changed or is corrupt. Re-run etn evaluate (or etn run)" in done.stderr


def value_offset(shard: Path) -> int:
    """A byte inside the shard's hidden values (not its HDF5 header)."""
    with h5py.File(shard, "r") as handle:
        return handle["hidden"].id.get_offset() + 40


@pytest.mark.parametrize("name", ["../outside/shard-00000.h5", "/tmp/x.h5", "..", "a/b.h5"])
def test_a_manifest_naming_a_shard_outside_its_folder_is_refused_in_one_line(
    tmp_path, name
) -> None:
    from conftest import make_features

    from etn_cli.store.writing.writer import ShardWriter

    f = make_features(split=1)
    for folder in ("test", "outside"):
        with ShardWriter(tmp_path / folder, {"mine": "test"}, shard_rows=512) as writer:
            writer.append(f.hidden, f.logits, f.labels, np.arange(len(f.labels)))
    manifest_path = tmp_path / "test" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["shards"][0]["file"] = name  # re-sealed: the seal is a plain sha256
    manifest_path.write_text(json.dumps(seal_record(manifest)))
    with pytest.raises(EtnError, match="expected a file name inside its folder") as err:
        read_split(tmp_path / "test")
    assert "\n" not in str(err.value)
