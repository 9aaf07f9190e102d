"""Whether a finished unit is still whole: a trained head's folder, a metrics file, the stored
classifier. The cheap checks a stage makes before it skips a unit, and ``etn status`` makes
to call one ``damaged``; torch-free."""

from __future__ import annotations

from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.store.artefacts.classifier import load_classifier
from etn_cli.store.artefacts.headfiles import check_head_folder
from etn_cli.store.artefacts.predictions import predictions_path
from etn_cli.store.artefacts.sealed import seal_state, sidecar


def head_damage(path: Path) -> str | None:
    """None when the head folder is whole (its files match the checksums in ``train.json``);
    "missing" when there is none; otherwise what is damaged."""
    if not path.exists():
        return "missing"
    try:
        check_head_folder(path)
    except EtnError as err:
        return str(err)
    return None


def metrics_damage(path: Path) -> str | None:
    """None when the metrics file at ``path`` and its predictions file
    (:mod:`etn_cli.store.artefacts.predictions`) agree with their recorded sha256; else why not."""
    for part in (path, predictions_path(path)):
        if not part.exists() and not sidecar(part).exists():
            return "missing"
        if (state := seal_state(part)) is not None:
            return state
    return None


def classifier_damage(path: Path) -> str | None:
    """None when the stored classifier reads and matches its recorded sha256; else why not."""
    if not path.exists():
        return "missing"
    try:
        load_classifier(path)
    except EtnError as err:
        return str(err)
    return None
