"""The offline default: digits dataset sources and the cached digits CNN backbone."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sklearn.datasets import load_digits

from etn_cli.backbones import backbones, digits_cnn, digits_recipe
from etn_cli.datasets import datasets
from etn_cli.errors import EtnError
from etn_cli.stages.prepare import prepared
from etn_cli.store.artefacts.records import intact_record

ID_SPLITS = ("train", "adapt", "test")
SMALL = digits_cnn.Config(epochs=2)  # enough to test caching and determinism, not accuracy


def built(config: digits_cnn.Config, cache: Path) -> digits_cnn.DigitsCNNBackbone:
    """The backbone with its weights trained (or found) by stage zero, as ``etn extract``."""
    backbone = digits_cnn.DigitsCNNBackbone(config, cache)
    prepared(backbone)
    return backbone


def load(name: str, split: str = "test"):
    return datasets.get(name)().load_split(split)


def pixels_and_labels(split) -> tuple[np.ndarray, np.ndarray]:
    inputs, labels = split.data.tensors
    return inputs.numpy(), labels.numpy()


@pytest.fixture(scope="module")
def backbone(tmp_path_factory: pytest.TempPathFactory) -> digits_cnn.DigitsCNNBackbone:
    """The default backbone, trained once for the whole module."""
    backbone = backbones.get("digits_cnn")(digits_cnn.Config(), tmp_path_factory.mktemp("cache"))
    prepared(backbone)
    return backbone


def test_id_splits_are_disjoint_and_cover_exactly_the_digits_0_to_6() -> None:
    target = load_digits().target
    rows = [load("digits", s).index for s in ID_SPLITS]
    everything = np.concatenate(rows)
    assert len(np.unique(everything)) == len(everything)
    assert np.array_equal(np.sort(everything), np.flatnonzero(target <= 6))
    for split, size in zip(ID_SPLITS, (0.60, 0.15, 0.25), strict=True):
        assert abs(len(load("digits", split)) / len(everything) - size) < 0.01


def test_id_splits_are_stratified_by_class() -> None:
    target = load_digits().target
    overall = np.bincount(target[target <= 6]) / np.sum(target <= 6)
    for split in ID_SPLITS:
        _, labels = pixels_and_labels(load("digits", split))
        assert set(labels) == set(range(7))
        assert np.abs(np.bincount(labels) / len(labels) - overall).max() < 0.01


@pytest.mark.parametrize("name", ["digits", "digits_unseen"])
def test_index_traces_back_to_the_rows_of_load_digits(name: str) -> None:
    raw = load_digits()
    split = load(name)
    inputs, labels = pixels_and_labels(split)
    assert inputs.dtype == np.float32 and inputs.shape[1:] == (1, 8, 8)
    np.testing.assert_array_equal(inputs[:, 0], (raw.images[split.index] / 16).astype(np.float32))
    np.testing.assert_array_equal(labels, raw.target[split.index])


def test_unseen_holds_every_image_of_the_digits_7_to_9_and_nothing_else() -> None:
    target = load_digits().target
    split = load("digits_unseen")
    assert set(pixels_and_labels(split)[1]) == {7, 8, 9}
    assert np.array_equal(split.index, np.flatnonzero(target >= 7))
    assert split.num_classes == 10


def test_noise_changes_the_pixels_but_keeps_labels_and_index() -> None:
    clean, noisy = load("digits"), load("digits_noise")
    clean_x, clean_y = pixels_and_labels(clean)
    noisy_x, noisy_y = pixels_and_labels(noisy)
    assert np.array_equal(clean.index, noisy.index) and np.array_equal(clean_y, noisy_y)
    assert np.abs(noisy_x - clean_x).mean() > 0.2
    assert noisy_x.min() >= 0.0 and noisy_x.max() <= 1.0
    np.testing.assert_array_equal(noisy_x, pixels_and_labels(load("digits_noise"))[0])
    assert noisy.fingerprint["noise_sigma"] > 0 and "noise_seed" in noisy.fingerprint


def test_fingerprints_tell_the_splits_apart_and_name_the_data_digest() -> None:
    prints = [load("digits", s).fingerprint for s in ID_SPLITS] + [
        load("digits_noise").fingerprint,
        load("digits_unseen").fingerprint,
    ]
    assert len({json.dumps(fp, sort_keys=True) for fp in prints}) == len(prints)
    assert all(len(fp["data_sha256"]) == 64 for fp in prints)
    assert prints[0]["split_seed"] == 0 and prints[0]["split_fractions"]["adapt"] == 0.15


@pytest.mark.parametrize("name", ["digits", "digits_unseen", "digits_noise"])
def test_unknown_split_names_the_available_splits(name: str) -> None:
    with pytest.raises(EtnError, match="Available splits: .*test"):
        load(name, "validation")


def test_default_backbone_is_accurate_but_not_perfect(backbone) -> None:
    split = load("digits")
    logits = torch.cat([backbone.forward(x)[1] for x, _, _ in backbone.batches(split, 100)])
    accuracy = (logits.argmax(dim=1) == split.data.tensors[1]).float().mean().item()
    assert 0.9 <= accuracy < 1.0
    meta = json.loads((backbone.folder / "meta.json").read_text())
    assert meta["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)


def test_second_build_loads_the_cache_without_training(backbone, monkeypatch) -> None:
    files = sorted(backbone.cache_dir.rglob("*"))
    mtimes = [path.stat().st_mtime_ns for path in files]

    def refuse_to_train(*args, **kwargs) -> None:
        raise AssertionError("the cached model was trained again")

    monkeypatch.setattr(digits_cnn, "train_and_save", refuse_to_train)
    again = built(backbone.config, backbone.cache_dir)
    assert sorted(backbone.cache_dir.rglob("*")) == files  # no temporary folder left either
    assert [path.stat().st_mtime_ns for path in files] == mtimes
    assert again.fingerprint() == backbone.fingerprint()


def test_two_independent_trainings_give_identical_weights(tmp_path: Path) -> None:
    first = built(SMALL, tmp_path / "a")
    second = built(SMALL, tmp_path / "b")
    a, b = (load_file(bb.folder / digits_cnn.WEIGHTS_FILE) for bb in (first, second))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.fingerprint() == second.fingerprint()
    assert not torch.are_deterministic_algorithms_enabled()  # the global switch is restored


def test_weights_and_features_do_not_depend_on_the_float_kernels_reduction_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another processor sums in another order: here two threads instead of one. Trained and
    run in float64, the CNN's float32 weights and features come out bitwise the same (in
    float32, one thread against two gave weights 1.5e-6 apart)."""
    import contextlib

    train, test = load("digits", "train"), load("digits", "test")
    single_threaded, before = digits_cnn.deterministic, torch.get_num_threads()

    @contextlib.contextmanager
    def on_threads(seed: int, threads: int):
        with single_threaded(seed):
            torch.set_num_threads(threads)
            yield

    weights, features = [], []
    try:
        for threads in (1, 2):
            monkeypatch.setattr(digits_cnn, "deterministic", lambda s, n=threads: on_threads(s, n))
            weights.append(digits_cnn.train_model(SMALL, train).state_dict())
            torch.set_num_threads(threads)
            backbone = built(SMALL, tmp_path / str(threads))
            features.append(backbone.forward(test.data.tensors[0])[0])  # (N, D)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert all(w.dtype == torch.float32 for w in weights[0].values())
    assert torch.equal(features[0], features[1])


