"""The README's "Your own model" examples, run as written on stand-ins.

``examples/standins.py`` writes a random ResNet-18 with PNG folders of FakeData images, a tiny
random Llama with its tokenizer and JSONL questions, and random feature files; the three
pipelines of ``examples/`` then run through the installed entry point in one ``etn run``
(with one seed instead of three, the one change, to keep the suite fast). Each
test checks what a user of that example relies on: every label maps to its class, and the
stored features equal a direct forward pass of the same model computed here independently (a
plain torchvision / transformers forward, prompts written out by hand). The README lists the
example files verbatim; a test keeps them equal.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import etn_process as etn

from etn_cli.store.reading.reader import read_split

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PIPELINES = ("images.toml", "questions.toml", "features.toml")
sys.path.insert(0, str(EXAMPLES))
import standins  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples copied to a folder, its stand-ins written, all three pipelines run."""
    folder = tmp_path_factory.mktemp("examples")
    for name in (*PIPELINES, "images_api.py"):
        shutil.copy(EXAMPLES / name, folder / name)
    standins.main(folder)
    data = folder / "data"
    done = etn("run", *PIPELINES, "-d", data, "--set", "seeds=[0]", "-f", "markdown", cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder / "run.log").write_text(done.stderr)  # the progress lines, read by a test
    return folder


def test_every_unit_line_counts_within_its_total_under_a_name_of_its_own(run: Path) -> None:
    """Per pipeline, ``[k/N]`` goes 1..N exactly, and no two units share a name (the rows
    held out for conformal calibration are not a second ``adapt``)."""
    units = re.findall(r"\[ *(\d+)/(\d+)\] (\w+) +(.+): done in", (run / "run.log").read_text())
    runs: list[list[tuple[int, int, tuple[str, str]]]] = []
    for k, total, stage, name in units:
        if k == "1":
            runs.append([])
        runs[-1].append((int(k), int(total), (stage, name)))
    assert len(runs) == len(PIPELINES)
    for lines in runs:
        total = lines[0][1]
        assert [(k, n) for k, n, _ in lines] == [(k, total) for k in range(1, total + 1)]
        names = [name for *_, name in lines]
        assert len(set(names)) == len(names), names
    held_out = ("extract", "image_folder.adapt (held out for calibration)")
    assert held_out in [name for *_, name in runs[0]]


def split_of(folder: Path, pipeline: str, role: str):
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan

    plan = make_plan(load_pipeline(folder / pipeline), folder / "data")
    unit = plan.ood[0] if role == "ood" else getattr(plan, role)
    return read_split(unit.path), plan


def test_the_readme_lists_every_example_file_verbatim() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Your own model") : readme.index("## Reading the results")]
    for name in PIPELINES:
        assert (EXAMPLES / name).read_text().strip() in section, name
    own_data = (REPO / "docs" / "own-data.md").read_text()
    assert (EXAMPLES / "images_api.py").read_text().strip() in own_data
    for name in PIPELINES:
        assert f"etn run examples/{name}" in section
        toml = (EXAMPLES / name).read_text()
        assert sum(bool(line.strip()) for line in toml.splitlines()) <= 20, name


def test_image_labels_follow_the_class_file_not_the_sorted_folder_names(run: Path) -> None:
    for role in ("adapt", "test"):
        features, _ = split_of(run, "images.toml", role)
        files = sorted((run / "my_images" / role).rglob("*.png"))  # sorted relative paths
        expected = [standins.CLASSES.index(path.parent.name) for path in files]
        rows = np.sort(features.index)  # adapt: less the part [conformal] holds out
        assert features.labels[np.argsort(features.index)].tolist() == [expected[r] for r in rows]
    ood, plan = split_of(run, "images.toml", "ood")
    assert (ood.labels == -1).all() and len(ood.labels) == standins.OOD_IMAGES
    assert plan.id_dataset == "my_images" and [u.name for u in plan.ood] == ["ood"]


def test_predict_names_the_classes_of_the_folders(run: Path) -> None:
    import polars as pl
    from cli_runner import etn as etn_here

    out = run / "predictions.csv"
    args = ("predict", run / "images.toml", run / "my_images/test", "-d", run / "data")
    assert etn_here(*args, "--out", out)[0] == 0
    frame = pl.read_csv(out)
    probabilities = [c for c in frame.columns if c.startswith("prob_")]
    assert probabilities == [f"prob_{name}" for name in standins.CLASSES]
    names = [standins.CLASSES[k] for k in frame["prediction"]]
    assert frame["class"].to_list() == names and frame.height == 12
    code, printed = etn_here(*args, "--out", out, "--sets")  # the conformal sets name them too
    sets = [line.split("\t")[1] for line in printed.splitlines() if "\t" in line]
    members = {name for shown in sets for name in shown.strip("{}").split(", ") if name}
    assert code == 0 and len(sets) == 12 and members and members <= set(standins.CLASSES)
    assert pl.read_csv(out)["prediction_set"].to_list() == sets


