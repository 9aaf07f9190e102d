"""The Python API (arrays, load_head, EvidentialModel) and ``etn predict``, offline on the CPU:
tiny pipelines over the digits CNN, a randomly initialised resnet18 on FakeData and a tiny
Llama, each run once per module in ``tmp_path``."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from cli_runner import etn
from sklearn.metrics import average_precision_score
from tiny_pipeline import (
    BOTH_OOD,
    SMALL_ETN,
    TINY_MCQA,
    causal_lm,
    fake_data,
    resnet18,
    tiny_pipeline,
)

import etn_cli
from etn_cli.errors import EtnError
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.plan import make_plan, open_source
from etn_cli.store.reading.reader import read_split


def digits_text(etn_epochs: int) -> str:
    return tiny_pipeline(
        backbone={"epochs": 3, "layers": ["features.1"], "odin": True}, data={"ood": BOTH_OOD},
        heads=({"name": "etn", "epochs": etn_epochs, "batch_size": 64}, "map", "mahalanobis",
               "odin", {"name": "dmm", "epochs": 2}),
    )  # fmt: skip


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def files_of(data: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file() and p.suffix != ".lock"}


def metric(folder: Path, head: str, eval_set: str, name: str, score: str | None) -> float:
    frame = pl.read_parquet(next(folder.glob(f"{head}-*.parquet")))
    scored = pl.col("score").is_null() if score is None else pl.col("score") == score
    row = frame.filter((pl.col("eval_set") == eval_set) & (pl.col("metric") == name) & scored)
    return row["value"].item()


def assert_rows_match(frame: pl.DataFrame, prediction, letters=None, atol: float = 0.0) -> None:
    """Every probability and score column of ``frame`` equals ``prediction`` row by row."""
    names = letters or [str(k) for k in range(prediction.probs.shape[1])]
    assert frame["prediction"].to_list() == prediction.predictions.tolist()
    probs = np.stack([frame[f"prob_{n}"].to_numpy() for n in names], axis=1)
    np.testing.assert_allclose(probs, prediction.probs, rtol=1e-6, atol=atol)
    for name, values in prediction.scores.items():
        np.testing.assert_allclose(frame[name].to_numpy(), values, rtol=1e-6, atol=atol)


# ------------------------------------------------------------------------- digits
@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("digits")
    pipeline = write(root, "tiny", digits_text(2))
    code, output = etn("run", pipeline, "--data-dir", root / "data")
    assert code == 0, output
    plan = make_plan(load_pipeline(pipeline), root / "data")
    return pipeline, root / "data", plan


def test_array_api_fits_the_same_head_as_the_cli_on_the_cached_features(digits) -> None:
    pipeline, data, plan = digits
    adapt, test = read_split(plan.adapt.path), read_split(plan.test.path)
    mine = etn_cli.ETN(epochs=2, batch_size=64, seed=0).fit(
        adapt.hidden, adapt.logits, adapt.labels
    )
    ours = mine.predict(torch.from_numpy(test.hidden), torch.from_numpy(test.logits))  # tensors in
    cli = etn_cli.load_head(pipeline=pipeline, head="etn", seed=0, data_dir=data)
    theirs = cli.predict(test.hidden, test.logits)  # numpy in
    assert isinstance(ours.probs, np.ndarray) and isinstance(ours.scores["mi"], np.ndarray)
    np.testing.assert_allclose(ours.probs, theirs.probs, rtol=1e-6)
    for name in ("mp", "um", "mi", "de"):
        np.testing.assert_allclose(ours.scores[name], theirs.scores[name], rtol=1e-6)
    # the evaluation's numbers, recomputed independently from the API's predictions
    correct = ours.predictions == test.labels
    folder = data / "metrics" / "tiny"
    assert correct.mean() == pytest.approx(metric(folder, "etn", "digits", "acc", None))
    aupr = average_precision_score(correct, ours.scores["mp"])
    assert aupr == pytest.approx(metric(folder, "etn", "digits", "aupr", "mp"), abs=1e-9)
    made = etn_cli.make_head("etn", epochs=2, batch_size=64)
    assert made.config == mine.config and isinstance(made, etn_cli.ETN)


def test_load_head_by_folder_name_and_pipeline_give_the_same_head(digits) -> None:
    pipeline, data, plan = digits
    unit = next(u for u in plan.heads if u.head.name == "etn")
    test = read_split(plan.test.path)
    loaded = [
        etn_cli.load_head(unit.path),
        etn_cli.load_head(unit.path.name, data_dir=data),
        etn_cli.load_head(unit.path.name[:8], data_dir=data),  # a unique prefix of the key
        etn_cli.load_head("etn", data_dir=data),  # the only trained ETN head there
        etn_cli.load_head(pipeline=pipeline, head="ETN", data_dir=data),  # the report's label
    ]
    first = loaded[0].predict(test.hidden, test.logits).probs
    for head in loaded[1:]:
        np.testing.assert_array_equal(head.predict(test.hidden, test.logits).probs, first)


def test_loading_a_head_never_unpickles(digits, monkeypatch) -> None:
    _, data, _ = digits

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling")

    for module, name in ((pickle, "load"), (pickle, "loads"), (torch, "load")):
        monkeypatch.setattr(module, name, refuse)
    for name in ("etn", "map", "mahalanobis", "odin", "dmm"):
        assert etn_cli.load_head(name, data_dir=data).n_classes_ == 7


def test_load_head_explains_missing_ambiguous_and_untrained_heads(digits, tmp_path) -> None:
    pipeline, data, plan = digits
    with pytest.raises(EtnError, match=r"no head 'etm'\. Did you mean: etn"):
        etn_cli.load_head(pipeline=pipeline, head="etm", data_dir=data)
    with pytest.raises(EtnError, match=r"has seeds \[0\], not 3"):
        etn_cli.load_head(pipeline=pipeline, head="etn", seed=3, data_dir=data)
    untrained = write(tmp_path, "tiny", digits_text(5))
    with pytest.raises(EtnError, match=r"is not trained.*Run `etn train"):
        etn_cli.load_head(pipeline=untrained, head="etn", data_dir=data)
    twice = digits_text(2) + '[[heads]]\nname = "etn"\nepochs = 3\n'
    with pytest.raises(EtnError, match=r"'etn' is ambiguous.*ETN.*Pass one of these"):
        etn_cli.load_head(pipeline=write(tmp_path, "twice", twice), head="etn", data_dir=data)
    unit = next(u for u in plan.heads if u.head.name == "etn")
    for name in ("etn-aaaa", "etn-bbbb"):
        shutil.copytree(unit.path, tmp_path / "d" / "heads" / name)
    with pytest.raises(EtnError, match="'etn' is ambiguous.*etn-aaaa, etn-bbbb"):
        etn_cli.load_head("etn", data_dir=tmp_path / "d")
    assert etn_cli.load_head("etn-b", data_dir=tmp_path / "d").name == "etn"
    with pytest.raises(EtnError, match=r"no trained head 'mpa'.*available: etn-aaaa, etn-bbbb"):
        etn_cli.load_head("mpa", data_dir=tmp_path / "d")
    (tmp_path / "d" / "heads" / "etn-aaaa" / "head.json").write_text("{not json")
    with pytest.raises(EtnError, match="head.json has sha256 .* the file changed or is corrupt"):
        etn_cli.load_head("etn-aaaa", data_dir=tmp_path / "d")  # checked against train.json
    (tmp_path / "d" / "heads" / "etn-aaaa" / "train.json").unlink()  # a folder Head.save wrote
    with pytest.raises(EtnError, match="is damaged"):
        etn_cli.load_head(tmp_path / "d" / "heads" / "etn-aaaa")
    with pytest.raises(EtnError, match=r"not a trained head folder \(head.json and weights"):
        etn_cli.read_head(tmp_path)


@pytest.mark.parametrize("head", ["etn", "map", "mahalanobis", "odin", "dmm"])
def test_predict_on_the_test_split_reproduces_the_cached_predictions(digits, tmp_path, head):
    """Every head, including those reading pooled layers (dmm) and ODIN's perturbed logits."""
    pipeline, data, plan = digits
    out = tmp_path / "preds.parquet"
    code, output = etn("predict", pipeline, "digits:test", "--head", head, "-d", data, "-o", out)
    assert code == 0 and f"316 rows written to {out}" in output, output
    frame = pl.read_parquet(out)
    test = read_split(plan.test.path)
    expected = etn_cli.load_head(pipeline=pipeline, head=head, data_dir=data).predict(
        test.hidden, test.logits, layers=test.layers
    )
    assert frame["index"].to_list() == test.index.tolist()
    assert frame["label"].to_list() == test.labels.tolist()
    assert frame["input"][0] == f"digits:test#{test.index[0]}"
    assert_rows_match(frame, expected)
    chosen = expected.probs[np.arange(len(test)), expected.predictions]
    np.testing.assert_allclose(frame["probability"].to_numpy(), chosen, rtol=1e-6)


