"""The ``timm`` and ``hf_image`` backbones compute what each library's own documented
inference path computes, on random-initialised tiny models.

timm: ``forward_head(forward_features(x), pre_logits=True)`` on images preprocessed by
``create_transform(**resolve_data_config(model=...))``; Hugging Face: ``AutoImageProcessor``
and the model's own outputs (the class token of ``ViTModel``, ``pooler_output`` of ConvNeXt).
The examples ``examples/timm.toml`` and ``examples/hf_image.toml`` run on their stand-ins
through the installed entry point once per module.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import etn_process as etn

from etn_cli.errors import EtnError

pytest.importorskip("timm")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PIPELINES = ("timm.toml", "hf_image.toml")
sys.path.insert(0, str(EXAMPLES))
import standins  # noqa: E402


def images(count: int = 5, seed: int = 0) -> list:
    """Random RGB images of several sizes and aspect ratios."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(50, 70), (64, 64), (90, 40), (33, 47), (120, 80)]
    return [
        Image.fromarray(rng.integers(0, 256, (*sizes[i % 5], 3), dtype=np.uint8))
        for i in range(count)
    ]


def extract(backbone, pictures: list) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    x = torch.stack([backbone.transform.pixels(im) for im in pictures])
    hidden, logits, extras = backbone.extract_batch(x)
    return hidden.numpy(), logits.numpy(), {k: v.numpy() for k, v in extras.items()}


def timm_backbone(tmp_path: Path, **options):
    from etn_cli.backbones.settings import TimmConfig
    from etn_cli.backbones.timm_model import TimmBackbone

    defaults = {"num_classes": 3} | ({} if "checkpoint" in options else {"weights": "none"})
    return TimmBackbone(TimmConfig(**(defaults | options)), tmp_path)


# -- timm --------------------------------------------------------------------------------------

TIMM_CASES = [  # a ViT at a non-square input; a CNN whose head is called "classifier"
    {"model": "test_vit", "img_size": (32, 48), "layers": ("blocks.1",)},
    {"model": "test_efficientnet", "img_size": (40, 56), "layers": ("blocks.1",)},
]


@pytest.mark.parametrize("options", TIMM_CASES, ids=lambda o: o["model"])
def test_timm_features_are_forward_head_pre_logits_on_create_transform_images(
    tmp_path: Path, options: dict
) -> None:
    import timm
    from timm.data import create_transform, resolve_data_config

    backbone = timm_backbone(tmp_path, **options)
    hidden, logits, layers = extract(backbone, images())
    reference = timm.create_model(options["model"], num_classes=3).eval()
    if options["model"] == "test_vit":
        reference = timm.create_model("test_vit", num_classes=3, img_size=options["img_size"])
    reference.load_state_dict(backbone.model.state_dict())
    config = resolve_data_config({"input_size": (3, *options["img_size"])}, model=reference)
    transform = create_transform(**config)  # the documented path: ToTensor and Normalize
    x = torch.stack([transform(im) for im in images()])
    assert x.shape[-2:] == options["img_size"]
    seen = {}
    hook = reference.blocks[1].register_forward_hook(lambda m, a, out: seen.update(out=out))
    with torch.no_grad():
        features = reference.forward_head(reference.forward_features(x), pre_logits=True)
        expected = reference(x)
    hook.remove()
    np.testing.assert_allclose(hidden, features.numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-5, rtol=1e-4)
    out = seen["out"]  # a ViT's (B, N, D): its class token; a CNN's (B, C, H, W): averaged
    pooled = out[:, 0] if out.ndim == 3 else out.mean(dim=(2, 3))
    np.testing.assert_allclose(layers["blocks.1"], pooled.numpy(), atol=1e-5, rtol=1e-4)
    weights = backbone.classifier()
    direct = hidden @ weights["weight"].numpy().T + weights["bias"].numpy()
    np.testing.assert_allclose(logits, direct, atol=1e-5, rtol=1e-4)
    assert backbone.head_name == ("head" if options["model"] == "test_vit" else "classifier")


def test_timm_batches_give_the_features_of_single_images(tmp_path: Path) -> None:
    backbone = timm_backbone(tmp_path, **TIMM_CASES[0], odin=True)
    together = extract(backbone, images())
    alone = [extract(backbone, [im]) for im in images()]
    for k in (0, 1):
        np.testing.assert_allclose(together[k], np.concatenate([a[k] for a in alone]), atol=1e-5)
    for name in ("blocks.1", "odin"):
        each = np.concatenate([a[2][name] for a in alone])
        np.testing.assert_allclose(together[2][name], each, atol=1e-4)


def test_timm_mean_token_pooling_skips_the_class_token(tmp_path: Path) -> None:
    backbone = timm_backbone(tmp_path, **TIMM_CASES[0], token_pool="mean")
    seen = {}
    backbone.model.blocks[1].register_forward_hook(lambda m, a, out: seen.update(out=out))
    _, _, layers = extract(backbone, images(2))
    prefix = backbone.model.num_prefix_tokens
    assert prefix == 1
    expected = seen["out"][:, prefix:].mean(dim=1)
    np.testing.assert_allclose(layers["blocks.1"], expected.numpy(), atol=1e-6)


def test_timm_content_keys_follow_weights_and_preprocessing(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    base = timm_backbone(tmp_path, **TIMM_CASES[0])
    files = []
    for seed in (0, 1):
        other = timm_backbone(tmp_path, **TIMM_CASES[0], seed=seed)
        files.append(tmp_path / f"w{seed}.safetensors")
        save_file(other.model.state_dict(), str(files[-1]))
    keys = {
        "seed 0": base.fingerprint(),
        "seed 1": timm_backbone(tmp_path, **TIMM_CASES[0], seed=1).fingerprint(),
        "file 0": timm_backbone(tmp_path, **TIMM_CASES[0], checkpoint=str(files[0])).fingerprint(),
        "file 1": timm_backbone(tmp_path, **TIMM_CASES[0], checkpoint=str(files[1])).fingerprint(),
        "size": timm_backbone(tmp_path, **(TIMM_CASES[0] | {"img_size": 32})).fingerprint(),
    }
    assert len({repr(fp) for fp in keys.values()}) == len(keys)
    assert keys["size"]["transform"]["input_size"] == [3, 32, 32]
    again = timm_backbone(tmp_path, **TIMM_CASES[0], checkpoint=str(files[1]))
    assert again.fingerprint() == keys["file 1"]
    random = timm_backbone(tmp_path, **TIMM_CASES[0], seed=1)
    np.testing.assert_allclose(extract(again, images(1))[1], extract(random, images(1))[1])


def test_timm_errors_name_the_model_the_file_and_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    with pytest.raises(EtnError, match="Unknown timm model 'vit_tiny_patch16_2244'.*Did you mean"):
        timm_backbone(tmp_path, model="vit_tiny_patch16_2244")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(EtnError) as missing:
        timm_backbone(tmp_path, model="test_vit.r160_in1k", weights="pretrained")
    message = str(missing.value)
    assert "hf download timm/test_vit.r160_in1k model.safetensors" in message
    assert "download = true" in message and "\n" not in message
    with pytest.raises(EtnError, match="checkpoint = 'nope.safetensors': no such file"):
        timm_backbone(
            tmp_path, model="test_vit", weights="pretrained", checkpoint="nope.safetensors"
        )
    with pytest.raises(EtnError, match="classifier_layer = 'blocks' names Sequential"):
        timm_backbone(tmp_path, model="test_vit", classifier="blocks")


def test_a_missing_timm_names_the_vision_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "timm" else real(n))
    with pytest.raises(EtnError, match=r"needs timm.*pip install 'etn-cli\[vision\]'"):
        timm_backbone(tmp_path, model="test_vit")


# -- Hugging Face ------------------------------------------------------------------------------


def convnext_folder(folder: Path) -> Path:
    """A tiny random ConvNeXt classifier whose processor resizes the shorter side and crops."""
    from transformers import ConvNextConfig, ConvNextForImageClassification, ConvNextImageProcessor

    config = ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3)
    torch.manual_seed(0)
    ConvNextForImageClassification(config).save_pretrained(folder)
    ConvNextImageProcessor(size={"shortest_edge": 32}).save_pretrained(folder)
    return folder


def first_block(model: torch.nn.Module) -> str:
    """The first block of a ViT or the first stage of a ConvNeXt, by the names of this
    transformers version (ViT: vit.layers.0; vit.encoder.layer.0 in 5.0)."""
    names = dict(model.named_modules())
    candidates = ("vit.layers.0", "vit.encoder.layer.0", "convnext.encoder.stages.0")
    return next(name for name in candidates if name in names)


def hf_backbone(tmp_path: Path, model: Path, **options):
    from etn_cli.backbones.hf_image import HFImageBackbone
    from etn_cli.backbones.settings import HFImageConfig

    return HFImageBackbone(HFImageConfig(model=str(model), **options), tmp_path / "cache")


