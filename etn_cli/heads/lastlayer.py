"""Helpers shared by the heads that start from the backbone's classifier or check settings."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from etn_cli.errors import EtnError
from etn_cli.heads.base import to_tensor


def classifier_tensors(
    classifier: dict[str, Any], n_features: int, n_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's final layer as float32 ``weight`` (C, D) and ``bias`` (C,), checked
    against the features it will read."""
    missing = {"weight", "bias"} - set(classifier)
    if missing:
        raise EtnError(
            f"The classifier must hold 'weight' and 'bias', missing {sorted(missing)}. "
            "Save it with etn_cli.store.artefacts.classifier.save_classifier."
        )
    weight = to_tensor(classifier["weight"], torch.float32)
    bias = to_tensor(classifier["bias"], torch.float32)
    if weight.shape != (n_classes, n_features) or bias.shape != (n_classes,):
        raise EtnError(
            f"Expected a classifier of weight ({n_classes}, {n_features}) and bias "
            f"({n_classes},) for these features, got {tuple(weight.shape)} and "
            f"{tuple(bias.shape)}. Use the classifier of the backbone that made the features."
        )
    if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise EtnError("The classifier contains non-finite weights. Re-extract the backbone.")
    return weight, bias


def linear_from_classifier(
    classifier: dict[str, Any], n_features: int, n_classes: int
) -> nn.Linear:
    """An ``nn.Linear(D, C)`` holding the backbone's classifier, so ``layer(h) == h W^T + c``."""
    weight, bias = classifier_tensors(classifier, n_features, n_classes)
    layer = nn.Linear(n_features, n_classes)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer
