"""``etn finetune`` (stage zero) and a whole vision pipeline through the CLI: FakeData and a
randomly initialised ResNet18 at 16x16 pixels, fine-tuned for one epoch, on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from cli_runner import etn
from safetensors.torch import load_file
from tiny_pipeline import fake_data, resnet18, tiny_pipeline

from etn_cli.backbones.torchvision_model import Config, TorchvisionBackbone
from etn_cli.errors import EtnError
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.plan import make_plan, open_source
from etn_cli.stages.extract import extract
from etn_cli.stages.finetune import finetune

HEADS = ("map", {"name": "etn", "epochs": 2, "batch_size": 8}, "mahalanobis", "energy")
FINETUNE = {"split": "train", "epochs": 1, "batch_size": 8}


def write(folder: Path, finetune: dict | None = FINETUNE, lr: float = 1e-3, **data) -> Path:
    tables = {"finetune": finetune | {"lr": lr}} if finetune else {}
    data = fake_data(size=12, image_size=16) | data
    path = folder / "tiny.toml"
    path.write_text(
        tiny_pipeline("tinyvision", backbone=resnet18(4), data=data, heads=HEADS, **tables)
    )
    return path


def files(data: Path) -> dict[Path, int]:
    """Every unit file etn wrote with its modification time (reports are rewritten each run)."""
    return {
        p: p.stat().st_mtime_ns
        for p in data.rglob("*")
        if p.is_file() and p.suffix != ".lock" and "reports" not in p.parts
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("vision")
    pipeline = write(root)
    code, output = etn(
        "run", pipeline, "--data-dir", root / "data", "--device", "cpu", "--format", "markdown"
    )
    assert code == 0, output
    return pipeline, root / "data", output


def test_run_fine_tunes_then_extracts_trains_and_evaluates(finished) -> None:
    pipeline, data, output = finished
    (folder,) = (data / "backbones").glob("torchvision-finetune-*[!k]")
    record = json.loads((folder / "finetune.json").read_text())
    assert record["kind"] == "etn-finetune" and record["rows"] == 12
    assert len(record["record"]["history"]) == 1 and record["settings"]["epochs"] == 1
    assert (folder / "model.safetensors").is_file()
    assert "finetune: 1 built" in output and "| ETN |" in output
    plan = make_plan(load_pipeline(pipeline), data)
    manifest = json.loads((plan.test.path / "manifest.json").read_text())
    assert manifest["loaded_backbone"]["finetuned"] == folder.name
    assert manifest["fingerprint"]["backbone"]["finetune"] == plan.finetune.key
    assert {"wall_s", "forward_s", "forward_s_per_sample"} <= manifest["timing"].keys()


def test_rerun_does_no_work(finished) -> None:
    pipeline, data, _ = finished
    before = files(data)
    code, output = etn("run", pipeline, "--data-dir", data, "--device", "cpu")
    assert code == 0 and "finetune: 0 built, 1 up to date" in output
    assert "extract: 0 built" in output and files(data) == before


def test_a_damaged_fine_tune_is_trained_again_to_the_same_weights(finished, tmp_path) -> None:
    import shutil

    pipeline, data, _ = finished
    work = tmp_path / "data"
    shutil.copytree(data, work)
    (folder,) = (work / "backbones").glob("torchvision-finetune-*[!k]")
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    raw = bytearray(good)
    raw[len(raw) // 2] ^= 0x04
    weights.write_bytes(bytes(raw))
    code, output = etn("run", pipeline, "--data-dir", work, "--device", "cpu")
    assert code == 0 and "repair: " in output and "finetune: 1 built" in output, output
    assert weights.read_bytes() == good and "extract: 0 built" in output  # seeded: same bytes


def test_extract_uses_the_fine_tuned_weights(finished) -> None:
    pipeline, data, _ = finished
    plan = make_plan(load_pipeline(pipeline), data)
    trained = load_file(plan.finetune.path / "model.safetensors")
    initial = plan.backbone.build().classifier()  # the pretrained weights, not fine-tuned
    assert not torch.equal(trained["fc.weight"], initial["weight"])  # training moved the head
    stored = load_file(plan.classifier_path)
    torch.testing.assert_close(stored["weight"], trained["fc.weight"])
    torch.testing.assert_close(stored["bias"], trained["fc.bias"])
    with h5py.File(plan.adapt.path / "shard-00000.h5") as shard:
        hidden, logits = shard["hidden"][:], shard["logits"][:]
    recomputed = hidden @ trained["fc.weight"].numpy().T + trained["fc.bias"].numpy()
    np.testing.assert_allclose(recomputed, logits, rtol=1e-4, atol=1e-5)


def test_the_finetune_folder_works_as_a_weights_option(finished) -> None:
    pipeline, data, _ = finished
    plan = make_plan(load_pipeline(pipeline), data)
    config = Config(model="resnet18", weights=str(plan.finetune.path))
    backbone = TorchvisionBackbone(config, data / "backbones")  # num_classes from the file
    split = open_source(plan.pipeline, "fake").load_split("adapt")
    inputs, _, index = next(iter(backbone.loader(split, 12)))
    _, logits, _ = backbone.extract_batch(inputs)
    with h5py.File(plan.adapt.path / "shard-00000.h5") as shard:
        order = np.argsort(shard["index"][:])
        np.testing.assert_allclose(logits.numpy(), shard["logits"][:][order][index.numpy()])


def test_fine_tuning_changes_every_feature_key(finished, tmp_path: Path) -> None:
    pipeline, data, _ = finished
    with_finetune = make_plan(load_pipeline(pipeline), data)
    without = make_plan(load_pipeline(write(tmp_path, None)), data)
    assert without.finetune is None
    for a, b in zip(with_finetune.feature_units, without.feature_units, strict=True):
        assert a.key != b.key
    assert with_finetune.classifier_path != without.classifier_path


def test_fine_tuning_is_reproducible_under_its_seed(finished, tmp_path: Path) -> None:
    pipeline, data, _ = finished
    plan = make_plan(load_pipeline(pipeline), tmp_path / "again")
    assert plan.finetune.key == make_plan(load_pipeline(pipeline), data).finetune.key
    assert finetune(plan).done == [str(plan.finetune.path)]
    first = load_file(make_plan(load_pipeline(pipeline), data).finetune.path / "model.safetensors")
    second = load_file(plan.finetune.path / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_diverging_fine_tune_leaves_nothing_behind(tmp_path: Path) -> None:
    diverging = FINETUNE | {"epochs": 4, "optimizer": "sgd"}  # lr = 1e6
    plan = make_plan(load_pipeline(write(tmp_path, diverging, lr=1e6)), tmp_path / "data")
    with pytest.raises(EtnError, match="loss became nan.*nothing was saved"):
        finetune(plan)
    leftovers = [p.name for p in (tmp_path / "data" / "backbones").iterdir()]
    assert all(name.endswith(".lock") for name in leftovers), leftovers


def test_extract_before_finetune_says_what_to_run(tmp_path: Path) -> None:
    plan = make_plan(load_pipeline(write(tmp_path)), tmp_path / "data")
    with pytest.raises(EtnError, match="Run `etn finetune`"):
        extract(plan)
    assert not list((tmp_path / "data").rglob("*.h5"))


def test_unknown_finetune_settings_are_refused_while_planning(tmp_path: Path) -> None:
    path = write(tmp_path, FINETUNE | {"epoch": 3})
    with pytest.raises(EtnError, match="Unknown key 'epoch'.*Did you mean 'epochs'"):
        make_plan(load_pipeline(path), tmp_path / "data")


def test_finetune_without_a_table_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(EtnError, match=r"no \[finetune\] table"):
        etn("finetune", write(tmp_path, None), "--data-dir", tmp_path / "data")


def test_missing_dataset_files_stop_the_run_before_anything_is_written(tmp_path: Path) -> None:
    cifar = {"id": "cifar10", "root": "datasets", "ood": ["svhn"], "options": None}
    path = write(tmp_path, **cifar)
    with pytest.raises(EtnError) as refused:  # the entry point makes it one line, exit 2
        etn("run", path, "--data-dir", tmp_path / "data", "--device", "cpu")
    assert "cifar-10-batches-py" in str(refused.value) and "download = true" in str(refused.value)
    assert not (tmp_path / "data").exists()  # stopped while planning: nothing written at all
