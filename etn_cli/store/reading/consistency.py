"""Checks across the splits of one pipeline, run before ``train`` or ``evaluate`` writes anything.

Each split may be fine on its own and still make a wrong number together with the others:
shards from two backbones, an OOD set with no rows, test labels outside the classifier's
classes, a test set of one class. These checks read manifests (or shard layouts for the user's
own shards) and the label arrays only, so they cost little next to the stage they protect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store.fingerprint import canonical_json, fingerprint_key
from etn_cli.store.reading.reader import check_same_columns
from etn_cli.store.writing.manifest import MANIFEST_NAME, load_manifest
from etn_cli.store.writing.shardfile import inspect_shard, list_shard_files, open_shard

FIX_SAME_MODEL = "Point every split at features of one model (re-extract the odd one)."
CALIBRATION = "conformal calibration set"


@dataclass(frozen=True)
class SplitInfo:
    """What a split folder says about itself without reading its feature values."""

    role: str  # "adaptation set", "ID test set" or "OOD set 'name'"
    path: Path
    rows: int
    hidden_size: int
    num_classes: int
    backbone: str | None  # canonical JSON of the manifest's backbone fingerprint, if any
    files: list[str]


def split_info(role: str, path: Path) -> SplitInfo:
    """Rows, widths and backbone of a split folder, from its manifest or its shards' layouts."""
    path = Path(path)
    if not path.is_dir():
        raise EtnError(
            f"Expected the {role} at {path}, found no folder. Run etn extract (or etn run) "
            "first, or point [features] at a folder of shard-*.h5 files."
        )
    if (path / MANIFEST_NAME).exists():
        manifest = load_manifest(path)
        fingerprint = manifest["fingerprint"]
        backbone = fingerprint.get("backbone") if isinstance(fingerprint, dict) else None
        return SplitInfo(
            role,
            path,
            int(manifest.get("rows", sum(int(s["rows"]) for s in manifest["shards"]))),
            int(manifest.get("hidden_size", -1)),
            int(manifest.get("num_classes", -1)),
            None if backbone is None else canonical_json(backbone),
            [entry["file"] for entry in manifest["shards"]],
        )
    files = list_shard_files(path)
    layouts = [inspect_shard(path, file) for file in files]
    check_same_columns(path, layouts)
    widths = layouts[0].widths
    rows = sum(layout.rows for layout in layouts)
    return SplitInfo(role, path, rows, widths["hidden"], widths["logits"], None, files)


def split_labels(info: SplitInfo) -> np.ndarray:
    """The ``labels`` (N,) of every shard of a split, concatenated."""
    parts = []
    try:
        for file in info.files:
            with open_shard(info.path / file, f"shard {info.path.name}/{file}") as handle:
                parts.append(np.asarray(handle["labels"][()], dtype=np.int64))
    except EtnError as err:
        if (info.path / MANIFEST_NAME).exists():  # etn wrote and checked it: this is damage
            raise DamagedArtefact(info.path, str(err)) from None
        raise
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def check_splits(
    adapt: Path, test: Path, ood: dict[str, Path], calibration: Path | None = None
) -> None:
    """The adaptation, test, OOD and conformal calibration splits can be used together; one
    EtnError line if not."""
    infos = [split_info("adaptation set", adapt), split_info("ID test set", test)]
    infos += [split_info(f"OOD set {name!r}", path) for name, path in ood.items()]
    own = None
    if calibration is not None:
        own = split_info(CALIBRATION, calibration)
        own = (own, split_labels(own))
    check_split_infos(infos, split_labels(infos[0]), split_labels(infos[1]), own)


def check_split_infos(
    infos: list[SplitInfo],
    adapt: np.ndarray,
    test: np.ndarray,
    calibration: tuple[SplitInfo, np.ndarray] | None = None,
) -> None:
    """:func:`check_splits` on what is known of the splits (adaptation, test, then the OOD
    sets) and the adaptation, test and calibration labels, wherever they come from (a feature
    file about to be imported is checked before it is written). Calibration labels are checked
    as the adaptation labels are: a row without one (-1) would be scored as if its top class
    were right, and the sets would miss their coverage."""
    first = infos[0]
    if calibration is not None:
        infos = [*infos, calibration[0]]
    for info in infos:
        if info.rows == 0:
            raise EtnError(
                f"The {info.role} at {info.path} holds no rows; expected at least one sample. "
                "Check the dataset split, or remove it from the pipeline."
            )
        _check_same_source(first, info)
    check_labels(infos[0], adapt, need_two=False)
    check_labels(infos[1], test, need_two=True)
    if calibration is not None:
        check_labels(*calibration, need_two=False)


def _check_same_source(first: SplitInfo, info: SplitInfo) -> None:
    if (info.hidden_size, info.num_classes) != (first.hidden_size, first.num_classes):
        raise EtnError(
            f"The {info.role} has hidden size {info.hidden_size} and {info.num_classes} classes "
            f"but the {first.role} has {first.hidden_size} and {first.num_classes}; expected "
            f"the same backbone for every split. {FIX_SAME_MODEL}"
        )
    if first.backbone is not None and info.backbone is not None and first.backbone != info.backbone:
        raise EtnError(
            f"The {info.role} ({info.path.name}) was extracted by backbone "
            f"{_short(info.backbone)} but the {first.role} by {_short(first.backbone)}; expected "
            f"one backbone for every split. {FIX_SAME_MODEL}"
        )


def check_labels(info: SplitInfo, labels: np.ndarray, need_two: bool) -> None:
    """Every label a class of the logits (none missing, -1), and two classes if ``need_two``."""
    c = info.num_classes
    if len(labels) and labels.min() == -1 and (labels == -1).all():
        raise EtnError(
            f"The {info.role} at {info.path} has no labels (all {len(labels)} rows are -1); "
            f"expected one class index in 0..{c - 1} per row. Point it at a labelled split."
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= c):
        raise EtnError(
            f"Labels of the {info.role} lie in {labels.min()}..{labels.max()}, but the logits "
            f"have {c} classes; expected labels in 0..{c - 1}. Map the labels to the backbone's "
            "classes."
        )
    classes = np.unique(labels)
    if need_two and len(classes) < 2:
        raise EtnError(
            f"The {info.role} at {info.path} holds only class {classes[0]} in its {len(labels)} "
            "rows; expected at least two classes, or confidence metrics cannot rank right against "
            "wrong. Use a test split with several classes."
        )


def check_varies(logits: np.ndarray, role: str, path: Path) -> None:
    """Logits (N, C) identical in every row would make every score constant and every ranking
    metric meaningless; refuse them."""
    if len(logits) >= 2 and np.all(logits == logits[0]):
        raise EtnError(
            f"Logits of the {role} at {path} are the same in all {len(logits)} rows; expected "
            "outputs that vary with the input, or every score is constant. Check the backbone "
            "and re-extract."
        )


def _short(backbone: str) -> str:
    """A readable name for a backbone fingerprint: its name field and its key."""
    value: Any = json.loads(backbone)
    name = value.get("name") if isinstance(value, dict) else None
    key = fingerprint_key(value, 8)
    return f"{name!r} ({key})" if isinstance(name, str) else key
