"""Backbone adapters; importing this package registers every built-in backbone."""

from etn_cli.backbones import digits_cnn, hf_lm, torchvision_model  # noqa: F401
from etn_cli.backbones.base import Backbone, backbones

__all__ = ["Backbone", "backbones", "digits_cnn"]
