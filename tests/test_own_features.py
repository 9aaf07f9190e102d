"""Features computed outside etn: the file formats, and every head working from them.

The last-layer heads (map_edl, ib_edl, laplace, mcd, ensemble) start from the backbone's final
layer; from files without one it is fitted by least squares, which must recover a known layer
exactly when the logits are affine in the hidden states (checked against the true W, b), and
say how far off it is when they are not. ``classifier = "none"`` skips those heads in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import polars as pl
import pytest
from cli_runner import etn
from safetensors.numpy import save_file

from etn_cli.errors import EtnError
from etn_cli.own_features.classifier import fit_last_layer
from etn_cli.own_features.files import read_feature_file

LAST_LAYER = ("map_edl", "ib_edl", "laplace", "mcd", "ensemble")


def linear_model(seed: int = 0, c: int = 3, d: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(c, d)).astype(np.float32), rng.normal(size=c).astype(np.float32)


def arrays(n: int, seed: int, weight: np.ndarray, bias: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(bias), n)
    hidden = (weight[labels] * 2 + rng.normal(size=(n, weight.shape[1]))).astype(np.float32)
    return {"hidden": hidden, "logits": hidden @ weight.T + bias, "labels": labels}


def test_least_squares_recovers_an_affine_last_layer_exactly() -> None:
    weight, bias = linear_model()
    data = arrays(50, 1, weight, bias)
    fitted_w, fitted_b, residual = fit_last_layer(data["hidden"], data["logits"])
    np.testing.assert_allclose(fitted_w, weight, atol=1e-4)
    np.testing.assert_allclose(fitted_b, bias, atol=1e-4)
    assert residual < 1e-5
    bent = np.tanh(data["logits"])  # not an affine function of hidden
    *_, far = fit_last_layer(data["hidden"], bent)
    assert far > 0.1


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".h5"])
def test_every_file_format_reads_the_same_arrays(tmp_path: Path, suffix: str) -> None:
    weight, bias = linear_model()
    data = arrays(20, 0, weight, bias) | {"layers/block": np.ones((20, 2), np.float32)}
    path = tmp_path / f"split{suffix}"
    if suffix == ".npz":
        np.savez(path, **{k.replace("/", "."): v for k, v in data.items()})
    elif suffix == ".safetensors":
        save_file({k: np.ascontiguousarray(v) for k, v in data.items()}, str(path))
    else:
        with h5py.File(path, "w") as handle:
            for key, value in data.items():
                handle[key] = value
    read = read_feature_file(path)
    np.testing.assert_array_equal(read.hidden, data["hidden"])
    np.testing.assert_array_equal(read.labels, data["labels"])
    assert read.index.tolist() == list(range(20)) and set(read.layers) == {"block"}


def test_a_pickled_npz_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "p.npz", hidden=np.array([{"a": 1}], dtype=object), logits=np.ones(2))
    with pytest.raises(EtnError, match="Cannot read the features"):
        read_feature_file(tmp_path / "p.npz")


def features_pipeline(tmp: Path, classifier: str = "") -> Path:
    weight, bias = linear_model()
    (tmp / "mine").mkdir(exist_ok=True)
    for seed, name in enumerate(("adapt", "test", "ood")):
        data = arrays(60, seed, weight, bias)
        np.savez(tmp / "mine" / f"{name}.npz", **data)
    heads = "".join(f'[[heads]]\nname = "{h}"\nepochs = 2\n' for h in LAST_LAYER)
    heads = heads.replace('name = "laplace"\nepochs = 2', 'name = "laplace"')
    heads = heads.replace('name = "mcd"\nepochs = 2', 'name = "mcd"')
    path = tmp / "own.toml"
    path.write_text(
        'name = "own"\nseeds = [0]\n[features]\nadapt = "mine/adapt.npz"\n'
        f'test = "mine/test.npz"\nood = ["mine/ood.npz"]\n{classifier}\n{heads}'
        '[[heads]]\nname = "map"\n'
    )
    return path


def test_every_last_layer_head_runs_from_files_without_a_classifier(tmp_path: Path) -> None:
    code, output = etn("run", features_pipeline(tmp_path), "-d", tmp_path / "data", "-f", "csv")
    assert code == 0, output
    weight, bias = linear_model()
    records = [json.loads(p.read_text()) for p in tmp_path.glob("data/heads/*/train.json")]
    fitted = [r["classifier"] for r in records if r["head"] in LAST_LAYER]
    assert len(fitted) == len(LAST_LAYER)
    assert all(c["kind"] == "fitted" and c["affine"] and c["unique"] for c in fitted)
    from etn_cli.store.artefacts.classifier import load_classifier

    (stored,) = tmp_path.glob("data/features/*-classifier-*/classifier.safetensors")
    np.testing.assert_allclose(load_classifier(stored)[0], weight, atol=1e-4)
    metrics = pl.concat([pl.read_parquet(p) for p in tmp_path.glob("data/metrics/own/*.parquet")])
    notes = metrics.group_by("method").agg(pl.col("classifier").first())
    by_method = dict(zip(notes["method"], notes["classifier"], strict=True))
    assert by_method["map"] is None and "fitted on the adaptation split" in by_method["laplace"]


def test_classifier_none_skips_the_last_layer_heads_in_one_line(tmp_path: Path) -> None:
    pipeline = features_pipeline(tmp_path, 'classifier = "none"')
    code, output = etn("run", pipeline, "-d", tmp_path / "data", "-f", "csv")
    assert code == 0, output
    skipped = [line for line in output.splitlines() if "skipped" in line and "none" in line]
    assert len(skipped) == 1 and all(label in skipped[0] for label in ("MAP_EDL", "Laplace"))
    assert [p.name.split("-")[0] for p in tmp_path.glob("data/heads/*") if p.is_dir()] == ["map"]


def test_a_classifier_stored_in_a_split_file_is_used(tmp_path: Path) -> None:
    pipeline = features_pipeline(tmp_path)
    data = dict(np.load(tmp_path / "mine" / "adapt.npz"))
    weight = np.full((3, 6), 0.5, np.float32)  # not the logits' layer: it must be this one
    np.savez(tmp_path / "mine" / "adapt.npz", **data, weight=weight)
    text = pipeline.read_text()
    pipeline.write_text(text[: text.index("[[heads]]")] + '[[heads]]\nname = "mcd"\n')
    with pytest.raises(EtnError, match="Expected the adaptation set"):  # not imported yet
        etn("train", pipeline, "-d", tmp_path / "data")
    assert etn("extract", pipeline, "-d", tmp_path / "data")[0] == 0
    assert etn("train", pipeline, "-d", tmp_path / "data")[0] == 0
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("data/heads/mcd-*/train.json")]
    assert record["classifier"]["kind"] == "in a split file"
    from etn_cli.heads.base import Head

    (folder,) = [p for p in tmp_path.glob("data/heads/mcd-*") if p.is_dir()]
    np.testing.assert_array_equal(Head.load(folder).weight_.numpy(), weight)
