"""The backbone's own final layer, stored once per backbone as a safetensors file.

Several baselines (map_edl, ib_edl, laplace, ensemble, ...) start from the backbone's classifier
rather than from scratch, so ``extract`` saves ``weight`` (C, D) and ``bias`` (C,) next to the
shards: the torchvision head, or for an LLM the answer-letter rows of ``lm_head``. Arrays travel
as numpy float32, so reading them never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store.artefacts.sealed import read_sealed, write_sealed
from etn_cli.store.writing.checks import check_finite, to_numpy
from etn_cli.store.writing.manifest import FORMAT_VERSION, default_provenance

CLASSIFIER_KIND = "etn-classifier"


def save_classifier(path: Path, weight: Any, bias: Any, provenance: dict[str, Any]) -> None:
    """Write ``weight`` (C, D) and ``bias`` (C,) atomically, with provenance in the metadata,
    then the file's sha256 beside it (``classifier.safetensors.sha256``)."""
    tensors = {
        "weight": np.ascontiguousarray(to_numpy(weight), dtype=np.float32),  # (C, D)
        "bias": np.ascontiguousarray(to_numpy(bias), dtype=np.float32),  # (C,)
    }
    _check_shapes(tensors["weight"], tensors["bias"], f"the classifier for {Path(path).name}")
    metadata = {
        "kind": CLASSIFIER_KIND,
        "etn_format": str(FORMAT_VERSION),
        "provenance": json.dumps({**default_provenance(), **provenance}, sort_keys=True),
    }
    write_sealed(Path(path), save(tensors, metadata=metadata))


def load_classifier(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(weight, bias)`` as float32 arrays of shapes (C, D) and (C,), after checking
    the file against its recorded sha256 (:class:`DamagedArtefact` when it differs)."""
    path = Path(path)
    if not path.is_file():
        raise EtnError(
            f"Expected the backbone's classifier at {path}, found none. Re-run etn extract for "
            "this backbone (it saves the final layer once), or save it with save_classifier."
        )
    data = read_sealed(path)
    try:
        tensors = load(data)
    except SafetensorError as error:
        raise DamagedArtefact(
            path,
            f"Classifier file {path} is not a valid safetensors file ({error}). Delete it and "
            "re-run etn extract for this backbone.",
        ) from None
    if set(tensors) != {"weight", "bias"}:
        raise EtnError(
            f"Classifier file {path} holds tensors {sorted(tensors)}; expected weight and bias. "
            "Save it with etn_cli.store.artefacts.classifier.save_classifier."
        )
    weight = tensors["weight"].astype(np.float32, copy=False)  # (C, D)
    bias = tensors["bias"].astype(np.float32, copy=False)  # (C,)
    _check_shapes(weight, bias, f"classifier file {path}")
    return weight, bias


def _check_shapes(weight: np.ndarray, bias: np.ndarray, where: str) -> None:
    if weight.ndim != 2 or bias.shape != (weight.shape[0],):
        raise EtnError(
            f"Weight and bias in {where} have shapes {weight.shape} and {bias.shape}; expected "
            "(C, D) and (C,). Pass the final linear layer's weight and bias unchanged."
        )
    fix = "Check the backbone's final layer."
    check_finite(weight, "Classifier weights", where, 0, fix)
    check_finite(bias, "Classifier biases", where, 0, fix)
