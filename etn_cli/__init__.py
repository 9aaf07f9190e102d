"""etn: post-hoc evidential uncertainty (the Evidential Transformation Network, CVPR 2026)
for any pretrained classifier, as a feature-caching pipeline.

The Python API (:mod:`etn_cli.api.heads`) works on arrays or tensors a user already has, and
returns numpy arrays::

    import etn_cli
    head = etn_cli.ETN(prior_mode=10).fit(hidden, logits, labels)  # (N, D), (N, C), (N,)
    prediction = head.predict(hidden, logits)  # probs, predictions, scores (mp, um, mi, de)
    head = etn_cli.load_head(pipeline="pipelines/digits.toml", head="etn", seed=0)
    model = etn_cli.EvidentialModel.from_torchvision(resnet, head, transform=preprocess)

Names of the API load on first use, so ``import etn_cli`` stays fast (no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from etn_cli.errors import EtnError
from etn_cli.provenance import etn_version

__version__ = etn_version()
_API = ("ETN", "EvidentialModel", "EvidentialOutput", "Head", "Prediction")
_API += ("load_head", "make_head", "read_head")
_IMAGES = ("ImageFolder", "image_features")  # your own images (etn_cli.api.images)
__all__ = ["EtnError", "__version__", "heads", *_API, *_IMAGES]


def __getattr__(name: str) -> Any:
    """Import the API (and with it torch) only when one of its names is first used."""
    if name == "heads":  # the package of heads; ``etn_cli.heads.heads`` is their registry
        return importlib.import_module("etn_cli.heads")
    if name in _API:
        return getattr(importlib.import_module("etn_cli.api.heads"), name)
    if name in _IMAGES:
        return getattr(importlib.import_module("etn_cli.api.images"), name)
    raise AttributeError(f"module 'etn_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
