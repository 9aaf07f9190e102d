"""Dataset sources, by name: the table says which module registers each, so the names are
known (and a misspelt one refused) without importing any source; ``datasets.get(name)``
imports the one module that holds it."""

from __future__ import annotations

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

__all__ = ["MODULES", "datasets"]
