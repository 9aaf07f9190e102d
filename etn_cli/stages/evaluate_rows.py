"""The columns a head's predictions on one eval set give the per-row predictions file
(:mod:`etn_cli.store.artefacts.predictions`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from etn_cli.metrics.evaluation import NLL_FLOOR
from etn_cli.store.artefacts.predictions import SCORE_PREFIX


def row_columns(
    prediction: Any, index: np.ndarray, labels: np.ndarray | None, extra: dict | None = None
) -> dict[str, Any]:
    """The columns of one eval set: ``labels`` (N,) for the ID test set, None for OOD rows."""
    probs = np.asarray(prediction.probs, dtype=np.float64)  # (N, C)
    predicted = np.asarray(prediction.predictions, dtype=np.int64)  # (N,)
    rows = np.arange(len(predicted))
    columns: dict[str, Any] = {
        "row": np.asarray(index, dtype=np.int64),
        "prediction": predicted,
        "confidence": probs.max(axis=1),
        "label": None,
        "correct": None,
        "nll": None,
        "brier": None,
    }
    if labels is not None:
        labels = np.asarray(labels, dtype=np.int64)
        onehot = np.zeros_like(probs)
        onehot[rows, labels] = 1.0
        columns |= {
            "label": labels,
            "correct": predicted == labels,
            "nll": -np.log(np.clip(probs[rows, labels], NLL_FLOOR, None)),
            "brier": ((probs - onehot) ** 2).sum(axis=1),
        }
    scores = {f"{SCORE_PREFIX}{k}": np.asarray(v, np.float64) for k, v in prediction.scores.items()}
    return columns | scores | (extra or {})
