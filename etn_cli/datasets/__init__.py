"""Dataset sources, by name: the tables say which module registers each and which options it
takes, so the names are known (and a misspelt one refused) and a pipeline's
``[data.options.<dataset>]`` tables checked without importing any source;
``datasets.get(name)`` imports the one module that holds it."""

from __future__ import annotations

from typing import Any

from etn_cli.config import build_config
from etn_cli.datasets.settings import (
    FakeOptions,
    FolderOptions,
    ImageFolderOptions,
    ImageListOptions,
    TorchvisionOptions,
    refuse_options,
)
from etn_cli.registry import Registry

MMLU = (  # MMLU's subject groups (etn_cli.datasets.mcqa) and their subjects
    *("mmlu_cs", "mmlu_eng", "mmlu_math", "mmlu_health"),
    *("mmlu_abstract_algebra", "mmlu_anatomy", "mmlu_clinical_knowledge"),
    *("mmlu_college_computer_science", "mmlu_college_mathematics", "mmlu_college_medicine"),
    *("mmlu_computer_security", "mmlu_electrical_engineering", "mmlu_high_school_computer_science"),
    *("mmlu_high_school_mathematics", "mmlu_human_aging", "mmlu_machine_learning"),
    *("mmlu_medical_genetics", "mmlu_nutrition", "mmlu_professional_medicine", "mmlu_virology"),
)
MODULES = {  # module under etn_cli.datasets -> the datasets it registers
    "digits": ("digits", "digits_unseen", "digits_noise"),
    "vision": ("cifar10", "cifar100", "svhn", "fake"),
    "imagenet": ("imagenet", "imagenet_a", "imagenet_r", "imagenet_sketch"),
    "image_folder": ("image_folder",),
    "image_list": ("image_list",),
    "mcqa": ("race", "obqa", *MMLU),
    "mcqa_jsonl": ("mcqa_jsonl",),
    "tiny_mcqa": ("tiny_mcqa", "tiny_mcqa_ood"),
}

datasets: Registry = Registry(
    "dataset",
    {name: f"etn_cli.datasets.{module}" for module, names in MODULES.items() for name in names},
)

OPTIONS: dict[str, type] = {  # dataset -> its options; any other dataset takes none
    **dict.fromkeys(("cifar10", "cifar100", "svhn"), TorchvisionOptions),
    "fake": FakeOptions,
    **dict.fromkeys(MODULES["imagenet"], FolderOptions),
    "image_folder": ImageFolderOptions,
    "image_list": ImageListOptions,
}
ROOTED = ("image_folder", "mcqa_jsonl")  # datasets of your own files, under [data] root


def check_options(name: str, options: dict[str, Any], where: str) -> None:
    """``[data.options.<name>]`` checked as dataset ``name`` checks it, without importing it."""
    name = datasets.canonical(name)
    if name in OPTIONS:
        build_config(OPTIONS[name], options, where)
    else:
        refuse_options(name, datasets.modules[name].rsplit(".", 1)[1], options)


__all__ = ["MODULES", "OPTIONS", "ROOTED", "check_options", "datasets"]