@pytest.mark.parametrize("kind", ["vit", "convnext"])
def test_hf_features_are_the_models_own_outputs_on_its_processors_images(
    tmp_path: Path, kind: str
) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    if kind == "vit":
        folder = standins.write_hf_image(tmp_path)
    else:
        folder = convnext_folder(tmp_path / "convnext")
    layer = first_block(hf_backbone(tmp_path, folder).model)
    backbone = hf_backbone(tmp_path, folder, layers=(layer,))
    hidden, logits, layers = extract(backbone, images())
    processor = AutoImageProcessor.from_pretrained(folder)
    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    x = processor(images=images(), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model(pixel_values=x, output_hidden_states=True)
        if kind == "vit":  # the classifier reads the final layer-normed class token
            features = model.vit(pixel_values=x).last_hidden_state[:, 0]
            inner = out.hidden_states[1][:, 0]  # after layer 0: its class token
        else:
            features = model.convnext(pixel_values=x).pooler_output
            inner = out.hidden_states[1].mean(dim=(2, 3))  # after stage 0, averaged
    np.testing.assert_allclose(hidden, features.numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(layers[layer], inner.numpy(), atol=1e-5, rtol=1e-4)
    assert backbone.head_name == "classifier"


def test_hf_batches_give_the_features_of_single_images(tmp_path: Path) -> None:
    backbone = hf_backbone(tmp_path, standins.write_hf_image(tmp_path), odin=True)
    together = extract(backbone, images())
    alone = [extract(backbone, [im]) for im in images()]
    for k in (0, 1):
        np.testing.assert_allclose(together[k], np.concatenate([a[k] for a in alone]), atol=1e-5)
    each = np.concatenate([a[2]["odin"] for a in alone])
    np.testing.assert_allclose(together[2]["odin"], each, atol=1e-4)


def test_hf_content_keys_follow_weights_and_preprocessing(tmp_path: Path) -> None:
    import json

    folder = standins.write_hf_image(tmp_path / "a")
    first = hf_backbone(tmp_path, folder).fingerprint()
    reweighted = standins.write_hf_image(tmp_path / "b", seed=1)
    assert hf_backbone(tmp_path, reweighted).fingerprint()["model"] != first["model"]
    moved = shutil.copytree(folder, tmp_path / "c")
    assert hf_backbone(tmp_path, moved).fingerprint() == first  # content, not the path
    config = json.loads((moved / "preprocessor_config.json").read_text())
    config["image_mean"] = [0.4, 0.4, 0.4]
    (moved / "preprocessor_config.json").write_text(json.dumps(config))
    changed = hf_backbone(tmp_path, moved).fingerprint()
    assert changed["transform"] != first["transform"] and changed != first


def test_hf_errors_say_what_is_missing_and_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(EtnError) as missing:
        hf_backbone(tmp_path, "google/vit-base-patch16-224")
    assert "`hf download google/vit-base-patch16-224`" in str(missing.value)
    assert "download = true" in str(missing.value)
    folder = standins.write_hf_image(tmp_path)
    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(EtnError, match="no preprocessor_config.json"):
        hf_backbone(tmp_path, folder)
    folder = standins.write_hf_image(tmp_path / "again")
    with pytest.raises(EtnError, match="classifier_layer = 'vit.layernorm' names LayerNorm"):
        hf_backbone(tmp_path, folder, classifier="vit.layernorm")
    model = hf_backbone(tmp_path, folder).model
    inner = next(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    with pytest.raises(EtnError, match=f"not the output of layer '{inner}'"):
        hf_backbone(tmp_path, folder, classifier=inner).forward(torch.zeros(1, 3, 32, 32))


# -- the examples, through the entry point ---------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both examples copied to a folder with their stand-ins, run in one ``etn run``."""
    folder = tmp_path_factory.mktemp("examples")
    for name in PIPELINES:
        shutil.copy(EXAMPLES / name, folder / name)
    for make in (standins.write_images, standins.write_timm, standins.write_hf_image):
        make(folder)
    done = etn("run", *PIPELINES, "-d", "data", "--set", "seeds=[0]", "-f", "csv", cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def stored_test_split(folder: Path, pipeline: str):
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan
    from etn_cli.store.reading.reader import read_split

    plan = make_plan(load_pipeline(folder / pipeline), folder / "data")
    return read_split(plan.test.path)


def id_test_images(folder: Path) -> list:
    from PIL import Image

    files = sorted((folder / "my_images" / "test").rglob("*.png"))
    return [Image.open(path).convert("RGB") for path in files]


def test_the_timm_example_stores_what_timm_computes(run: Path) -> None:
    import timm
    from safetensors.torch import load_file
    from timm.data import create_transform, resolve_data_config

    features = stored_test_split(run, "timm.toml")
    model = timm.create_model(standins.TIMM_MODEL, num_classes=3, img_size=standins.TIMM_SIZE)
    model.load_state_dict(load_file(run / "timm_model.safetensors"))
    model.eval()
    size = standins.TIMM_SIZE
    transform = create_transform(
        **resolve_data_config({"input_size": (3, size, size)}, model=model)
    )
    pictures = id_test_images(run)
    x = torch.stack([transform(pictures[i]) for i in features.index])
    with torch.no_grad():
        hidden = model.forward_head(model.forward_features(x), pre_logits=True)
        logits = model(x)
    np.testing.assert_allclose(features.hidden, hidden.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(features.logits, logits.numpy(), atol=1e-4, rtol=1e-4)
    assert features.layers["blocks.2"].shape == (len(x), model.embed_dim)


def test_the_hf_image_example_stores_what_transformers_computes(run: Path) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    features = stored_test_split(run, "hf_image.toml")
    processor = AutoImageProcessor.from_pretrained(run / "my_vit")
    model = AutoModelForImageClassification.from_pretrained(run / "my_vit").eval()
    pictures = id_test_images(run)
    x = processor(images=[pictures[i] for i in features.index], return_tensors="pt")
    with torch.no_grad():
        logits = model(**x).logits
    np.testing.assert_allclose(features.logits, logits.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_predict_reads_image_files_with_either_backbone(run: Path, pipeline: str) -> None:
    import polars as pl

    out = run / f"{pipeline}.csv"
    done = etn("predict", pipeline, "my_images/test", "-d", "data", "--out", out, cwd=run)
    assert done.returncode == 0, done.stderr[-2000:]
    frame = pl.read_csv(out)
    assert frame.height == 12
    assert [c for c in frame.columns if c.startswith("prob_")] == [
        f"prob_{name}" for name in standins.CLASSES
    ]


def test_the_vit_b16_pipeline_is_openood_imagenet_with_another_backbone() -> None:
    from etn_cli.planning.pipeline import load_pipeline

    vit = load_pipeline(REPO / "pipelines" / "imagenet_vit_b16.toml")
    resnet = load_pipeline(REPO / "pipelines" / "openood_imagenet.toml")
    expected = {"model": "vit_b_16", "weights": "IMAGENET1K_V1", "dtype": "auto"}
    assert vit.backbone_options == expected
    assert vit.data == resnet.data
    assert [h.name for h in vit.heads] == [h.name for h in resnet.heads]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_python_api_wraps_either_backbone_as_extract_stores_it(
    run: Path, pipeline: str
) -> None:
    import etn_cli

    model = etn_cli.EvidentialModel.from_pipeline(run / pipeline, head="map", data_dir=run / "data")
    features = stored_test_split(run, pipeline)
    pictures = id_test_images(run)
    out = model([pictures[i] for i in features.index[:4]])
    np.testing.assert_allclose(out.hidden, features.hidden[:4], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(out.logits, features.logits[:4], atol=1e-4, rtol=1e-4)


def test_timm_pretrained_weights_come_from_the_hugging_face_cache_by_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache laid out as ``hf download`` leaves it: refs/main names the snapshot."""
    import huggingface_hub.constants
    from safetensors.torch import save_file

    cache, commit = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--timm--test_vit.r160_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    source = timm_backbone(tmp_path, model="test_vit", num_classes=1000, seed=3)
    save_file(source.model.state_dict(), str(repo / "snapshots" / commit / "model.safetensors"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    backbone = timm_backbone(
        tmp_path, model="test_vit.r160_in1k", weights="pretrained", num_classes=None
    )
    weights = backbone.fingerprint()["weights"]
    assert weights == {
        "weights": "pretrained",
        "repo_id": "timm/test_vit.r160_in1k",
        "file": "model.safetensors",
        "commit": commit,
    }
    assert backbone.transform.describe()["input_size"] == [3, 160, 160]  # its pretrained config
    for name, value in source.model.state_dict().items():
        assert torch.equal(backbone.model.state_dict()[name], value), name