def test_predict_outputs_reproduce_the_evaluated_aupr(digits, tmp_path) -> None:
    pipeline, data, _ = digits
    frames = {}
    for split in ("digits:test", "digits_unseen"):  # a bare name means its test split
        out = tmp_path / f"{split.replace(':', '-')}.parquet"
        assert etn("predict", pipeline, split, "-d", data, "-o", out)[0] == 0
        frames[split] = pl.read_parquet(out)
    folder = data / "metrics" / "tiny"
    test, ood = frames["digits:test"], frames["digits_unseen"]
    correct = (test["prediction"] == test["label"]).to_numpy()
    for score in ("mp", "um"):
        aupr = average_precision_score(correct, test[score].to_numpy())
        assert aupr == pytest.approx(metric(folder, "etn", "digits", "aupr", score), abs=1e-9)
    is_id = np.r_[np.ones(len(test)), np.zeros(len(ood))]
    for score, sign in (("mp", 1.0), ("mi", -1.0), ("de", -1.0)):
        values = sign * np.r_[test[score].to_numpy(), ood[score].to_numpy()]
        expected = metric(folder, "etn", "digits_unseen", "aupr", score)
        assert average_precision_score(is_id, values) == pytest.approx(expected, abs=1e-9)


def test_thresholds_flag_rows_below_mp_and_above_mi(digits, tmp_path) -> None:
    pipeline, data, plan = digits
    test = read_split(plan.test.path)
    scores = etn_cli.load_head("etn", data_dir=data).predict(test.hidden, test.logits).scores
    mp, mi = np.quantile(scores["mp"], 0.3), np.quantile(scores["mi"], 0.8)
    out = tmp_path / "flags.csv"
    args = ("--threshold", f"mp={mp}", "--threshold", f"mi={mi}", "-d", data, "-o", out)
    code, output = etn("predict", pipeline, "digits:test", *args)
    frame = pl.read_csv(out)
    low_mp, high_mi = scores["mp"] < mp, scores["mi"] > mi
    assert frame["flagged_mp"].to_list() == low_mp.tolist() and 0 < low_mp.sum() < len(test)
    assert frame["flagged_mi"].to_list() == high_mi.tolist() and 0 < high_mi.sum() < len(test)
    assert frame["flagged"].to_list() == (low_mp | high_mi).tolist()
    assert code == 0 and f"{(low_mp | high_mi).sum()} flagged" in output


