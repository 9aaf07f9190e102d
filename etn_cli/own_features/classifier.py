"""The classifier of your own features: given, stored in a split file, or fitted.

Last-layer heads (map_edl, ib_edl, laplace, mcd, ensemble) start from the backbone's final
layer ``logits = hidden @ W.T + b``. ``etn extract`` stores it; for your own features it comes
from where :func:`etn_cli.own_features.units.classifier_source` found it, and is written once
into ``classifier.safetensors`` under a folder named by that source's key, with the source in
the file's provenance metadata. When none is given it is fitted on the adaptation split by
least squares,

    [W  b] = argmin || [H 1] [W b]^T - Z ||_F      (numpy.linalg.lstsq, float64, SVD-based),

which is the backbone's own layer whenever the stored logits are an affine function of the
stored hidden states (then the relative residual ``||[H 1][W b]^T - Z|| / ||Z - mean(Z)||`` is
at rounding level); otherwise it is the best affine approximation, and its residual says how
far from the logits it is. With fewer rows than hidden dimensions + 1 the fit is the
minimum-norm solution, which reproduces the adaptation logits without being unique; the record
says so. Every head trained from it records the source in its ``train.json``, and every
metrics row in its ``classifier`` column.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.own_features.files import read_classifier_file
from etn_cli.store.artefacts.classifier import load_classifier
from etn_cli.store.reading.reader import read_split

AFFINE_TOLERANCE = 1e-3  # relative residual below which the fit is the backbone's own layer


def fit_last_layer(hidden: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(W (C, D), b (C,), relative residual)`` of the least-squares fit (module docstring)."""
    h = np.hstack([hidden.astype(np.float64), np.ones((len(hidden), 1))])  # (N, D + 1)
    z = logits.astype(np.float64)  # (N, C)
    solution, *_ = np.linalg.lstsq(h, z, rcond=None)  # (D + 1, C)
    spread = np.linalg.norm(z - z.mean(axis=0))
    residual = np.linalg.norm(h @ solution - z) / max(spread, np.finfo(np.float64).tiny)
    return solution[:-1].T.astype(np.float32), solution[-1].astype(np.float32), float(residual)


def build_classifier(plan: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """``(weight, bias, record)`` from the plan's classifier source."""
    source = dict(plan.classifier_source)
    if source["kind"] != "fitted":
        weight, bias = read_classifier_file(Path(source["file"]))
        return weight, bias, source
    adapt = read_split(plan.adapt.path)
    weight, bias, residual = fit_last_layer(adapt.hidden, adapt.logits)
    rows, dims = adapt.hidden.shape
    source |= {
        "relative_residual": residual,
        "affine": residual <= AFFINE_TOLERANCE,
        "rows": rows,
        "hidden_size": dims,
        "unique": rows > dims + 1,
    }
    return weight, bias, source


def classifier_for(plan: Any, shape: tuple[int, int] | None = None) -> tuple[np.ndarray, ...]:
    """The plan's classifier ``(weight (C, D), bias (C,))`` (for your own features, ``etn
    train`` builds it once first: :class:`etn_cli.stages.head_inputs.OwnClassifier`); with
    ``shape`` = (C, D), one of another shape is refused."""
    path = plan.classifier_path
    weight, bias = load_classifier(path)
    check_shape(weight, shape, path)
    return weight, bias


def check_shape(weight: np.ndarray, shape: tuple[int, int] | None, where: Any) -> None:
    if shape is not None and weight.shape != shape:
        raise EtnError(
            f"The classifier in {where} has weight {weight.shape}, but the features have "
            f"{shape[0]} classes and hidden size {shape[1]}; expected weight {shape}. Give the "
            "classifier of the model that made the features."
        )


def classifier_record(path: Path | None) -> dict[str, Any] | None:
    """How a stored classifier was made: ``{"kind": "backbone"}`` for one ``etn extract``
    wrote, else the source recorded when it was built (given, in a split file, fitted)."""
    if path is None or not Path(path).is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), "np") as handle:
        metadata = handle.metadata() or {}
    provenance = json.loads(metadata.get("provenance", "{}"))
    return provenance.get("classifier_source", {"kind": "backbone"})


def describe(record: dict[str, Any] | None) -> str | None:
    """One phrase for a metrics row: where the classifier of a last-layer head came from."""
    if record is None:
        return None
    kind = record.get("kind")
    if kind == "fitted":
        shape = "unique" if record.get("unique", True) else "minimum-norm, rows <= dims"
        return (
            f"fitted on the adaptation split by least squares ({shape}; relative residual "
            f"{record.get('relative_residual', float('nan')):.2g})"
        )
    if kind == "backbone":
        return "the backbone's final layer"
    return f"given ({kind}: {Path(record.get('file', '?')).name})"
