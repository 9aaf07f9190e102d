"""Every head etn knows, by name: the module that registers it and the settings it takes.

The table is read without importing any head (or torch): ``etn --help``, ``etn ls`` and a
pipeline file's misspelt head or setting answer in milliseconds. ``heads.get(name)`` imports
the one module that registers ``name`` (``@heads.register`` in :mod:`etn_cli.heads.base`'s
subclasses); each head's ``Config`` is the settings class named here, and
``tests/test_registries.py`` keeps the two in step.
"""

from __future__ import annotations

import importlib
from typing import Any

from etn_cli.heads.scorers.settings import (
    ASHBConfig,
    ASHPConfig,
    ASHSConfig,
    DDUConfig,
    DICEConfig,
    GENConfig,
    GradNormConfig,
    NeighboursConfig,
    NNGuideConfig,
    ReActConfig,
    SCALEConfig,
    SubspaceConfig,
    VRAConfig,
)
from etn_cli.heads.settings import (
    AdaTSConfig,
    DMMConfig,
    DUQConfig,
    EnergyConfig,
    EnsembleConfig,
    ETNConfig,
    HeadConfig,
    IBEDLConfig,
    LaplaceConfig,
    MapEDLConfig,
    MCDropoutConfig,
    ODINConfig,
    SNGPConfig,
    StaticConfig,
)
from etn_cli.registry import Registry

HEADS: dict[str, tuple[str, type[HeadConfig]]] = {
    # name: (its module under etn_cli.heads, its settings)
    "map": ("map", HeadConfig),
    "etn": ("etn", ETNConfig),
    "etn_offset": ("etn_offset", ETNConfig),
    "static": ("static", StaticConfig),
    "energy": ("energy", EnergyConfig),
    "mahalanobis": ("mahalanobis", HeadConfig),
    "map_edl": ("map_edl", MapEDLConfig),
    "adats": ("adats", AdaTSConfig),
    "ib_edl": ("ib_edl", IBEDLConfig),
    "laplace": ("laplace", LaplaceConfig),
    "mcd": ("mcd", MCDropoutConfig),
    "ensemble": ("ensemble", EnsembleConfig),
    "odin": ("odin", ODINConfig),
    "duq": ("duq", DUQConfig),
    "sngp": ("sngp", SNGPConfig),
    "dmm": ("dmm", DMMConfig),
    # the post-hoc scorers (etn_cli/heads/scorers/)
    "max_logit": ("scorers.logit_scores", HeadConfig),
    "entropy": ("scorers.logit_scores", HeadConfig),
    "gen": ("scorers.logit_scores", GENConfig),
    "temperature": ("scorers.temperature", HeadConfig),
    "kl_matching": ("scorers.kl_matching", HeadConfig),
    "react": ("scorers.rectified", ReActConfig),
    "vra": ("scorers.rectified", VRAConfig),
    "ash_p": ("scorers.activation_shaping", ASHPConfig),
    "ash_b": ("scorers.activation_shaping", ASHBConfig),
    "ash_s": ("scorers.activation_shaping", ASHSConfig),
    "scale": ("scorers.activation_shaping", SCALEConfig),
    "dice": ("scorers.dice", DICEConfig),
    "knn": ("scorers.knn", NeighboursConfig),
    "nnguide": ("scorers.knn", NNGuideConfig),
    "vim": ("scorers.subspace", SubspaceConfig),
    "residual": ("scorers.subspace", SubspaceConfig),
    "rmds": ("scorers.gaussian", HeadConfig),
    "mahalanobis_pp": ("scorers.gaussian", HeadConfig),
    "ddu": ("scorers.ddu", DDUConfig),
    "fdbd": ("scorers.boundary", HeadConfig),
    "she": ("scorers.boundary", HeadConfig),
    "gradnorm": ("scorers.boundary", GradNormConfig),
}
LABELS = {  # name -> the label reports give it (each head class's ``label``)
    "map": "MAP",
    "etn": "ETN",
    "etn_offset": "ETN (fitted offset)",
    "static": "Static scaling",
    "energy": "Energy",
    "mahalanobis": "Mahalanobis",
    "map_edl": "MAP_EDL (last layer)",
    "adats": "AdaTS (EDL loss)",
    "ib_edl": "IB-EDL (last layer)",
    "laplace": "Laplace (last layer, KFAC)",
    "mcd": "MC dropout",
    "ensemble": "Deep ensemble (last layer)",
    "odin": "ODIN",
    "duq": "DUQ (head)",
    "sngp": "SNGP (head)",
    "dmm": "DMM",
    "max_logit": "Max logit",
    "entropy": "Entropy",
    "gen": "GEN",
    "temperature": "Temperature scaling",
    "kl_matching": "KL matching",
    "react": "ReAct",
    "vra": "VRA",
    "ash_p": "ASH-P",
    "ash_b": "ASH-B",
    "ash_s": "ASH-S",
    "scale": "SCALE",
    "dice": "DICE",
    "knn": "KNN",
    "nnguide": "NNGuide",
    "vim": "ViM",
    "residual": "Residual",
    "rmds": "RMDS",
    "mahalanobis_pp": "Mahalanobis++",
    "ddu": "DDU (GDA)",
    "fdbd": "fDBD",
    "she": "SHE",
    "gradnorm": "GradNorm",
}
SEED_FREE = frozenset(  # heads that draw nothing at random: one trained unit stands for all seeds
    {"map", "energy", "mahalanobis", "odin"}
    | {name for name, (module, _) in HEADS.items() if module.startswith("scorers.")}
)
ALIASES = {  # a name other libraries use -> the registered head
    "msp": "map",  # maximum softmax probability: the backbone's own softmax
    "ebo": "energy",  # OpenOOD's energy-based OOD
    "mds": "mahalanobis",  # OpenOOD's name
    "mls": "max_logit",
    "klm": "kl_matching",
    "temp_scaling": "temperature",
    "ash": "ash_b",  # OpenOOD's ASH postprocessor shapes with ASH-B (ash_net.forward_threshold)
    "gda": "ddu",
}

heads: Registry[Any] = Registry(
    "head", {name: f"etn_cli.heads.{module}" for name, (module, _) in HEADS.items()}, ALIASES
)


def settings_of(name: str) -> type[HeadConfig]:
    """The settings class of head ``name`` (or an alias), without importing the head."""
    return HEADS[heads.canonical(name)][1]


_BASE = ("Head", "Prediction")  # in etn_cli.heads.base, which imports torch
__all__ = [
    "ALIASES",
    "HEADS",
    "LABELS",
    "SEED_FREE",
    "Head",
    "HeadConfig",
    "Prediction",
    "heads",
    "settings_of",
]


def __getattr__(name: str) -> Any:
    """``Head`` and ``Prediction`` (and torch with them) load on first use."""
    if name in _BASE:
        return getattr(importlib.import_module("etn_cli.heads.base"), name)
    raise AttributeError(f"module 'etn_cli.heads' has no attribute {name!r}")
