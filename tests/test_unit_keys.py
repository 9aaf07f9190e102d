"""Every artefact read is the one asked for (issue 31.1): a head, split, metrics or predictions
file whose recorded key is not the key in its name holds another unit, however whole its
checksums are. ``etn run`` rebuilds it, every other command refuses it in one line, and the
results are the clean run's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import etn_process as etn
from cli_runner import without_progress
from tiny_pipeline import BOTH_OOD, tiny_pipeline

from etn_cli.errors import DamagedArtefact
from etn_cli.store.artefacts.sealed import write_sealed
from etn_cli.store.artefacts.unitkey import check_recorded_key, named_key

PIPELINE = tiny_pipeline(
    "keys", seeds=(0, 1), data={"ood": BOTH_OOD}, heads=({"name": "etn", "epochs": 2},)
)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("keys")
    pipeline = root / "keys.toml"
    pipeline.write_text(PIPELINE)
    done = etn("run", pipeline, "-d", root / "data", "-f", "csv")
    assert done.returncode == 0, done.stderr
    return pipeline, root / "data"


def copy(clean: tuple[Path, Path], tmp_path: Path) -> Path:
    shutil.copytree(clean[1], tmp_path / "data")
    return tmp_path / "data"


def results(data: Path) -> list[dict]:
    record = json.loads((data / "reports" / "keys" / "results.json").read_text())
    return [row for row in record["results"] if not row["metric"].startswith("runtime")]


def swap(a: Path, b: Path) -> None:
    aside = a.with_name("aside")
    a.rename(aside)
    b.rename(a)
    aside.rename(b)


def test_a_name_carries_a_key_only_when_it_ends_in_sixteen_hex_digits() -> None:
    assert named_key(Path("heads/etn-0123456789abcdef")) == "0123456789abcdef"
    assert named_key(Path("metrics/p/map-0123456789abcdef.parquet")) == "0123456789abcdef"
    assert named_key(Path("mine/adapt")) is None
    assert named_key(Path("feats-2024")) is None
    check_recorded_key(Path("mine/adapt"), "anything", "record")  # a name you chose: unchecked
    with pytest.raises(DamagedArtefact, match="records key 1111111111111111"):
        check_recorded_key(Path("etn-0123456789abcdef"), "1111111111111111", "record")


def test_swapped_seed_heads_are_refused_by_predict_and_retrained_by_run(clean, tmp_path) -> None:
    pipeline, _ = clean
    data = copy(clean, tmp_path)
    first, second = sorted(p for p in (data / "heads").iterdir() if p.is_dir())
    swap(first, second)
    out = tmp_path / "p.csv"
    done = etn("predict", pipeline, "digits:test", "--seed", "0", "-d", data, "-o", out)
    err = without_progress(done.stderr)
    assert done.returncode == 2 and err.count("\n") == 1, err
    assert "records key" in err and "holds another unit" in err
    assert not (tmp_path / "p.csv").exists()
    done = etn("run", pipeline, "-d", data, "-f", "csv")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("repair: ") == 2 and "Retraining" in done.stderr
    assert results(data) == results(clean[1])


def test_a_split_folder_swapped_with_another_is_re_extracted(clean, tmp_path) -> None:
    pipeline, _ = clean
    data = copy(clean, tmp_path)
    (unseen,) = (p for p in data.glob("features/*/digits_unseen.test-*") if p.is_dir())
    (noise,) = (p for p in data.glob("features/*/digits_noise.test-*") if p.is_dir())
    swap(unseen, noise)
    shutil.rmtree(data / "metrics")  # so that evaluate reads the splits again
    done = etn("evaluate", pipeline, "-d", data)
    err = without_progress(done.stderr)
    assert done.returncode == 2 and "Manifest" in err and "records key" in err, err
    done = etn("run", pipeline, "-d", data, "-f", "csv")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("repair: ") == 2
    assert results(data) == results(clean[1])


def test_a_metrics_file_copied_over_another_with_its_checksum_is_rebuilt(clean, tmp_path) -> None:
    pipeline, _ = clean
    data = copy(clean, tmp_path)
    first, second = sorted((data / "metrics" / "keys").glob("*.parquet"))
    write_sealed(second, first.read_bytes())  # seed 0's results under seed 1's name, resealed
    done = etn("report", pipeline, "-d", data)
    err = without_progress(done.stderr)
    assert done.returncode == 2 and "metrics_key" not in err and "records key" in err, err
    done = etn("run", pipeline, "-d", data, "-f", "csv")
    assert done.returncode == 0, done.stderr
    assert "repair: " in done.stderr
    assert results(data) == results(clean[1])


def test_verify_reports_a_swapped_head_once_through_the_shared_check(clean, tmp_path) -> None:
    data = copy(clean, tmp_path)
    first, second = sorted(p for p in (data / "heads").iterdir() if p.is_dir())
    swap(first, second)
    done = etn("verify", "-d", data)
    assert done.returncode == 1
    assert done.stdout.count("DAMAGED") == 2 and "records key" in done.stdout
