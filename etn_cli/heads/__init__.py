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

__all__ = ["Head", "HeadConfig", "Prediction", "heads"]
