"""Every post-hoc scorer module (importing one registers its heads) and the aliases."""

from etn_cli.heads.scorers import (  # noqa: F401
    activation_shaping,
    boundary,
    ddu,
    dice,
    gaussian,
    kl_matching,
    knn,
    logit_scores,
    rectified,
    subspace,
    temperature,
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

__all__ = ["ALIASES"]
