"""Stand-ins for your own files, so that the README's "Your own model" examples run anywhere.

    python examples/standins.py          # writes them next to the example pipelines
    python examples/standins.py DIR      # or into DIR (an installed etn: see `etn ls examples`)
    etn run examples/images.toml         # then each example as written
    etn run examples/questions.toml
    etn run examples/features.toml
    etn run examples/timm.toml
    etn run examples/hf_image.toml

What it writes (each a random model or random data, nothing downloaded):

* ``model.safetensors``: a randomly initialised torchvision ResNet-18 with 3 outputs, and
  ``my_images/``: ``adapt/`` and ``test/`` with one folder per class (``dog``, ``cat``,
  ``fox``; ``classes.txt`` gives the model's output order, which is not the sorted one) and
  an unlabelled ``ood/`` folder, all PNG files of torchvision's ``FakeData``;
* ``my_llm/``: a 2-layer Llama with random weights and a word-level tokenizer (the test
  suite's stand-in, ``tests/llm_fixtures.py``) that has the answer letters A to J as single
  tokens, so questions of your own with up to 10 choices run (set ``letters`` to as many), and
  ``my_questions/``: ``adapt.jsonl`` and
  ``test.jsonl`` (sums of two digits, three or four choices each) and ``other.jsonl``
  (another task, no answers);
* ``my_features/``: ``adapt.npz``, ``test.npz``, ``ood.npz`` from a random linear "model"
  whose ``weight`` and ``bias`` are in ``classifier.npz``;
* ``timm_model.safetensors``: timm's ``test_vit`` (a 6-block ViT made for timm's own tests)
  at a 32 x 32 input with 3 outputs, random weights;
* ``my_vit/``: a 2-layer Hugging Face ``ViTForImageClassification`` (32 x 32 input, 3 classes,
  random weights) with its ``ViTImageProcessor``, as ``save_pretrained`` writes them.

Replace them with your own files and the pipelines stay as they are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CLASSES = ("dog", "cat", "fox")  # the model's output order; sorted would be cat, dog, fox
IMAGES_PER_CLASS = {"adapt": 4, "test": 4}
OOD_IMAGES = 6


def write_images(folder: Path, seed: int = 0) -> Path:
    """``folder/my_images`` (PNG files of FakeData) and ``folder/model.safetensors``."""
    import torch
    import torchvision
    from safetensors.torch import save_file
    from torchvision.datasets import FakeData

    root = folder / "my_images"
    offset = seed * 1000
    for split, count in IMAGES_PER_CLASS.items():
        for name in CLASSES:
            images = FakeData(count, (3, 64, 64), len(CLASSES), random_offset=offset)
            offset += count
            save_pngs(images, root / split / name, f"{name}-")
    save_pngs(FakeData(OOD_IMAGES, (3, 48, 80), 1, random_offset=offset), root / "ood", "ood-")
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torchvision.models.resnet18(num_classes=len(CLASSES)).eval()
    save_file(model.state_dict(), str(folder / "model.safetensors"))
    return root


def save_pngs(images: object, folder: Path, prefix: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(len(images)):  # type: ignore[arg-type]
        image, _ = images[i]  # type: ignore[index]
        image.save(folder / f"{prefix}{i:03d}.png")


def write_questions(folder: Path) -> Path:
    """``folder/my_questions``: JSONL files in the README's multiple-choice schema."""
    from etn_cli.datasets import datasets

    root = folder / "my_questions"
    root.mkdir(parents=True, exist_ok=True)
    for name, (dataset, split) in {
        "adapt.jsonl": ("tiny_mcqa", "validation"),
        "test.jsonl": ("tiny_mcqa", "test"),
        "other.jsonl": ("tiny_mcqa_ood", "test"),
    }.items():
        questions = datasets.get(dataset)().load_split(split).data.questions
        records = [record(q, i, answered=name != "other.jsonl") for i, q in enumerate(questions)]
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def record(question: object, i: int, answered: bool) -> dict:
    """A question as a JSONL record; every third one loses a wrong choice (three choices)."""
    choices = list(question.choices)  # type: ignore[attr-defined]
    answer = question.answer  # type: ignore[attr-defined]
    if i % 3 == 0:
        drop = next(k for k in range(len(choices) - 1, -1, -1) if k != answer)
        del choices[drop]
        answer -= drop < answer
    entry = {"id": f"q{i}", "question": question.question, "choices": choices}  # type: ignore
    return entry | ({"answer": "ABCD"[answer]} if answered else {})


def write_llm(folder: Path) -> Path:
    """``folder/my_llm``: the test suite's tiny random Llama with its local tokenizer."""
    tests = HERE.parents[1] / "tests"  # etn_cli/examples/ -> the clone's tests/
    if not (tests / "llm_fixtures.py").is_file():
        raise SystemExit(
            "my_llm is the test suite's tiny Llama (tests/llm_fixtures.py), which a clone of etn "
            "has and an installed etn does not; set model in questions.toml to your own model."
        )
    sys.path.insert(0, str(tests))
    from llm_fixtures import make_llama

    return make_llama(folder / "my_llm")


def write_features(folder: Path, seed: int = 0) -> Path:
    """``folder/my_features``: three splits of a random linear "model" and its classifier."""
    rng = np.random.default_rng(seed)
    c, d = 4, 16
    means = rng.normal(scale=1.5, size=(c, d))  # (C, D)
    weight, bias = means + 0.3 * rng.normal(size=(c, d)), rng.normal(size=c)  # (C, D), (C,)
    root = folder / "my_features"
    root.mkdir(parents=True, exist_ok=True)
    for name, n in (("adapt", 200), ("test", 300), ("ood", 200)):
        labels = rng.integers(0, c, n)  # (N,)
        centre = means[labels] if name != "ood" else rng.normal(scale=3.0, size=(n, d))
        hidden = (centre + rng.normal(size=(n, d))).astype(np.float32)  # (N, D)
        logits = (hidden @ weight.T + bias).astype(np.float32)  # (N, C)
        arrays = {"hidden": hidden, "logits": logits}
        np.savez(root / f"{name}.npz", **arrays, **({"labels": labels} if name != "ood" else {}))
    classifier = {"weight": weight.astype(np.float32), "bias": bias.astype(np.float32)}
    np.savez(root / "classifier.npz", **classifier)
    return root


TIMM_MODEL, TIMM_SIZE = "test_vit", 32


def write_timm(folder: Path, seed: int = 0) -> Path:
    """``folder/timm_model.safetensors``: a random timm ``test_vit`` for ``CLASSES``."""
    import timm
    import torch
    from safetensors.torch import save_file

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = timm.create_model(TIMM_MODEL, num_classes=len(CLASSES), img_size=TIMM_SIZE)
    path = folder / "timm_model.safetensors"
    save_file(model.state_dict(), str(path))
    return path


def write_hf_image(folder: Path, seed: int = 0) -> Path:
    """``folder/my_vit``: a tiny random ViT image classifier with its image processor."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        id2label=dict(enumerate(CLASSES)),
        label2id={name: i for i, name in enumerate(CLASSES)},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ViTForImageClassification(config).eval()
    root = folder / "my_vit"
    model.save_pretrained(root)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(root)
    return root


def main(folder: Path = HERE) -> None:
    # my_llm last: it needs a clone's tests/llm_fixtures.py
    makers = (write_images, write_questions, write_features, write_timm, write_hf_image, write_llm)
    for make in makers:
        print(f"wrote {make(folder)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
