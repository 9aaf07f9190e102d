"""The LLM path: hf_causal_lm on tiny local Llama / Gemma-2 models, LoRA adapters and
fine-tuning, the MCQA readers, prompt templates and a pipeline run end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F
from llm_fixtures import make_adapter, make_gemma2, make_llama, write_jsonl
from tiny_pipeline import SMALL_ETN, TINY_MCQA, causal_lm, tiny_pipeline

from etn_cli.backbones import backbones
from etn_cli.backbones.hf_lm import CausalLMBackbone, Config
from etn_cli.datasets import datasets
from etn_cli.errors import EtnError


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a busy machine thread hand-offs cost
    more than the arithmetic."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_gemma2(tmp_path_factory.mktemp("gemma2"))


@pytest.fixture(scope="module")
def adapter(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(llama, tmp_path_factory.mktemp("adapter"))


def backbone(model: Path, cache: Path, **options) -> CausalLMBackbone:
    config = Config(model=str(model), dtype="float32", **options)
    return backbones.get("hf_causal_lm")(config, cache)


def split(name: str = "tiny_mcqa", part: str = "test"):
    return datasets.get(name)().load_split(part)


def extract_all(lm: CausalLMBackbone, data, batch_size: int):
    """Every row's (hidden, logits, layers) in split order, as extract would store them."""
    rows = []
    for inputs, labels, index in lm.batches(data, batch_size):
        hidden, logits, layers = lm.extract_batch(inputs)
        rows.append((index, hidden, logits, labels, layers))
    index = torch.cat([r[0] for r in rows])
    order = torch.argsort(index)
    cat = {k: torch.cat([r[4][k] for r in rows])[order] for k in rows[0][4]}
    return (
        index[order],
        torch.cat([r[1] for r in rows])[order],
        torch.cat([r[2] for r in rows])[order],
        torch.cat([r[3] for r in rows])[order],
        cat,
    )


# ---------------------------------------------------------------------- logits and hidden states
@pytest.mark.parametrize("model", ["llama", "gemma2"])
def test_letter_logits_equal_the_full_forward_at_the_last_position(model, request, tmp_path):
    lm = backbone(request.getfixturevalue(model), tmp_path)
    data = split()
    index, hidden, logits, labels, _ = extract_all(lm, data, batch_size=8)
    ids = list(lm.answer_tokens.ids)
    encoded, expected_labels = lm.encode(data)
    for row in (0, 17, 63):
        with torch.no_grad():
            out = lm.model(torch.tensor([encoded[row]]), output_hidden_states=False)
        full = out.logits[0, -1]  # (V,) the model's own logits at the last prompt token
        assert torch.allclose(logits[row], full[ids], atol=1e-5, rtol=1e-5)
    assert torch.equal(labels, expected_labels)
    assert torch.equal(index, torch.arange(len(data)))
    if model == "gemma2":  # soft-capping really acts on these logits
        raw = hidden @ lm.classifier()["weight"].T  # (N, C)
        assert (raw - logits).abs().max() > 0.1
        cap = lm.model.config.final_logit_softcapping
        assert torch.allclose(cap * torch.tanh(raw / cap), logits, atol=1e-5)


def test_hidden_is_the_input_of_lm_head_and_classifier_reproduces_the_logits(llama, tmp_path):
    lm = backbone(llama, tmp_path)
    _, hidden, logits, _, _ = extract_all(lm, split(), batch_size=16)
    weights = lm.classifier()
    assert weights["weight"].shape == (4, lm.hidden_size) and torch.all(weights["bias"] == 0)
    assert torch.allclose(hidden @ weights["weight"].T + weights["bias"], logits, atol=1e-5)
    encoded, _ = lm.encode(split())
    with torch.no_grad():
        full = lm.model(torch.tensor([encoded[5]])).logits[0, -1]  # (V,)
        assert torch.allclose(lm.model.lm_head(hidden[5]), full, atol=1e-5)  # every row of V


def test_prompts_longer_than_max_length_keep_their_end_and_warn(llama, tmp_path):
    whole, _ = backbone(llama, tmp_path).encode(split())
    with pytest.warns(UserWarning, match="exceed max_length = 16"):
        cut, _ = backbone(llama, tmp_path, max_length=16).encode(split())
    assert all(c == w[-16:] for c, w in zip(cut, whole, strict=True))


