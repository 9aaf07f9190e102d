"""What planning, ``etn status`` and the report need to know of each head without importing
it (nor torch): what it reads from the cache, its family, its version. The head classes
(:class:`etn_cli.heads.base.Head` and its subclasses) declare the same facts as class
attributes for the stages; ``tests/test_planned_heads.py`` keeps the two in step."""

from __future__ import annotations

from typing import Any

HEAD_FORMAT = 1  # the format of a trained head's folder (head.json), in every head's key
CALIBRATION_VERSION = 1  # in the key of every calibrated head: 1, the fallback rules of issue 29

# the backbone's final layer (``classifier.safetensors``)
NEEDS_CLASSIFIER = frozenset(
    {"map_edl", "ib_edl", "laplace", "mcd", "ensemble", "react", "vra", "ash_p", "ash_b"}
    | {"ash_s", "scale", "dice", "vim", "residual", "fdbd"}
)
NEEDS_LAYERS = frozenset({"dmm"})  # pooled intermediate layers (``[backbone] layers``)
# class means, covariances or a bank of neighbours: fitted on ``[data] fit`` when given
NEEDS_ID_STATISTICS = frozenset(
    {"mahalanobis", "kl_matching", "react", "vra", "dice", "knn", "nnguide", "vim", "residual"}
    | {"rmds", "mahalanobis_pp", "ddu", "fdbd", "she"}
)
NEEDS_EVERY_CLASS = frozenset({"mahalanobis", "rmds", "mahalanobis_pp", "ddu", "she"})
VERSIONS = {  # raised when a head's results change for the same inputs (0 when absent)
    name: 1
    for name in ("mahalanobis", "entropy", "gen", "temperature", "vim", "residual", "rmds")
    + ("mahalanobis_pp", "ddu")
}
FAMILIES = {  # the report's grouping; every other head is "posthoc"
    **dict.fromkeys(("etn", "etn_offset", "static", "map_edl", "adats", "ib_edl"), "evidential"),
    **dict.fromkeys(("dmm",), "evidential"),
    **dict.fromkeys(("laplace", "mcd", "ensemble"), "bayesian"),
    **dict.fromkeys(("duq", "sngp"), "deterministic"),
}


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