def test_fingerprint_changes_when_a_config_value_changes(tmp_path: Path) -> None:
    base = built(SMALL, tmp_path)
    other = built(dataclasses.replace(SMALL, lr=2e-3), tmp_path)
    assert base.fingerprint() != other.fingerprint()
    assert base.folder != other.folder


def test_damaged_weights_are_retrained_to_the_same_bytes(tmp_path: Path, capsys) -> None:
    folder = built(SMALL, tmp_path).folder
    weights = folder / digits_cnn.WEIGHTS_FILE
    good = weights.read_bytes()
    weights.write_bytes(b"not a safetensors file")
    digest = hashlib.sha256(good).hexdigest()
    # planning keeps the recorded key and repairs nothing; loading the model refuses the file
    planning = digits_cnn.DigitsCNNBackbone(SMALL, tmp_path)
    planning.use_cache(intact_record(planning.folder, digits_cnn.META_FILE))
    assert planning.weights_sha256 == digest
    with pytest.raises(EtnError, match="has sha256 .* but meta.json records"):
        planning.load()
    assert weights.read_bytes() == b"not a safetensors file"
    backbone = built(SMALL, tmp_path)
    assert weights.read_bytes() == good and "repair: " in capsys.readouterr().err
    assert backbone.fingerprint()["weights_sha256"] == digest


def test_unreadable_weights_of_an_older_cache_raise_an_etn_error(tmp_path: Path) -> None:
    folder = built(SMALL, tmp_path).folder
    meta = json.loads((folder / "meta.json").read_text())
    meta.pop("files"), meta.pop("record_sha256")  # as etn wrote it before recording sha256
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / digits_cnn.WEIGHTS_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(EtnError, match="Delete"):
        built(SMALL, tmp_path).load()


def test_module_names_are_the_models_own() -> None:
    """Layers are checked while planning against these names, without building the model."""
    model = digits_cnn.DigitsCNN(SMALL, 7)
    assert [name for name, _ in model.named_modules()][1:] == list(digits_recipe.MODULE_NAMES)


def test_constructing_the_backbone_builds_and_loads_nothing(tmp_path: Path) -> None:
    backbone = digits_cnn.DigitsCNNBackbone(SMALL, tmp_path / "cache")
    assert backbone._model is None and not (tmp_path / "cache").exists()
    assert backbone.fingerprint()["weights_sha256"] == "not built"
    with pytest.raises(EtnError, match="Run `etn extract` or `etn run`"):
        backbone.load()


def test_logits_are_the_classifier_applied_to_the_hidden_state(backbone) -> None:
    inputs, _, _ = next(backbone.batches(load("digits_noise"), 64))
    hidden, logits = backbone.forward(inputs)
    head = backbone.classifier()
    assert hidden.shape == (64, backbone.hidden_size) and logits.shape == (64, 7)
    assert hidden.dtype == logits.dtype == head["weight"].dtype == torch.float32
    assert head["weight"].shape == (7, backbone.hidden_size) and head["bias"].shape == (7,)
    torch.testing.assert_close(logits, hidden @ head["weight"].T + head["bias"], atol=1e-5, rtol=0)


def test_batches_follow_split_order_and_batched_forward_equals_single(backbone) -> None:
    split = load("digits", "adapt")
    batches = list(backbone.batches(split, 32))
    assert np.array_equal(torch.cat([i for _, _, i in batches]).numpy(), split.index)
    assert torch.equal(torch.cat([y for _, y, _ in batches]), split.data.tensors[1])
    inputs = batches[0][0]  # (32, 1, 8, 8)
    hidden, logits = backbone.forward(inputs)
    singles = [backbone.forward(inputs[i : i + 1]) for i in range(len(inputs))]
    torch.testing.assert_close(hidden, torch.cat([h for h, _ in singles]), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, torch.cat([z for _, z in singles]), atol=1e-5, rtol=0)
