"""Every registered head; importing this package fills the registry."""

from etn_cli.heads import energy, etn, mahalanobis, map, static  # noqa: F401
from etn_cli.heads.base import Head, HeadConfig, Prediction, heads

__all__ = ["Head", "HeadConfig", "Prediction", "heads"]
