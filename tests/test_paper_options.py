"""The paper's ambiguities as options, the paper's reading by default and the other one switch
away: the MMLU OOD domains, the LLM class space, ETN's prior mode for LLMs, and ImageNet-A/-R/
-Sketch grouped as covariate shift (OpenOOD) in the report."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import torch
from llm_fixtures import make_llama
from test_llm import backbone, extract_all, split

from etn_cli.datasets import datasets
from etn_cli.datasets.mcqa import MMLU_GROUPS, MMLU_MAIN_TEXT_GROUPS
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.report.summary import summarize
from etn_cli.stages.report import with_shift_groups

PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"
LLM_PIPELINES = ["race_llama3", "obqa_llama3", "race_gemma2", "obqa_gemma2"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("llama"))


def test_the_vocabulary_class_space_keeps_every_token_and_labels_by_token_id(llama, tmp_path):
    letters = backbone(llama, tmp_path / "a")
    vocabulary = backbone(llama, tmp_path / "b", class_space="vocabulary")
    data = split()
    _, hidden, logits, labels, _ = extract_all(vocabulary, data, batch_size=8)
    _, _, letter_logits, letter_labels, _ = extract_all(letters, data, batch_size=8)
    ids = list(letters.answer_tokens.ids)
    assert logits.shape == (len(data), vocabulary.num_classes) and vocabulary.num_classes > 50
    assert torch.allclose(logits[:, ids], letter_logits, atol=1e-5)
    assert torch.equal(labels, torch.as_tensor(ids)[letter_labels])
    encoded, _ = vocabulary.encode(data)
    with torch.no_grad():
        full = vocabulary.model(torch.tensor([encoded[3]])).logits[0, -1]  # (V,)
    assert torch.allclose(logits[3], full, atol=1e-5)
    weights = vocabulary.classifier()
    assert torch.allclose(hidden @ weights["weight"].T + weights["bias"], logits, atol=1e-5)
    assert vocabulary.fingerprint() != letters.fingerprint()


def test_the_main_texts_health_domain_is_there_and_the_tables_domains_stay_the_default():
    assert sorted(s for group in MMLU_GROUPS.values() for s in group) == sorted(
        [
            "college_computer_science", "computer_security", "high_school_computer_science",
            "machine_learning", "electrical_engineering", "college_mathematics",
            "high_school_mathematics", "abstract_algebra",
        ]
    )  # fmt: skip
    assert len(MMLU_MAIN_TEXT_GROUPS["mmlu_health"]) == 8
    assert {"mmlu_health", "mmlu_clinical_knowledge", "mmlu_virology"} <= set(datasets.names())


@pytest.mark.parametrize("name", LLM_PIPELINES)
def test_llm_pipelines_default_to_the_papers_reading_with_the_other_one_switch_away(name):
    path = PIPELINES / f"{name}.toml"
    paper = load_pipeline(path)
    [etn] = [h for h in paper.heads if h.name == "etn"]
    assert paper.data.ood == ("mmlu_cs", "mmlu_eng", "mmlu_math")
    assert paper.backbone_options["class_space"] == "letters"
    assert etn.settings["prior_mode"] == 100
    other = load_pipeline(
        path,
        overrides=(
            'data.ood=["mmlu_cs", "mmlu_health", "mmlu_math"]',
            "backbone.class_space=vocabulary",
            "heads.etn.prior_mode=10",
        ),
    )
    [etn] = [h for h in other.heads if h.name == "etn"]
    assert other.data.ood[1] == "mmlu_health" and etn.settings["prior_mode"] == 10
    assert other.backbone_options["class_space"] == "vocabulary"


def test_the_race_prior_ablation_sweeps_the_mode_over_the_main_pipelines_features():
    ablation = load_pipeline(PIPELINES / "race_llama3_ablation_prior.toml")
    main = load_pipeline(PIPELINES / "race_llama3.toml")
    modes = [h.sweep["prior_mode"] for h in ablation.heads if h.name == "etn"]
    assert 100 in modes and min(modes) == 1
    assert ablation.backbone_options == main.backbone_options and ablation.data == main.data


def _metrics(ood_sets: list[str]) -> pl.DataFrame:
    rows = []
    for seed in (0, 1):
        for i, eval_set in enumerate(ood_sets):
            rows.append(
                {"pipeline": "p", "backbone": "b", "id_dataset": "imagenet", "eval_set": eval_set,
                 "task": "ood", "method": "etn", "method_label": "ETN", "variant": "scalar",
                 "family": "evidential", "ood_group": None, "seed": seed, "metric": "aupr",
                 "score": "mp", "value": 0.5 + 0.1 * i + 0.01 * seed, "note": None}
            )  # fmt: skip
    return pl.DataFrame(rows)


def _plan(grouping: str, sets: dict[str, str]) -> SimpleNamespace:
    data = SimpleNamespace(grouping=grouping)
    ood = [SimpleNamespace(name=name, dataset=dataset) for name, dataset in sets.items()]
    return SimpleNamespace(pipeline=SimpleNamespace(data=data), ood=ood)


def test_openood_grouping_reports_imagenet_a_r_sketch_as_covariate_shift():
    sets = {"imagenet_a": "imagenet_a", "imagenet_r": "imagenet_r", "svhn": "svhn"}
    metrics = _metrics(list(sets))
    grouped = summarize(with_shift_groups(metrics, _plan("openood", sets)))
    means = dict(zip(grouped["eval_set"], grouped["mean"], strict=True))
    assert means["covariate-OOD"] == pytest.approx((0.505 + 0.605) / 2)
    assert means["semantic-OOD"] == pytest.approx(0.705)
    assert means["imagenet-OOD"] == pytest.approx((0.505 + 0.605 + 0.705) / 3)  # the paper's
    paper = summarize(with_shift_groups(metrics, _plan("paper", sets)))
    assert not {"covariate-OOD", "semantic-OOD"} & set(paper["eval_set"])