def test_stored_image_features_equal_a_plain_torchvision_forward_pass(run: Path) -> None:
    import torchvision
    from PIL import Image
    from safetensors.torch import load_file

    model = torchvision.models.resnet18(num_classes=3).eval()
    model.load_state_dict(load_file(run / "model.safetensors"))
    transform = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.transforms()
    body = torch.nn.Sequential(*list(model.children())[:-1])  # up to avgpool
    features, _ = split_of(run, "images.toml", "test")
    files = sorted((run / "my_images" / "test").rglob("*.png"))
    x = torch.stack([transform(Image.open(files[i]).convert("RGB")) for i in features.index])
    with torch.no_grad():
        hidden = body(x).flatten(1)
        logits = model(x)
    np.testing.assert_allclose(features.hidden, hidden.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(features.logits, logits.numpy(), atol=1e-4, rtol=1e-4)


def questions(run: Path, split: str) -> list[dict]:
    text = (run / "my_questions" / f"{split}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def written_prompt(q: dict) -> str:
    """The prompt of examples/questions.toml, written out by hand."""
    lines = [f"({letter}) {text}" for letter, text in zip("ABCD", q["choices"], strict=False)]
    return "Question: " + q["question"] + "\n" + "\n".join(lines) + "\nAnswer:"


def test_questions_keep_their_answers_and_any_number_of_choices(run: Path) -> None:
    records = questions(run, "test")
    features, _ = split_of(run, "questions.toml", "test")
    assert {len(r["choices"]) for r in records} == {3, 4}
    answers = ["ABCD".index(r["answer"]) for r in records]
    assert features.labels[np.argsort(features.index)].tolist() == answers
    ood, _ = split_of(run, "questions.toml", "ood")
    assert (ood.labels == -1).all()


def test_stored_question_features_equal_the_full_forward_of_the_model(run: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "my_llm")
    lm = AutoModelForCausalLM.from_pretrained(run / "my_llm", dtype=torch.float32).eval()
    records = questions(run, "adapt")
    features, _ = split_of(run, "questions.toml", "adapt")
    order = np.argsort(features.index)
    for row in order[:6]:
        prompt = written_prompt(records[features.index[row]])
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        letters = [tokenizer(prompt + " " + letter)["input_ids"][-1] for letter in "ABCD"]
        with torch.no_grad():
            out = lm(ids, output_hidden_states=True)
        hidden, logits = out.hidden_states[-1][0, -1], out.logits[0, -1, letters]
        np.testing.assert_allclose(features.hidden[row], hidden.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(features.logits[row], logits.numpy(), atol=1e-4, rtol=1e-4)
    manifest = features.manifest
    assert manifest["example_prompt"] == written_prompt(records[0])
    assert list(manifest["answer_tokens"].values()) == letters


def test_status_prints_the_rendered_prompt_and_answer_tokens(run: Path) -> None:
    from cli_runner import etn as etn_here

    code, output = etn_here("status", run / "questions.toml", "-d", run / "data", "--prompt")
    assert code == 0, output
    assert written_prompt(questions(run, "adapt")[0]) in output
    assert "answer tokens: A = " in output and "from the manifest" in output


def test_imported_features_equal_the_files_and_the_given_classifier_is_used(run: Path) -> None:
    given = np.load(run / "my_features" / "classifier.npz")
    for role, name in (("adapt", "adapt"), ("test", "test")):
        features, plan = split_of(run, "features.toml", role)
        arrays = np.load(run / "my_features" / f"{name}.npz")
        np.testing.assert_array_equal(features.hidden, arrays["hidden"])
        np.testing.assert_array_equal(features.labels, arrays["labels"])
        expected = arrays["hidden"] @ given["weight"].T + given["bias"]  # the "model"
        np.testing.assert_allclose(features.logits, expected, atol=1e-5)
    record = json.loads(next(run.glob("data/heads/map_edl-*/train.json")).read_text())
    assert record["classifier"]["kind"] == "given"
    assert record["classifier"]["file"].endswith("classifier.npz")
    assert plan.classifier_source["sha256"] == record["classifier"]["sha256"]


def test_the_python_example_gives_the_pipelines_features(run, monkeypatch, capsys) -> None:
    import runpy

    import torchvision
    from safetensors.torch import load_file

    import etn_cli

    monkeypatch.chdir(run)  # the example reads its files from where it runs
    runpy.run_path(str(run / "images_api.py"), run_name="__main__")
    assert "OOD AUROC by uncertainty mass: 0." in capsys.readouterr().out
    model = torchvision.models.resnet18(num_classes=3).eval()
    model.load_state_dict(load_file(run / "model.safetensors"))
    transform = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.transforms()
    images = etn_cli.ImageFolder(run / "my_images/adapt", classes=run / "my_images/classes.txt")
    assert images.classes == standins.CLASSES
    stored, _ = split_of(run, "images.toml", "adapt")  # less the part [conformal] holds out
    at = [int(np.flatnonzero(stored.labels == k)[0]) for k in (1, 0, 2)]  # one of each class
    rows = stored.index[at].tolist()  # their positions among the folder's images
    few = torch.utils.data.Subset(images, rows)
    hidden, logits, labels = etn_cli.image_features(model, few, transform, batch_size=2)
    np.testing.assert_allclose(hidden, stored.hidden[at], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(logits, stored.logits[at], atol=1e-4, rtol=1e-4)
    assert labels.tolist() == stored.labels[at].tolist() == [1, 0, 2]  # cat, dog, fox