@pytest.mark.parametrize("model", ["llama", "gemma2"])
def test_batched_extraction_equals_one_prompt_at_a_time(model, request, tmp_path):
    lm = backbone(request.getfixturevalue(model), tmp_path)
    data = split()
    _, hidden_1, logits_1, _, _ = extract_all(lm, data, batch_size=1)
    _, hidden_b, logits_b, _, _ = extract_all(lm, data, batch_size=7)
    assert torch.allclose(hidden_1, hidden_b, atol=1e-5)
    assert torch.allclose(logits_1, logits_b, atol=1e-5)


def test_batches_group_prompts_by_length_with_left_padding(llama, tmp_path):
    lm = backbone(llama, tmp_path)
    data = split()
    lengths = [len(ids) for ids in lm.encode(data)[0]]
    seen = []
    for inputs, _, index in lm.batches(data, 8):
        mask = inputs["attention_mask"]
        assert torch.all(mask[:, -1] == 1)  # left padding: every prompt ends at the right
        assert mask.sum(1).tolist() == [lengths[i] for i in index.tolist()]
        seen.append([lengths[i] for i in index.tolist()])
    flat = [n for batch in seen for n in batch]
    assert flat == sorted(lengths, reverse=True)


def test_layers_option_stores_pooled_decoder_layer_outputs(llama, tmp_path):
    lm = backbone(llama, tmp_path, layers=(0, "layers.1.mlp"))
    data = split()
    _, _, _, _, layers = extract_all(lm, data, batch_size=8)
    assert set(layers) == {"layer0", "layers.1.mlp"}
    encoded, _ = lm.encode(data)
    with torch.no_grad():
        states = lm.model(torch.tensor([encoded[3]]), output_hidden_states=True).hidden_states
    assert torch.allclose(layers["layer0"][3], states[1][0, -1], atol=1e-5)
    assert layers["layers.1.mlp"].shape == (len(data), lm.hidden_size)
    with pytest.raises(EtnError, match="out of range"):
        backbone(llama, tmp_path, layers=(5,)).extract_batch(next(lm.batches(data, 2))[0])


# ---------------------------------------------------------------------- adapters and errors
def test_lora_adapter_changes_the_outputs_and_the_fingerprint(llama, adapter, tmp_path):
    plain = backbone(llama, tmp_path)
    tuned = backbone(llama, tmp_path, adapter=str(adapter))
    inputs = next(plain.batches(split(), 16))[0]
    assert (plain.forward(inputs)[1] - tuned.forward(inputs)[1]).abs().max() > 1e-2
    assert plain.fingerprint()["adapter"] is None
    assert tuned.fingerprint()["adapter"]["weights_sha256"] != tuned.fingerprint()["model"]
    other = make_adapter(llama, tmp_path / "other", seed=1)
    assert (
        backbone(llama, tmp_path, adapter=str(other)).fingerprint()["adapter"]
        != tuned.fingerprint()["adapter"]
    )


def test_adapter_made_for_another_model_is_a_clear_error(llama, tmp_path):
    wider = make_llama(tmp_path / "wider", hidden=48)
    foreign = make_adapter(wider, tmp_path / "foreign")
    lm = backbone(llama, tmp_path, adapter=str(foreign))
    with pytest.raises(EtnError, match="does not fit"):
        lm.forward(next(lm.batches(split(), 2))[0])


def test_adapter_without_safetensors_weights_is_refused(llama, adapter, tmp_path):
    folder = tmp_path / "binonly"
    folder.mkdir()
    (folder / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    with pytest.raises(EtnError, match="safetensors"):
        backbone(llama, tmp_path, adapter=str(folder))


@pytest.mark.parametrize("letters", [("A.", "B.", "C.", "D."), ("W", "X", "Y", "Z")])
def test_letters_that_are_not_single_tokens_are_an_error(llama, letters, tmp_path):
    with pytest.raises(EtnError, match="not single tokens"):
        backbone(llama, tmp_path, letters=letters).fingerprint()


def test_answer_token_variant_follows_the_end_of_the_prompt(llama, tmp_path):
    spaced = backbone(llama, tmp_path).answer_tokens
    assert spaced.variant == "space" and spaced.texts == (" A", " B", " C", " D")
    template = "Question: {question}\n{choices}\nAnswer:\n"  # the next token starts a word
    bare = backbone(llama, tmp_path, prompt_template=template).answer_tokens
    assert bare.variant == "bare" and bare.ids != spaced.ids


def test_model_needing_remote_code_is_refused_unless_trusted(tmp_path):
    folder = tmp_path / "custom"
    folder.mkdir()
    config = {"model_type": "etn_custom_lm", "auto_map": {"AutoConfig": "x.C"}}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EtnError, match="trust_remote_code = true"):
        backbone(folder, tmp_path).fingerprint()