@pytest.mark.parametrize(("spec", "score", "share"), [("mp@95", "mp", 0.95), ("mi@90%", "mi", 0.9)])
def test_a_threshold_chosen_on_the_adaptation_split_keeps_that_share_of_its_rows(
    digits, tmp_path, spec, score, share
) -> None:
    """``--threshold mp@95`` is the score value that keeps 95% of the adaptation split's (ID)
    rows, the way OpenOOD reads FPR95: no stricter value the scores take keeps as many; mi,
    where higher means OOD, keeps the rows at or below it. It is said and written down."""
    pipeline, data, plan = digits
    out = tmp_path / "flags.csv"
    args = ("predict", pipeline, "digits:test", "--threshold", spec, "-d", data, "-o", out)
    done = subprocess.run([sys.executable, "-m", "etn_cli", *map(str, args)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    frame = pl.read_csv(out)
    (value,) = frame[f"threshold_{score}"].unique()  # recorded on every row
    head = etn_cli.load_head("etn", data_dir=data)
    adapt = read_split(plan.adapt.path)
    ours = head.predict(adapt.hidden, adapt.logits).scores[score]
    kept, stricter = (
        (ours >= value, ours > value) if score == "mp" else (ours <= value, ours < value)
    )
    assert kept.mean() >= share > stricter.mean()
    assert f"threshold {score} = {value:.6g}: keeps {100 * kept.mean():.1f}% of the" in (
        done.stderr.decode()
    )
    test = read_split(plan.test.path)
    theirs = head.predict(test.hidden, test.logits).scores[score]
    flagged = theirs < value if score == "mp" else theirs > value
    assert frame[f"flagged_{score}"].to_list() == frame["flagged"].to_list() == flagged.tolist()


def test_bad_predict_requests_are_one_line_errors_and_write_nothing(digits, tmp_path) -> None:
    pipeline, data, _ = digits
    out = tmp_path / "p.parquet"
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "?", "choices": ["a", "b", "c", "d"]}\n')
    untrained = write(tmp_path, "tiny", digits_text(5))
    cases = [
        ((pipeline, "digits:test", "--head", "etm"), r"no head 'etm'\. Did you mean: etn"),
        ((untrained, "digits:test"), r"is not trained.*Run `etn train"),
        ((pipeline, "digits:test", "--seed", "4"), r"seeds \[0\], not 4"),
        ((pipeline, questions), "'digits_cnn' .* cannot read .jsonl question files"),
        ((pipeline, tmp_path), "'digits_cnn' .* cannot read image folders"),
        ((pipeline, "digitz:test"), r"Unknown dataset 'digitz'\. Did you mean: digits"),
        ((pipeline, "digits:valid"), "no split 'valid'. Available: train, adapt, test"),
        ((pipeline, "digits:test", "--threshold", "mi"), "expects SCORE@PERCENT"),
        ((pipeline, "digits:test", "--threshold", "xx=1"), "expects SCORE@PERCENT"),
        ((pipeline, "digits:test", "--head", "map", "--threshold", "mi=1"), "gives no 'mi'"),
    ]
    before = files_of(data)
    for args, message in cases:
        with pytest.raises(EtnError, match=message) as caught:
            etn("predict", *args, "-d", data, "-o", out)
        assert "\n" not in str(caught.value)
        assert not out.exists()
    with pytest.raises(EtnError, match=r"must end in \.parquet or \.csv"):
        etn("predict", pipeline, "digits:test", "-d", data, "-o", tmp_path / "p.txt")
    assert files_of(data) == before
    done = subprocess.run(
        [sys.executable, "-m", "etn_cli", "predict", str(pipeline), "digits:test"]
        + ["--head", "etm", "-d", str(data), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: Pipeline") and not out.exists()


def test_the_wrapper_runs_the_digits_cnn_once_and_equals_extract_then_predict(digits) -> None:
    pipeline, data, plan = digits
    from etn_cli.datasets import datasets

    test = read_split(plan.test.path)
    inputs = datasets.get("digits")().load_split("test").data.tensors[0]  # (N, 1, 8, 8)
    for head in ("etn", "dmm"):  # dmm reads the pooled features.1 layer, captured in the pass
        model = etn_cli.EvidentialModel.from_pipeline(pipeline, head=head, data_dir=data)
        calls = []
        model.features.model.register_forward_hook(lambda *_, seen=calls: seen.append(1))
        out = model(inputs)
        assert len(calls) == 1
        expected = model.head.predict(test.hidden, test.logits, layers=test.layers)
        np.testing.assert_allclose(out.hidden, test.hidden, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out.logits, test.logits, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out.probs, expected.probs, rtol=1e-5, atol=1e-7)
        assert out.predictions.tolist() == expected.predictions.tolist()
        for name in ("mp", "um", "mi", "de"):
            np.testing.assert_allclose(getattr(out, name), expected.scores[name], rtol=1e-5)
        assert out.alpha.shape == (len(test), 7) and out.letters is None
    single = etn_cli.EvidentialModel.from_pipeline(pipeline, head="map", data_dir=data)(inputs[:3])
    assert single.um is None and single.mi is None and single.mp.shape == (3,)
    odin = etn_cli.EvidentialModel.from_pipeline(pipeline, head="odin", data_dir=data)
    with pytest.raises(EtnError, match="perturbed logits"):  # ODIN needs a second, gradient pass
        odin(inputs[:3])


# ------------------------------------------------------------------------- torchvision
VISION = tiny_pipeline(
    "tv", backbone=resnet18(4), data=fake_data(size=10, image_size=32),
    heads=({"name": "etn", "epochs": 2, "batch_size": 8},),
)  # fmt: skip


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vision")
    pipeline = write(root, "tv", VISION)
    code, output = etn("run", pipeline, "--data-dir", root / "data")
    assert code == 0, output
    plan = make_plan(load_pipeline(pipeline), root / "data")
    split = open_source(plan.pipeline, "fake").load_split("test")
    return pipeline, root / "data", plan, [split.data[i][0] for i in range(len(split))]


def test_a_torchvision_model_and_head_equal_extract_then_predict(vision) -> None:
    pipeline, data, plan, images = vision
    test = read_split(plan.test.path)
    head = etn_cli.load_head(pipeline=pipeline, data_dir=data)
    expected = head.predict(test.hidden, test.logits)
    backbone = plan.backbone.build()  # a freshly built resnet18 with the pipeline's seeded weights
    resnet = backbone.model
    model = etn_cli.EvidentialModel.from_torchvision(resnet, head, transform=backbone.transform)
    calls = []
    resnet.register_forward_hook(lambda *_: calls.append(1))
    out = model(images)  # PIL images, preprocessed by the transform
    assert len(calls) == 1
    np.testing.assert_allclose(out.hidden, test.hidden, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.probs, expected.probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.mi, expected.scores["mi"], rtol=1e-4, atol=1e-7)
    batch = torch.stack([backbone.transform(image) for image in images])  # (N, 3, 32, 32)
    np.testing.assert_allclose(model(batch[:4]).probs, out.probs[:4], rtol=1e-5, atol=1e-6)
    wrapped = etn_cli.EvidentialModel.from_pipeline(pipeline, data_dir=data)
    np.testing.assert_allclose(wrapped(images).probs, out.probs, rtol=1e-5, atol=1e-6)
    with pytest.raises(EtnError, match="no transform"):
        etn_cli.EvidentialModel.from_torchvision(resnet, head)(images)


def test_a_head_of_another_backbone_is_refused(vision, digits) -> None:
    _, _, plan, _ = vision
    _, data, _ = digits
    digits_head = etn_cli.load_head("etn", data_dir=data)
    with pytest.raises(EtnError, match=r"hidden size 64 and 7 classes.*hidden size 512 and 4"):
        etn_cli.EvidentialModel.from_torchvision(plan.backbone.build().model, digits_head)
    with pytest.raises(EtnError, match="not fitted"):
        etn_cli.EvidentialModel.from_torchvision(plan.backbone.build().model, etn_cli.ETN())


def test_predict_reads_an_image_folder_recursively(vision, tmp_path) -> None:
    pipeline, data, plan, images = vision
    for i, image in enumerate(images):  # lossless PNGs of the test split, in nested folders
        folder = tmp_path / "imgs" / ("even" if i % 2 == 0 else "odd/deeper")
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:02d}.png")
    (tmp_path / "imgs" / "notes.txt").write_text("not an image")
    out = tmp_path / "preds.csv"
    code, output = etn("predict", pipeline, tmp_path / "imgs", "-d", data, "-o", out)
    assert code == 0, output
    frame = pl.read_csv(out)
    order = [int(Path(p).stem) for p in frame["input"]]
    assert sorted(order) == list(range(len(images))) and "label" not in frame.columns
    test = read_split(plan.test.path)
    expected = etn_cli.load_head(pipeline=pipeline, data_dir=data).predict(
        test.hidden[order], test.logits[order]
    )
    assert_rows_match(frame, expected, atol=1e-7)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.png").write_bytes(b"not a png")
    for inputs, message in (
        (tmp_path / "empty", "holds no images"),
        (tmp_path / "broken", r"Cannot read image .*x\.png"),
        (tmp_path / "imgs" / "notes.txt", "not a .jsonl"),
        (tmp_path / "q.jsonl", None),
    ):
        if message is None:
            inputs.write_text('{"question": "?", "choices": ["a", "b", "c", "d"]}\n')
            message = "'torchvision' .* cannot read .jsonl question files"
        with pytest.raises(EtnError, match=message):
            etn("predict", pipeline, inputs, "-d", data, "-o", tmp_path / "bad.csv")
    assert not (tmp_path / "bad.csv").exists()


# ------------------------------------------------------------------------- causal LM
@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory):
    from llm_fixtures import make_llama

    root = tmp_path_factory.mktemp("llm")
    model = make_llama(root / "llama")
    heads = (SMALL_ETN,)
    text = tiny_pipeline(
        "lm", backbone=causal_lm(model), data=TINY_MCQA | {"batch_size": 16}, heads=heads
    )
    pipeline = write(root, "lm", text)
    code, output = etn("run", pipeline, "--data-dir", root / "data")
    assert code == 0, output
    return pipeline, root / "data", make_plan(load_pipeline(pipeline), root / "data"), model


def test_a_causal_lm_and_head_equal_extract_then_predict(llm) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from etn_cli.datasets import datasets

    pipeline, data, plan, folder = llm
    questions = datasets.get("tiny_mcqa")().load_split("test").data.questions
    test = read_split(plan.test.path)
    head = etn_cli.load_head(pipeline=pipeline, data_dir=data)
    expected = head.predict(test.hidden, test.logits)
    lm = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = etn_cli.EvidentialModel.from_causal_lm(lm, tokenizer, head)
    records = [{"question": q.question, "choices": list(q.choices)} for q in questions]
    out = model(records)
    np.testing.assert_allclose(out.logits, test.logits, atol=1e-5)
    np.testing.assert_allclose(out.probs, expected.probs, atol=1e-5)
    np.testing.assert_allclose(out.de, expected.scores["de"], rtol=1e-4, atol=1e-4)
    assert out.letters == ["ABCD"[k] for k in expected.predictions]
    prompts = [model.features.prompt(q) for q in questions[:3]]  # Question objects
    np.testing.assert_allclose(model(prompts).probs, out.probs[:3], atol=1e-5)
    np.testing.assert_allclose(model(prompts[0]).probs, out.probs[:1], atol=1e-5)
    wrapped = etn_cli.EvidentialModel.from_pipeline(pipeline, data_dir=data)
    np.testing.assert_allclose(wrapped(records[:5]).probs, out.probs[:5], atol=1e-5)
    with pytest.raises(EtnError, match="has 5 choices but the letters"):
        model({"question": "?", "choices": ["a", "b", "c", "d", "e"]})


def test_predict_reads_questions_from_jsonl(llm, tmp_path) -> None:
    """Questions of two lengths, interleaved: the backbone batches them longest first, and
    the rows come back in file order."""
    from llm_fixtures import write_jsonl

    from etn_cli.datasets import datasets

    pipeline, data, plan, _ = llm
    sums = datasets.get("tiny_mcqa")().load_split("test").data.questions
    words = datasets.get("tiny_mcqa_ood")().load_split("test").data.questions
    questions = [sums[0], words[0], sums[1], words[1], sums[2]]
    records = [{"question": q.question, "choices": list(q.choices), "id": q.id} for q in questions]
    records[0]["answer"] = "ABCD"[questions[0].answer]  # answers are optional
    del records[1]["id"]
    path = write_jsonl(tmp_path / "new.jsonl", records)
    out = tmp_path / "preds.parquet"
    code, output = etn("predict", pipeline, path, "-d", data, "-o", out)
    assert code == 0, output
    frame = pl.read_parquet(out)
    names = [questions[0].id, "new.jsonl#1", *(q.id for q in questions[2:])]
    assert frame["input"].to_list() == names
    test, ood = read_split(plan.test.path), read_split(plan.ood[0].path)
    rows = [(test, 0), (ood, 0), (test, 1), (ood, 1), (test, 2)]
    hidden = np.stack([features.hidden[i] for features, i in rows])  # (5, D)
    logits = np.stack([features.logits[i] for features, i in rows])  # (5, 4)
    expected = etn_cli.load_head(pipeline=pipeline, data_dir=data).predict(hidden, logits)
    assert_rows_match(frame, expected, letters=["A", "B", "C", "D"], atol=1e-5)
    assert frame["letter"].to_list() == ["ABCD"[k] for k in expected.predictions]
    assert "label" not in frame.columns
    with pytest.raises(EtnError, match="'hf_causal_lm' .* cannot read image folders"):
        etn("predict", pipeline, tmp_path, "-d", data, "-o", tmp_path / "x.parquet")
