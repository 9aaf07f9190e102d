"""Bad inputs of your own model and data: image folders, image lists, question files, feature
files, checkpoints and prompt settings.

As in ``test_bad_inputs.py``, each case runs one ``etn`` command through the real entry point
and checks that the message is one line on stderr naming what was expected, what was found and
the file, that the exit status is 2, and that the data directory is unchanged (lock files
included): every split's inputs are checked, and the model is loaded, before any is written.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tiny_pipeline as tiny
import torch
from llm_fixtures import make_llama, write_jsonl
from PIL import Image
from test_bad_inputs import Case, check_case, etn

GOOD_TREE = {"adapt": {"a": 2, "b": 2, "c": 2}, "test": {"a": 2, "b": 2, "c": 2}, "ood": 3}


def write_images(folder: Path, count: int, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i}.png")


def image_tree(root: Path, tree: dict) -> None:
    """``{"adapt": {"a": 2, ...}, "ood": 3}``: class folders with counts, or flat folders."""
    for split, content in tree.items():
        if isinstance(content, int):
            write_images(root / split, content)
        else:
            for name, count in content.items():
                write_images(root / split / name, count, seed=count)


def vision(tmp: Path, tree: dict | None = None, backbone: dict = {}, data: dict = {}) -> Path:  # noqa: B006
    image_tree(tmp / "images", GOOD_TREE if tree is None else tree)
    path = tmp / "vision.toml"
    data = tiny.image_folder(adapt=None, test=None, ood=["image_folder:ood"]) | data
    path.write_text(tiny.tiny_pipeline("mine", backbone=tiny.resnet18(3, **backbone), data=data))
    return path


def unreadable_image(split: str) -> Callable[[Path, pytest.FixtureRequest], Path]:
    """A file that is no image among ``split``'s class-b images: found before any split (the
    adapt split is extracted first) is written."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> Path:
        path = vision(tmp)
        (tmp / "images" / split / "b" / "broken.png").write_bytes(b"not a png at all")
        return path

    return setup


def image_list(lines: str) -> Callable[[Path, pytest.FixtureRequest], Path]:
    def setup(tmp: Path, request: pytest.FixtureRequest) -> Path:
        path = vision(tmp, data={"adapt": "adapt.txt"})
        (tmp / "images" / "adapt.txt").write_text(lines)
        return path

    return setup


def torchscript_with_features(tmp: Path, request: pytest.FixtureRequest) -> Path:
    import torchvision

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, not removed
        model = torch.jit.script(torchvision.models.resnet18(num_classes=3).eval())
        torch.jit.save(model, str(tmp / "model.ts"))
    return vision(tmp, backbone={"checkpoint": "model.ts", "features": "avgpool"})


def question(i: int, choices: int = 4, answer: bool = True) -> dict:
    record = {"question": f"What is {i} plus 1?", "choices": [str(i + k) for k in range(choices)]}
    return record | ({"answer": i % choices} if answer else {})


def questions(
    adapt: list[dict] | None = None, backbone: dict | None = None, test_lines: str | None = None
) -> Callable:
    """A fresh data directory and question files: ``adapt`` as records, ``test_lines`` (if
    given) as the raw text of test.jsonl."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> Path:
        llama = request.getfixturevalue("llama")
        write_jsonl(tmp / "questions" / "adapt.jsonl", adapt or [question(i) for i in range(6)])
        write_jsonl(tmp / "questions" / "test.jsonl", [question(i) for i in range(6)])
        if test_lines is not None:
            (tmp / "questions" / "test.jsonl").write_text(test_lines)
        path = tmp / "questions.toml"
        lm = tiny.causal_lm(llama, **(backbone or {}))
        path.write_text(tiny.tiny_pipeline("questions", backbone=lm, data=tiny.questions()))
        return path

    return setup


def feature_files(tmp: Path, classifier: str = "", heads: str = "", **changes: dict) -> Path:
    """adapt / test / ood .npz files of a linear "model", each with ``changes[name]``."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(3, 8)).astype(np.float32)
    (tmp / "mine").mkdir(exist_ok=True)
    for name in ("adapt", "test", "ood"):
        labels = rng.integers(0, 3, 30)
        hidden = (np.eye(3, 8)[labels] * 3 + rng.normal(size=(30, 8))).astype(np.float32)
        arrays = {"hidden": hidden, "logits": hidden @ weight.T, "labels": labels}
        arrays |= changes.get(name, {})
        np.savez(tmp / "mine" / f"{name}.npz", **{k: v for k, v in arrays.items() if v is not None})
    path = tmp / "features.toml"
    path.write_text(
        'name = "feats"\nseeds = [0]\n[features]\nadapt = "mine/adapt.npz"\n'
        f'test = "mine/test.npz"\nood = ["mine/ood.npz"]\n{classifier}\n'
        f'[[heads]]\nname = "map"\n{heads}'
    )
    return path


def wrong_classifier(tmp: Path) -> Path:
    path = feature_files(tmp, 'classifier = "mine/classifier.npz"', '[[heads]]\nname = "laplace"\n')
    np.savez(tmp / "mine" / "classifier.npz", weight=np.ones((3, 5)), bias=np.ones(3))
    return path