def test_missing_model_is_a_one_line_error_naming_where_it_looked(tmp_path, monkeypatch):
    with pytest.raises(EtnError, match="does not exist"):
        backbone(tmp_path / "nowhere" / "model", tmp_path).fingerprint()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EtnError, match="hf download etn-tests/no-such-model") as err:
        backbone("etn-tests/no-such-model", tmp_path).fingerprint()  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_local_model_fingerprint_follows_the_weights(llama, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in llama.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    before = backbone(copy, tmp_path).fingerprint()
    assert before == backbone(llama, tmp_path).fingerprint()  # content, not path
    from safetensors.torch import load_file, save_file

    weights = load_file(copy / "model.safetensors")
    weights["lm_head.weight"][0, 0] += 1.0
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    assert backbone(copy, tmp_path).fingerprint()["model"] != before["model"]


def test_prompt_template_changes_the_fingerprint_and_the_prompt(llama, tmp_path):
    default = backbone(llama, tmp_path)
    named = backbone(llama, tmp_path, prompt_template="instruction")
    custom = backbone(llama, tmp_path, prompt_template="Q: {question}\n{choices}\nAnswer:")
    prints = [b.fingerprint()["prompt_template"] for b in (default, named, custom)]
    assert len({json.dumps(p, sort_keys=True) for p in prints}) == 3
    assert len(named.encode(split())[0][0]) > len(default.encode(split())[0][0])
    for bad in ("nonsense", "Q: {question} {answer}", "{choices} only"):
        with pytest.raises(EtnError, match="template"):
            Config(model=str(llama), prompt_template=bad)


def test_non_mcqa_dataset_is_refused(llama, tmp_path):
    with pytest.raises(EtnError, match="multiple-choice"):
        next(backbone(llama, tmp_path).batches(split("digits", "test"), 4))


# ---------------------------------------------------------------------- LoRA fine-tuning
def mean_cross_entropy(lm: CausalLMBackbone, data) -> float:
    _, _, logits, labels, _ = extract_all(lm, data, batch_size=16)
    return F.cross_entropy(logits, labels).item()


@pytest.mark.parametrize("model", ["llama", "gemma2"])
def test_finetune_lowers_the_training_loss_and_use_finetuned_loads_it(model, request, tmp_path):
    folder = request.getfixturevalue(model)
    train = split("tiny_mcqa", "train")
    lm = backbone(folder, tmp_path)
    before, fingerprint = mean_cross_entropy(lm, train), lm.fingerprint()
    settings = {"epochs": 1, "batch_size": 4, "lr": 1e-2, "lora_rank": 4, "lora_alpha": 8}
    record = lm.finetune(train, settings, tmp_path / "ft")
    assert (tmp_path / "ft" / "adapter_model.safetensors").is_file()
    assert record["steps"] == 24 and len(record["epoch_losses"]) == 1
    assert record["settings"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    tuned = backbone(folder, tmp_path)
    tuned.use_finetuned(tmp_path / "ft")
    assert tuned.fingerprint() != fingerprint and tuned.fingerprint()["adapter"] is not None
    assert mean_cross_entropy(tuned, train) < before - 0.05


def test_finetune_is_seeded_and_rejects_unknown_settings(llama, tmp_path):
    train = split("tiny_mcqa", "validation")
    settings = {"epochs": 1, "batch_size": 8, "lr": 1e-3, "lora_rank": 2}
    for name in ("a", "b"):
        backbone(llama, tmp_path).finetune(train, settings, tmp_path / name)
    from safetensors.torch import load_file

    a, b = (load_file(tmp_path / n / "adapter_model.safetensors") for n in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(EtnError, match="Unknown key 'lora_rnak'"):
        backbone(llama, tmp_path).finetune(train, {"lora_rnak": 4}, tmp_path / "c")
    with pytest.raises(EtnError, match="adapter_config.json"):
        backbone(llama, tmp_path).use_finetuned(tmp_path / "c")


# ---------------------------------------------------------------------- MCQA files
ETN_RECORD = {"question": "2 + 2?", "choices": ["3", "4", "5", "6"], "answer": "B"}
NATIVE = {
    "etn schema, index answer": (dict(ETN_RECORD, answer=1, context="Sums."), "Sums."),
    "RACE (HF)": (
        {"example_id": "h1", "article": "Sums.", "question": "2 + 2?", "answer": "B",
         "options": ["3", "4", "5", "6"]},
        "Sums.",
    ),
    "OBQA (HF)": (
        {"id": "7", "question_stem": "2 + 2?", "answerKey": "B",
         "choices": {"text": ["3", "4", "5", "6"], "label": ["A", "B", "C", "D"]}},
        "",
    ),
    "OBQA (original)": (
        {"id": "7", "answerKey": "B", "question": {"stem": "2 + 2?", "choices": [
            {"text": t, "label": lab} for t, lab in zip("3456", "ABCD", strict=True)]}},
        "",
    ),
    "MMLU (HF)": (
        {"question": "2 + 2?", "subject": "abstract_algebra", "choices": ["3", "4", "5", "6"],
         "answer": 1},
        "",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NATIVE))
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_mcqa_files_in_etn_and_native_schemas_are_read(case, suffix, tmp_path):
    record, context = NATIVE[case]
    path = tmp_path / "obqa" / f"test{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, [record, record])
    else:
        path.parent.mkdir(parents=True)
        pl.DataFrame([record, record]).write_parquet(path)
    data = datasets.get("obqa")(root=str(tmp_path)).load_split("test")
    question, label = data.data[1]
    assert (question.question, question.choices, label) == ("2 + 2?", ("3", "4", "5", "6"), 1)
    assert question.context == context and data.num_classes == 4
    assert np.array_equal(data.index, [0, 1])
    assert data.fingerprint["sources"][0]["files"] == {
        f"obqa/test{suffix}": data.fingerprint["sources"][0]["files"][f"obqa/test{suffix}"]
    }


def test_a_csv_file_with_choice_columns_and_index_answers_is_read(tmp_path):
    """CSV cells are text: "1" is the index 1 (the letter B), unless the choices are labelled
    "1", "2", ... themselves; an index beyond the choices is refused with the row."""
    from etn_cli.datasets.mcqa_files import answer_index

    folder = tmp_path / "questions"
    folder.mkdir()
    (folder / "test.csv").write_text(
        'question,A,B,C,answer\n"2 + 2?",3,4,5,1\n"1 + 1?",2,3,4,0\nWhich?,x,y,z,C\n'
    )
    data = datasets.get("mcqa_jsonl")(root=str(folder)).load_split("test.csv")
    assert [(q.question, q.choices, q.answer) for q in data.data.questions] == [
        ("2 + 2?", ("3", "4", "5"), 1),
        ("1 + 1?", ("2", "3", "4"), 0),
        ("Which?", ("x", "y", "z"), 2),
    ]
    assert data.num_classes == 3 and np.array_equal(data.index, [0, 1, 2])
    assert answer_index("1", ["1", "2", "3", "4"], 4, "here") == 0  # a label before an index
    (folder / "bad.csv").write_text("question,A,B,C,answer\nq,1,2,3,3\n")
    with pytest.raises(EtnError, match=r"bad.csv:2: answer '3' is not one of the letters A, B, C"):
        datasets.get("mcqa_jsonl")(root=str(folder)).load_split("bad.csv")


def test_race_articles_expand_and_dev_files_serve_as_validation(tmp_path):
    article = {
        "id": "middle1.txt",
        "article": "Tom has a cat.",
        "questions": ["Who has a cat?", "What does Tom have?"],
        "options": [["Tom", "Ann", "Bob", "Eve"], ["a dog", "a cat", "a cow", "a hen"]],
        "answers": ["A", "B"],
    }
    write_jsonl(tmp_path / "race" / "dev.jsonl", [article])
    data = datasets.get("race")(root=str(tmp_path)).load_split("validation")
    assert [q.answer for q in data.data.questions] == [0, 1]
    assert data.data.questions[1].id == "middle1.txt#1"
    assert all(q.context == "Tom has a cat." for q in data.data.questions)


def test_mmlu_groups_concatenate_their_subjects_from_original_csv_files(tmp_path):
    for split_dir in ("test",):
        for subject in ("college_mathematics", "high_school_mathematics", "abstract_algebra"):
            folder = tmp_path / "mmlu" / "data" / split_dir
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{subject}_{split_dir}.csv").write_text(
                f'"{subject}, q1?",1,2,3,4,C\n"{subject} q2",a,b,c,d,A\n'
            )
    data = datasets.get("mmlu_math")(root=str(tmp_path)).load_split("test")
    assert len(data) == 6 and np.array_equal(data.index, np.arange(6))
    assert data.data.questions[0].question == "college_mathematics, q1?"
    assert [q.answer for q in data.data.questions] == [2, 0] * 3
    single = datasets.get("mmlu_abstract_algebra")(root=str(tmp_path)).load_split("test")
    assert [q.question for q in single.data.questions] == [
        q.question for q in data.data.questions[4:]
    ]


def test_mmlu_subsets_are_the_papers_eight_subjects():
    from etn_cli.datasets.mcqa import MMLU_GROUPS

    subjects = sorted(s for group in MMLU_GROUPS.values() for s in group)
    assert len(subjects) == 8 and "electrical_engineering" in subjects
    assert {"mmlu_cs", "mmlu_eng", "mmlu_math", "race", "obqa"} <= set(datasets.names())


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (dict(ETN_RECORD, answer="E"), "answer 'E'"),
        (dict(ETN_RECORD, choices=["1", "2", "3"]), "expected 4 answer choices"),
        ({"choices": ["1", "2", "3", "4"], "answer": "A"}, "expected question text"),
        (dict(ETN_RECORD, answer=None), "no 'answer'"),
    ],
)
def test_bad_records_are_errors_naming_the_file_and_line(record, message, tmp_path):
    write_jsonl(tmp_path / "obqa" / "test.jsonl", [ETN_RECORD, record])
    with pytest.raises(EtnError, match=message) as err:
        datasets.get("obqa")(root=str(tmp_path)).load_split("test")
    assert "test.jsonl:2" in str(err.value)


