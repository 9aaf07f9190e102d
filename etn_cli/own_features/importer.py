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

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.own_features.files import FeatureFile, read_classifier_file, read_feature_file
from etn_cli.own_features.units import import_fingerprint
from etn_cli.provenance import provenance
from etn_cli.store import ShardWriter, save_classifier

SHARD_ROWS = 65536
LABELLED_ROLES = ("adapt", "test")


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


def import_files(files: list[Path], out: Path, classifier: Path | None = None) -> list[str]:
    """``etn import``: each file into ``out/<stem>/``, and the classifier (``classifier``, or
    the weight and bias found in a file) into ``out/classifier.safetensors``; one line each."""
    stems = [path.stem for path in files]
    taken = [str(out / stem) for stem in stems if (out / stem).exists()]
    if len(set(stems)) < len(stems) or taken:
        found = f"{taken[0]} exists" if taken else f"two files are named {stems}"
        raise EtnError(
            f"Expected one new folder per file under {out}, but {found}. Remove it, rename the "
            "files or choose another --out."
        )
    read = read_checked({path: "ood" for path in files})
    weights = found_classifier(read, classifier)
    lines = []
    out.mkdir(parents=True, exist_ok=True)
    for path, features in read.items():
        write_split(features, out / path.stem)
        lines.append(f"import: {path} -> {out / path.stem} ({len(features.hidden)} rows)")
    if weights is not None:
        weight, bias, origin = weights
        source = {"kind": "given", "file": str(origin)}
        save_classifier(out / "classifier.safetensors", weight, bias, {"classifier_source": source})
        lines.append(f"import: classifier {tuple(weight.shape)} from {origin}")
    return lines


def found_classifier(
    read: dict[Path, FeatureFile], classifier: Path | None
) -> tuple[np.ndarray, np.ndarray, Path] | None:
    """``(weight, bias, file)`` from the classifier file, else from the first file with one."""
    first = next(iter(read.values()))
    if classifier is None:
        return next(((f.weight, f.bias, p) for p, f in read.items() if f.weight is not None), None)
    d, c = first.hidden.shape[1], first.logits.shape[1]
    return (*read_classifier_file(classifier, d, c), classifier)