def imported_first(make: Callable[[Path], Path]) -> Callable:
    """Feature files imported by a good ``etn extract`` first, so ``etn train`` is the bad
    command and must write nothing."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> Path:
        path = make(tmp)
        capsys = request.getfixturevalue("capsys")
        assert etn(capsys, "extract", path, "--data-dir", tmp / "data")[0] == 0
        return path

    return setup


CASES: dict[str, Case] = {
    # image folders
    "fewer class folders than the model's outputs": Case(
        "extract",
        lambda tmp, r: vision(tmp, {**GOOD_TREE, "adapt": {"a": 2, "b": 2}}),
        ("images/adapt", "has 2 classes (a, b)", "3 outputs", "one class per output"),
    ),
    "adapt and test with different classes": Case(
        "extract",
        lambda tmp, r: vision(tmp, {**GOOD_TREE, "test": {"a": 2, "b": 2, "d": 2}}),
        ("has the classes a, b, c", "test split", "has a, b, d", "same classes"),
    ),
    "an empty class folder": Case(
        "extract",
        lambda tmp, r: vision(tmp, {**GOOD_TREE, "test": {"a": 2, "b": 2, "c": 0}}),
        ("Class folder", "test/c holds no images", "Add images or remove the folder"),
    ),
    "an OOD folder without images": Case(
        "extract",
        lambda tmp, r: vision(tmp, {**GOOD_TREE, "ood": 0}),
        ("images/ood holds no images", "searched recursively"),
    ),
    "an unreadable image": Case(
        "extract",
        unreadable_image("adapt"),
        ("Cannot read image", "adapt/b/broken.png (UnidentifiedImageError: not an image", "Remove"),
    ),
    "an unreadable image in the test split": Case(
        "extract",
        unreadable_image("test"),
        ("Cannot read image", "test/b/broken.png (UnidentifiedImageError", "Remove or replace"),
    ),
    "a sub-folder that is not a class": Case(
        "extract",
        lambda tmp, r: vision(
            tmp,
            {**GOOD_TREE, "test": {"a": 2, "b": 2, "c": 2, "zebra": 1}},
            data={"options": {"image_folder": {"classes": ["a", "b", "c"]}}},
        ),
        ("test has sub-folders that are not among the 3 classes: zebra", "add them to classes"),
    ),
    "an unlabelled adaptation folder": Case(
        "extract",
        lambda tmp, r: vision(tmp, {**GOOD_TREE, "adapt": 6}),
        ("The adapt split", "images/adapt) has no labels", "belongs in ood"),
    ),
    "a split folder that does not exist": Case(
        "extract",
        lambda tmp, r: vision(tmp, data={"adapt": "adpt"}),
        ("has no split 'adpt'", "Did you mean 'adapt'?", "Available: adapt, ood, test"),
    ),
    "a class file that does not exist": Case(
        "extract",
        lambda tmp, r: vision(tmp, data={"options": {"image_folder": {"classes": "names.txt"}}}),
        ('classes = "names.txt" names no file', "one class name per line"),
    ),
    "an image list naming a missing image": Case(
        "extract",
        image_list("adapt/a/img0.png 0\nadapt/a/gone.png 1\n"),
        ("adapt.txt:2 names 'adapt/a/gone.png'", "does not exist"),
    ),
    "an image list with labels on some lines only": Case(
        "extract",
        image_list("adapt/a/img0.png 0\nadapt/b/img0.png\n"),
        ("gives labels on some lines but not on entry 2", "-1 for an unlabelled image"),
    ),
    # your own checkpoint
    "a checkpoint that does not exist": Case(
        "extract",
        lambda tmp, r: vision(tmp, backbone={"checkpoint": "mine.safetensors"}),
        ("checkpoint = 'mine.safetensors': no such file", "relative to the pipeline file"),
    ),
    "features with a TorchScript model": Case(
        "extract", torchscript_with_features, ("features need forward hooks", "TorchScript")
    ),
    "features that are not the classifier's input": Case(
        "extract",
        lambda tmp, r: vision(tmp, backbone={"features": "layer3"}),
        ("features = 'layer3' outputs", "not the input of the classifier 'fc'"),
    ),
    # question files and prompts
    "more choices than letters": Case(
        "extract",
        questions([question(i, choices=5 if i == 3 else 4) for i in range(6)]),
        ("adapt.jsonl) has questions with 5 choices", "4 answer letters", "Set letters = ["),
    ),
    "an answer missing from some questions": Case(
        "extract",
        questions([question(i, answer=i != 2) for i in range(6)]),
        ("adapt.jsonl:3: no 'answer'", "in every record"),
    ),
    "a line that is not JSON": Case(
        "extract",
        questions(test_lines=json.dumps(question(0)) + "\n{'question': 'single quotes'}\n"),
        ("test.jsonl:2 is not valid JSON", "expected one JSON object per line"),
    ),
    "a choice line without the choice text": Case(
        "extract",
        questions(backbone={"choice_line": "{letter})"}),
        ("choice_line = '{letter})' must be a format string", "{letter} and {text}"),
    ),
    # feature files
    "a feature file with an unknown array": Case(
        "extract",
        lambda tmp, r: feature_files(tmp, test={"embeddings": np.zeros((30, 4))}),
        ("test.npz holds", "unknown: ['embeddings']", "Features you computed yourself"),
    ),
    "an adaptation file without labels": Case(
        "extract",
        lambda tmp, r: feature_files(tmp, adapt={"labels": None}),
        ("adapt.npz has no 'labels' array", "adapt split", "only OOD splits"),
    ),
    "NaN in a feature file": Case(
        "extract",
        lambda tmp, r: feature_files(tmp, ood={"logits": np.full((30, 3), np.nan, np.float32)}),
        ("logits in", "ood.npz holds 90 non-finite values", "float32"),
    ),
    "feature files of different widths": Case(
        "extract",
        lambda tmp, r: feature_files(tmp, ood={"hidden": np.zeros((30, 5), np.float32)}),
        ("ood.npz has hidden size 5", "expected features of one model"),
    ),
    "a classifier of the wrong shape": Case(
        "train",
        imported_first(wrong_classifier),
        ("classifier.npz has weight (3, 5)", "hidden size 8", "expected weight (3, 8)"),
    ),
    "dmm without stored layers": Case(
        "train",
        imported_first(lambda tmp: feature_files(tmp, heads='[[heads]]\nname = "dmm"\n')),
        ("DMM read pooled intermediate layers", "have none", "layers/<name>"),
    ),
}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("name", list(CASES))
def test_own_data_bad_input_is_one_line_exit_2_and_writes_nothing(
    name: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture
) -> None:
    check_case(CASES[name], tmp_path, request, capsys)


def test_etn_import_of_a_bad_file_writes_no_folder(tmp_path, capsys) -> None:
    feature_files(tmp_path, ood={"labels": np.arange(29)})
    files = [tmp_path / "mine" / f"{name}.npz" for name in ("adapt", "test", "ood")]
    code, err = etn(capsys, "import", *files, "--out", tmp_path / "out")
    assert code == 2 and "labels in" in err and "expected 30 integers" in err, err
    assert not (tmp_path / "out").exists()


def test_etn_import_writes_split_folders_and_the_classifier(tmp_path, capsys) -> None:
    from etn_cli.store.artefacts.classifier import load_classifier
    from etn_cli.store.reading.reader import read_split

    feature_files(tmp_path, adapt={"weight": np.eye(3, 8, dtype=np.float32)})
    files = [tmp_path / "mine" / f"{name}.npz" for name in ("adapt", "test", "ood")]
    assert etn(capsys, "import", *files, "--out", tmp_path / "out")[0] == 0
    for name in ("adapt", "test", "ood"):
        split = read_split(tmp_path / "out" / name)
        arrays = np.load(files[("adapt", "test", "ood").index(name)])
        np.testing.assert_array_equal(split.hidden, arrays["hidden"])
        assert split.manifest["imported_from"]["file"] == f"{name}.npz"
    weight, bias = load_classifier(tmp_path / "out" / "classifier.safetensors")
    np.testing.assert_array_equal(weight, np.eye(3, 8))
    np.testing.assert_array_equal(bias, np.zeros(3))
    assert json.loads((tmp_path / "out" / "adapt" / "manifest.json").read_text())["rows"] == 30


def test_etn_import_into_an_existing_file_is_one_line(tmp_path, capsys) -> None:
    feature_files(tmp_path)
    (tmp_path / "taken").write_text("mine")
    files = [tmp_path / "mine" / f"{name}.npz" for name in ("adapt", "test", "ood")]
    code, err = etn(capsys, "import", *files, "--out", tmp_path / "taken")
    assert code == 2 and err.count("\n") == 1 and "--out" in err and "is a file" in err, err
    assert (tmp_path / "taken").read_text() == "mine"


def test_a_killed_etn_import_resumes_on_the_next_run(tmp_path, capsys) -> None:
    """A kill after the first split: that folder is whole, the second one's private folder is
    left half written. The rerun keeps the first, removes the leftover and imports the rest."""
    from etn_cli.stages import import_files as importer

    feature_files(tmp_path)
    files = [tmp_path / "mine" / f"{name}.npz" for name in ("adapt", "test", "ood")]
    out = tmp_path / "out"
    real = importer.write_split

    def killed_at_the_second(features, target):
        if target.name == "test":
            (target.parent / "test.partial-0badf00d").mkdir()  # what a kill leaves
            raise KeyboardInterrupt
        real(features, target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importer, "write_split", killed_at_the_second)
        assert etn(capsys, "import", *files, "--out", out)[0] == 130
    first = (out / "adapt" / "manifest.json").stat().st_mtime_ns
    code, err = etn(capsys, "import", *files, "--out", out)
    assert code == 0, err
    assert (out / "adapt" / "manifest.json").stat().st_mtime_ns == first  # kept, not redone
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["adapt", "ood", "test"]
    code, err = etn(capsys, "import", *files, "--out", out)  # everything up to date
    assert code == 0 and "Traceback" not in err
