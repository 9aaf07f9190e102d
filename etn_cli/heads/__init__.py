"""Every registered head; importing this package fills the registry."""

from etn_cli.heads import (  # noqa: F401
    adats,
    dmm,
    duq,
    energy,
    ensemble,
    etn,
    etn_offset,
    ib_edl,
    laplace,
    mahalanobis,
    map,
    map_edl,
    mcd,
    odin,
    sngp,
    static,
)
from etn_cli.heads.base import Head, HeadConfig, Prediction, heads
from etn_cli.heads.scorers.catalogue import ALIASES  # noqa: E402 - registers the post-hoc scorers

for _alias, _name in ALIASES.items():
    heads.alias(_alias, _name)

__all__ = ["Head", "HeadConfig", "Prediction", "heads"]
