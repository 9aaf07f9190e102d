"""Backbone adapters, by name: the table says which module registers each, so the names are
known (and a misspelt one refused) without importing any backbone or torch;
``backbones.get(name)`` imports the one module that holds it."""

from __future__ import annotations

from etn_cli.registry import Registry

BACKBONES = {  # name -> the module under etn_cli.backbones that registers it
    "digits_cnn": "digits_cnn",
    "torchvision": "torchvision_model",
    "hf_causal_lm": "hf_lm",
}

backbones: Registry = Registry(
    "backbone", {name: f"etn_cli.backbones.{module}" for name, module in BACKBONES.items()}
)

__all__ = ["BACKBONES", "backbones"]
