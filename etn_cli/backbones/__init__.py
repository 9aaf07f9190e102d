"""Backbone adapters, by name: the module that registers each and the settings it takes.

The table is read without importing any backbone (or torch): the names are known, a misspelt
one refused, and a pipeline's ``[backbone]`` options and ``[finetune]`` settings checked
(:mod:`etn_cli.backbones.settings`) in milliseconds; ``backbones.get(name)`` imports the one
module that holds it, whose ``Config`` and ``FinetuneConfig`` are the classes named here
(``tests/test_registries.py`` keeps the two in step)."""

from __future__ import annotations

from etn_cli.backbones.settings import (
    CausalLMConfig,
    DigitsCNNConfig,
    HFImageConfig,
    LoraSettings,
    TimmConfig,
    TorchvisionConfig,
    TorchvisionFinetuneConfig,
)
from etn_cli.registry import Registry

BACKBONES: dict[str, tuple[str, type, type | None]] = {
    # name: (its module under etn_cli.backbones, its options, its [finetune] settings or None)
    "digits_cnn": ("digits_cnn", DigitsCNNConfig, None),
    "torchvision": ("torchvision_model", TorchvisionConfig, TorchvisionFinetuneConfig),
    "hf_causal_lm": ("hf_lm", CausalLMConfig, LoraSettings),
    "timm": ("timm_model", TimmConfig, None),
    "hf_image": ("hf_image", HFImageConfig, None),
}

backbones: Registry = Registry(
    "backbone", {name: f"etn_cli.backbones.{module}" for name, (module, *_) in BACKBONES.items()}
)


def settings_of(name: str) -> tuple[type, type | None]:
    """The options class of backbone ``name`` and its ``[finetune]`` settings class (None: it
    has no fine-tuning stage), without importing the backbone."""
    return BACKBONES[backbones.canonical(name)][1:]


__all__ = ["BACKBONES", "backbones", "settings_of"]
