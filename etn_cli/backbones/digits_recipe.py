"""The digits CNN's recipe, torch-free: the key of its stage zero (the folder its trained
weights live in), its module names and its fingerprint, which planning computes from settings
and the stage-zero record alone (:mod:`etn_cli.backbones.digits_cnn` trains and runs it).

The weights are keyed by their recipe (the settings that train them, the train split's
fingerprint and :data:`CODE_VERSION`), as a fine-tuned backbone is keyed by its ``[finetune]``
unit; the features' fingerprint names the weights by the sha256 their record holds."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from etn_cli.backbones.layer_names import named_layers
from etn_cli.backbones.settings import DigitsCNNConfig as Config

NAME = "digits_cnn"
CODE_VERSION = "2"  # bump whenever the architecture or training recipe changes (2: float64)
WEIGHTS_FILE = "model.safetensors"
META_FILE = "meta.json"  # how the weights were trained, and their sha256 (checked at each load)
NOT_BUILT = "not built"

# The modules of DigitsCNN by name (``named_modules()`` less the model itself), so that a
# misspelt ``layers`` entry is refused while planning, before any model is built.
MODULE_NAMES = (
    "features", *(f"features.{i}" for i in range(8)), "dropout", "classifier"
)  # fmt: skip


class _Named:
    """Stands in for the model where only its module names are asked for."""

    def named_modules(self) -> list[tuple[str, None]]:
        return [(name, None) for name in MODULE_NAMES]


def check_layers(layers: tuple[str, ...]) -> None:
    """A misspelt ``layers`` entry, refused with the names the model has."""
    named_layers(_Named(), layers)


def cache_key(config: Config) -> str:
    """A short sha256 of everything that determines the trained weights: the training
    settings, the digits ``train`` split's fingerprint (no data loaded) and the code."""
    from etn_cli.datasets.digits import Digits

    payload = {
        "config": config.training(),
        "train": Digits().split_fingerprint("train"),
        "code_version": CODE_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def stage_zero_folder(config: Config, cache_dir: Path) -> Path:
    """``<data>/backbones/digits_cnn-<recipe key>``: where the trained weights live."""
    return Path(cache_dir) / f"{NAME}-{cache_key(config)}"


def recorded_sha256(folder: Path, record: dict[str, Any] | None) -> str:
    """The weights' sha256 that the stage-zero record lists (an older etn's, listing none:
    the file's own), or "not built"."""
    files = (record or {}).get("files")
    recorded = files.get(WEIGHTS_FILE) if isinstance(files, dict) else None
    weights = Path(folder) / WEIGHTS_FILE
    if record is not None and recorded is None and weights.is_file():
        recorded = hashlib.sha256(weights.read_bytes()).hexdigest()
    return recorded or NOT_BUILT


def digits_fingerprint(config: Config, weights_sha256: str) -> dict[str, Any]:
    """What the extracted features depend on: the settings, the weights, the code."""
    return {
        "name": NAME,
        "config": dataclasses.asdict(config),
        "weights_sha256": weights_sha256,
        "code_version": CODE_VERSION,
    }
