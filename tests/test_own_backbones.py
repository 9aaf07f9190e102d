"""Backbones from your own files and defaults that fit the machine: TorchScript and state-dict
checkpoints with named layers, preprocessing from weights names, ``dtype`` and ``workers``
``"auto"``, the shipped ImageNet pipeline's extract on a CPU, and causal-LM prompts."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from cli_runner import etn
from safetensors.torch import save_file

from etn_cli.backbones.precision import resolve_dtype
from etn_cli.backbones.torchvision_model import Config, TorchvisionBackbone
from etn_cli.planning.pipeline import DataSpec
from etn_cli.planning.units import planned_device

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A seeded ResNet-18 with 5 classes as a state dict and as a TorchScript file."""
    folder = tmp_path_factory.mktemp("own")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()
    save_file(model.state_dict(), str(folder / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(model), str(folder / "model.pt"))
    return model, folder


def outputs(config: Config, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    backbone = TorchvisionBackbone(config, Path("."))
    hidden, logits, _ = backbone.extract_batch(x)
    weights = backbone.classifier()
    return hidden, logits, weights["weight"], weights["bias"], backbone


@pytest.mark.parametrize(
    "options",
    [
        {"model": "resnet18", "checkpoint": "model.safetensors"},
        {"model": "resnet18", "checkpoint": "model.safetensors", "features": "avgpool"},
        {"checkpoint": "model.pt"},
        {"checkpoint": "model.pt", "classifier": "fc"},
    ],
)
def test_own_checkpoints_give_the_models_hidden_state_and_logits(checkpoints, options) -> None:
    model, folder = checkpoints
    x = torch.randn(3, 3, 32, 32)
    options = {k: str(folder / v) if k == "checkpoint" else v for k, v in options.items()}
    hidden, logits, weight, bias, backbone = outputs(Config(**options), x)
    x = backbone.prepare(x)  # extract_batch takes the loader's pixels and normalises them
    with torch.no_grad():
        expected_hidden = torch.nn.Sequential(*list(model.children())[:-1])(x).flatten(1)
        expected_logits = model(x)
    torch.testing.assert_close(hidden, expected_hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden @ weight.T + bias, logits, atol=1e-4, rtol=1e-4)
    assert (backbone.num_classes, backbone.hidden_size) == (5, 512)
    assert backbone.fingerprint()["weights"]["sha256"]


def test_odin_runs_through_a_torchscript_model(checkpoints) -> None:
    _, folder = checkpoints
    config = Config(checkpoint=str(folder / "model.pt"), odin=True)
    _, logits, _, _, backbone = outputs(config, torch.randn(2, 3, 32, 32))
    _, _, extras = backbone.extract_batch(torch.randn(2, 3, 32, 32))
    assert extras["odin"].shape == (2, 5) and torch.isfinite(extras["odin"]).all()


def test_transforms_name_torchvision_weights_whose_preprocessing_is_used() -> None:
    short = TorchvisionBackbone(Config(model="resnet18", weights="none", transforms="DEFAULT"), ".")
    full = Config(model="resnet18", weights="none", transforms="ResNet50_Weights.IMAGENET1K_V2")
    spec = TorchvisionBackbone(full, ".").transform.spec
    assert (short.transform.spec.resize, short.transform.spec.crop) == (256, 224)
    assert (spec.resize, spec.crop) == (232, 224) and "IMAGENET1K_V2" in spec.source
    with pytest.raises(Exception, match="names no torchvision weights"):
        TorchvisionBackbone(Config(model="resnet18", weights="none", transforms="V9"), ".")


def test_auto_is_bfloat16_on_cuda_and_float32_elsewhere() -> None:
    assert resolve_dtype("auto", "cuda:1") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == resolve_dtype("auto", "mps") == "float32"
    assert resolve_dtype("float16", "cpu") == "float16"
    assert planned_device("cuda") == "cuda" and planned_device("cpu") == "cpu"


def test_the_resolved_dtype_keys_the_features(tmp_path: Path) -> None:
    config = Config(model="resnet18", weights="none", num_classes=3)
    on_cpu = TorchvisionBackbone(config, tmp_path, device="cpu").fingerprint()
    on_gpu = TorchvisionBackbone(config, tmp_path, device="cuda").fingerprint()  # not built
    assert on_cpu["dtype"] == "float32" and on_gpu["dtype"] == "bfloat16"
    explicit = Config(model="resnet18", weights="none", num_classes=3, dtype="float32")
    assert TorchvisionBackbone(explicit, tmp_path).fingerprint() == on_cpu


def test_bfloat16_on_a_cpu_runs_under_cpu_autocast_close_to_float32() -> None:
    x = torch.randn(2, 3, 32, 32)
    base = {"model": "resnet18", "weights": "none", "num_classes": 3}
    _, full, *_ = outputs(Config(**base), x)
    _, half, *_ = outputs(Config(**base, dtype="bfloat16"), x)
    assert half.dtype == torch.float32 and not torch.equal(half, full)
    torch.testing.assert_close(half, full, atol=0.1, rtol=0.05)


def test_workers_auto_uses_the_cores_there_and_caps_a_larger_number() -> None:
    cores = len(os.sched_getaffinity(0))
    assert DataSpec(id="x", workers="auto").workers == min(cores, 8)
    assert DataSpec(id="x", workers=cores + 60).workers == cores
    assert DataSpec(id="x").workers == 0


@pytest.mark.slow  # ResNet-50 over FakeData on the CPU: about 15 s
def test_the_imagenet_pipeline_extracts_fakedata_on_a_cpu(tmp_path: Path) -> None:
    """The shipped file as it is (dtype and workers "auto", layers, ODIN), with random weights
    and a few FakeData images standing in for the hub file and ImageNet."""
    settings = [
        "backbone.weights=none",
        "backbone.transforms=IMAGENET1K_V2",
        "data.id=fake",
        'data.ood=["fake:ood"]',
        "data.options={fake={size=4, image_size=40, num_classes=1000}}",
    ]
    sets = [a for s in settings for a in ("--set", s)]
    pipeline = REPO / "pipelines" / "imagenet_resnet50.toml"
    code, output = etn("extract", pipeline, "-d", tmp_path, "--device", "cpu", *sets)
    assert code == 0, output
    from etn_cli.store.reading.reader import read_split

    (split,) = [p for p in tmp_path.glob("features/*/fake.test-*") if p.is_dir()]
    features = read_split(split)
    assert features.hidden.shape == (4, 2048) and features.logits.shape == (4, 1000)
    assert set(features.layers) == {"layer1", "layer2", "layer3", "layer4", "odin"}
    assert features.manifest["fingerprint"]["backbone"]["dtype"] == "float32"
    assert np.isfinite(features.layers["odin"]).all()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llm_fixtures import make_llama

    return make_llama(tmp_path_factory.mktemp("llama"))


def test_a_causal_lm_computes_in_float32_on_a_cpu_unless_told_otherwise(llama, tmp_path) -> None:
    from etn_cli.backbones.hf_lm import CausalLMBackbone
    from etn_cli.backbones.hf_lm import Config as LMConfig
    from etn_cli.datasets import datasets

    split = datasets.get("tiny_mcqa")().load_split("test")
    found = {}
    for dtype in ("auto", "float32", "bfloat16"):
        lm = CausalLMBackbone(LMConfig(model=str(llama), dtype=dtype), tmp_path)
        inputs, _, _ = next(iter(lm.batches(split, 8)))
        found[dtype] = (lm.fingerprint()["dtype"], *lm.extract_batch(inputs)[:2])
    assert found["auto"][0] == "float32" and found["bfloat16"][0] == "bfloat16"
    torch.testing.assert_close(found["auto"][2], found["float32"][2])  # auto is float32 here
    drift = (found["bfloat16"][2] - found["float32"][2]).abs().max()
    scale = found["float32"][2].abs().max()  # the stand-in's logits are a few units
    assert 0 < drift < 0.05 * scale  # bfloat16 runs on the CPU, and moves the logits a little


def test_from_causal_lm_leaves_the_tokenizer_as_it_was(llama: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import etn_cli

    folder = llama
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    before = (tokenizer.pad_token, tokenizer.padding_side, len(tokenizer))
    lm = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    head = etn_cli.make_head("map").fit(np.zeros((4, 32)), np.eye(4), np.arange(4))
    line = "{letter}) {text}"
    model = etn_cli.EvidentialModel.from_causal_lm(lm, tokenizer, head, choice_line=line)
    three = {"question": "What is 1 plus 2?", "choices": ["3", "4", "5"]}
    out = model([three, {"question": "What is 2 plus 2?", "choices": ["3", "4", "5", "6"]}])
    assert (tokenizer.pad_token, tokenizer.padding_side, len(tokenizer)) == before
    assert out.probs.shape == (2, 4) and model.features.prompt(three).count(")") == 3
    assert "A) 3\nB) 4\nC) 5\nAnswer:" in model.features.prompt(three)
