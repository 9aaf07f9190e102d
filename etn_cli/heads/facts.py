"""What planning needs of a head beyond its record (:mod:`etn_cli.catalogue`), without
importing it (nor torch): the formats in every head's key, and its variant and display label
from its settings before it is fitted (as the fitted head gives them;
``tests/test_planned_heads.py`` keeps the two in step)."""

from __future__ import annotations

from typing import Any

HEAD_FORMAT = 1  # the format of a trained head's folder (head.json), in every head's key
CALIBRATION_VERSION = 1  # in the key of every calibrated head: 1, the fallback rules of issue 29


def planned_variant(name: str, config: Any) -> str:
    """The head's variant before it is fitted, as ``Head.variant`` gives it: Laplace's Hessian
    structure, else the ``variant`` setting (ETN's), else nothing."""
    if name == "laplace":
        return config.hessian_structure
    return getattr(config, "variant", "")


def planned_label(name: str, label: str, config: Any) -> str:
    """The head's display label before it is fitted, as ``Head.display_label`` gives it:
    ``ETN (vector)`` for a non-default variant, Laplace's with its structure."""
    if name == "laplace":
        structure = "KFAC" if config.hessian_structure == "kron" else "diag"
        return f"Laplace (last layer, {structure})"
    variant = planned_variant(name, config)
    return label if variant in ("", "scalar") else f"{label} ({variant})"