def test_missing_files_name_the_paths_looked_in(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if `datasets` were not installed
    with pytest.raises(EtnError) as err:
        datasets.get("race")(root=str(tmp_path)).load_split("test")
    message = str(err.value)
    assert str(tmp_path / "race" / "test.jsonl") in message and "pip install datasets" in message
    assert "\n" not in message


def test_hf_downloads_are_read_where_they_land(tmp_path, monkeypatch):
    """``hf download ehovy/race --repo-type dataset --local-dir <root>/race`` leaves
    ``race/all/<split>-*.parquet``; without ``--local-dir`` the files are in the hub cache's
    snapshot, which ``refs/main`` names."""
    from huggingface_hub import constants

    from tests import rehearsal_data as rd

    monkeypatch.setitem(sys.modules, "datasets", None)
    rd.write_race(tmp_path / "root" / "race", {"test": 5})
    local = datasets.get("race")(root=str(tmp_path / "root")).load_split("test")
    assert len(local) == 5 and local.data.questions[0].context == "An article about thing 0."
    repo = tmp_path / "hub" / "datasets--ehovy--race"
    rd.write_race(repo / "snapshots" / rd.COMMIT, {"test": 4})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rd.COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cached = datasets.get("race")(root=str(tmp_path / "elsewhere")).load_split("test")
    assert len(cached) == 4
    assert list(cached.fingerprint["sources"][0]["files"]) == [
        f"datasets--ehovy--race/snapshots/{rd.COMMIT}/all/test-00000-of-00001.parquet"
    ]


def test_hugging_face_datasets_rows_are_read_when_files_are_missing(tmp_path, monkeypatch):
    """``datasets.load_dataset`` stands in for the (uninstalled) library: the rows it returns
    are HF's OpenBookQA rows; etn maps them and records where they came from."""
    calls = []

    class Table(list):
        _fingerprint = "abc123"

    def load_dataset(path, config, split):
        calls.append((path, config, split))
        return Table([NATIVE["OBQA (HF)"][0]] * 3)

    module = type(sys)("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    data = datasets.get("obqa")(root=str(tmp_path)).load_split("validation")
    assert calls == [("allenai/openbookqa", "main", "validation")] and len(data) == 3
    assert data.fingerprint["sources"][0]["hf_fingerprint"] == "abc123"


def test_tiny_mcqa_is_seeded_and_its_answers_are_right():
    first, second = split("tiny_mcqa", "train"), split("tiny_mcqa", "train")
    assert first.data.questions == second.data.questions
    for q in first.data.questions:
        a, b = (int(w) for w in q.question.removeprefix("What is ").rstrip("?").split(" plus "))
        assert int(q.choices[q.answer]) == a + b and len(set(q.choices)) == 4
    answers = np.bincount([q.answer for q in first.data.questions], minlength=4)
    assert answers.min() > 10  # the answer position is spread over A-D
    ood = split("tiny_mcqa_ood", "test").data.questions
    assert all(q.choices[q.answer] == min(q.choices) for q in ood)


# ---------------------------------------------------------------------- end to end
def test_a_pipeline_over_the_tiny_llm_runs_end_to_end(llama, tmp_path):
    from typer.testing import CliRunner

    from etn_cli.cli.app import app

    pipeline = tmp_path / "tiny_llm.toml"
    etn = SMALL_ETN | {"epochs": 3, "schedule": "cosine", "warmup_fraction": 0.1}
    data = TINY_MCQA | {"test": "test", "batch_size": 16}
    pipeline.write_text(
        tiny_pipeline("tiny_llm", backbone=causal_lm(llama), data=data, heads=("map", etn))
    )
    result = CliRunner().invoke(app, ["run", str(pipeline), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert "tiny_mcqa_ood" in result.output or "tiny_mcqa-OOD" in result.output
    manifests = list((tmp_path / "d" / "features").glob("hf_causal_lm-*/*/manifest.json"))
    assert len(manifests) == 3
    fingerprint = json.loads(manifests[0].read_text())["fingerprint"]["backbone"]
    assert fingerprint["prompt_template"]["name"] == "default"
    assert fingerprint["answer_tokens"]["variant"] == "space"
    rerun = CliRunner().invoke(app, ["extract", str(pipeline), "--data-dir", str(tmp_path / "d")])
    assert rerun.exit_code == 0 and "0 built, 4 up to date" in rerun.output  # and classifier


def test_a_finetune_table_trains_a_lora_adapter_that_extract_then_uses(llama, tmp_path):
    from typer.testing import CliRunner

    from etn_cli.cli.app import app

    pipeline = tmp_path / "tiny_lora.toml"
    finetune = {"split": "train", "epochs": 1, "lr": 1e-2, "lora_rank": 4}
    text = tiny_pipeline("tiny_lora", backbone=causal_lm(llama), data=TINY_MCQA, finetune=finetune)
    pipeline.write_text(text)
    data_dir = tmp_path / "d"
    result = CliRunner().invoke(app, ["run", str(pipeline), "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    (folder,) = (p for p in (data_dir / "backbones").glob("hf_causal_lm-finetune-*") if p.is_dir())
    record = json.loads((folder / "finetune.json").read_text())["record"]
    assert record["settings"]["lora_rank"] == 4 and record["settings"]["batch_size"] == 4
    manifest = next((data_dir / "features").glob("hf_causal_lm-*/tiny_mcqa.test-*/manifest.json"))
    loaded = json.loads(manifest.read_text())["loaded_backbone"]
    assert loaded["adapter"]["weights_sha256"]  # extract ran with the trained adapter


def test_a_hub_id_is_read_from_the_hugging_face_cache_offline(llama, tmp_path, monkeypatch):
    """The hub path as on a machine without internet: the cache holds a snapshot of the repo."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--etn-tests--tiny-llama"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for file in llama.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    # what HF_HOME=<tmp> HF_HUB_OFFLINE=1 set before the process starts amount to
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = backbone("etn-tests/tiny-llama", tmp_path)  # type: ignore[arg-type]
    assert lm.fingerprint()["model"] == {"repo_id": "etn-tests/tiny-llama", "commit": commit}
    local = backbone(llama, tmp_path)
    inputs = next(local.batches(split(), 8))[0]
    assert torch.equal(lm.forward(inputs)[1], local.forward(inputs)[1])
    with pytest.raises(EtnError, match="no revision|not in the Hugging Face cache"):
        backbone("etn-tests/tiny-llama", tmp_path, revision="v9").fingerprint()
