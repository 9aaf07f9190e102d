"""Turning feature files into etn's split folders: ``etn import``, and the first step of
``etn run`` / ``etn extract`` for a ``[features]`` pipeline that names files.

Every file is read and checked first (format, labels where the split needs them, one hidden
size and class count across the files), then each becomes a split folder of HDF5 shards with
a manifest (written under a private name and renamed when complete, as ``etn extract`` does),
so a bad file stops the import before anything is written. The manifest's fingerprint is the
file's name and sha256, and it records where the rows came from (``imported_from``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.own_features.files import FeatureFile, read_feature_file
from etn_cli.own_features.units import import_fingerprint
from etn_cli.provenance import provenance
from etn_cli.store.writing.writer import ShardWriter

SHARD_ROWS = 65536
LABELLED_ROLES = ("adapt", "test", "calibration")


def read_checked(files: dict[Path, str]) -> dict[Path, FeatureFile]:
    """Read every ``file -> role``; refuse missing labels where the role needs them and files
    that disagree on the hidden size or the class count."""
    read = {path: read_feature_file(path) for path in files}
    for path, role in files.items():
        if role in LABELLED_ROLES and read[path].labels is None:
            raise EtnError(
                f"{path} has no 'labels' array, but it is the {role} split; expected one class "
                "index per row (only OOD splits may leave labels out)."
            )
    shapes = {path: (f.hidden.shape[1], f.logits.shape[1]) for path, f in read.items()}
    first = next(iter(shapes))
    for path, shape in shapes.items():
        if shape != shapes[first]:
            raise EtnError(
                f"{path} has hidden size {shape[0]} and {shape[1]} classes but {first} has "
                f"{shapes[first][0]} and {shapes[first][1]}; expected features of one model."
            )
    return read


def check_before_import(plan: Any, read: dict[Path, FeatureFile]) -> None:
    """The checks ``train`` and ``evaluate`` make across a pipeline's splits (one model, rows,
    labels in range, two test classes, logits that vary), made before any file of ``read``
    is imported: on the files' arrays, and on the folders of the splits imported already or
    read in place."""
    from etn_cli.store.reading.consistency import (
        CALIBRATION,
        SplitInfo,
        check_split_infos,
        check_varies,
        split_info,
        split_labels,
    )

    roles = [("adaptation set", plan.adapt), ("ID test set", plan.test)]
    roles += [(f"OOD set {unit.name!r}", unit) for unit in plan.ood]
    if plan.calibration is not None:
        roles.append((CALIBRATION, plan.calibration))
    infos, labels = [], []
    for i, (role, unit) in enumerate(roles):
        file = (unit.fingerprint or {}).get("file")
        features = read.get(Path(file)) if file else None
        if features is None:
            infos.append(split_info(role, unit.path))
            labels.append(split_labels(infos[-1]) if i < 2 or role == CALIBRATION else None)
            continue
        n, d, c = len(features.hidden), features.hidden.shape[1], features.logits.shape[1]
        infos.append(SplitInfo(role, features.path, n, d, c, None, []))
        labels.append(features.labels if features.labels is not None else np.empty(0, np.int64))
        if i < 2:
            check_varies(features.logits, role, features.path)
    own = (infos.pop(), labels.pop()) if plan.calibration is not None else None
    check_split_infos(infos, labels[0], labels[1], own)


def write_split(features: FeatureFile, target: Path) -> None:
    """One split folder (shards + manifest) holding the file's rows."""
    fingerprint = import_fingerprint(features.path)
    n = len(features.hidden)
    labels = features.labels if features.labels is not None else np.full(n, -1, np.int64)
    with ShardWriter(target, fingerprint, SHARD_ROWS, provenance()) as writer:
        for start in range(0, n, SHARD_ROWS):
            rows = slice(start, start + SHARD_ROWS)
            layers = {name: array[rows] for name, array in features.layers.items()}
            arrays = (features.hidden, features.logits, labels, features.index)
            writer.append(*(a[rows] for a in arrays), layers)
        writer.extra["imported_from"] = {**fingerprint["imported"], "path": str(features.path)}
