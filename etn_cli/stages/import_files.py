"""``etn import``: your own feature files into shard folders, each split written under its
lock (:func:`~etn_cli.stages.units.holding`), after every file is read and checked
(:mod:`etn_cli.own_features.importer`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.own_features.files import FeatureFile, read_classifier_file
from etn_cli.own_features.importer import read_checked, write_split
from etn_cli.own_features.units import import_fingerprint
from etn_cli.stages.units import holding
from etn_cli.store.artefacts.classifier import save_classifier
from etn_cli.store.fingerprint import fingerprint_key
from etn_cli.store.reading.reader import split_damage
from etn_cli.store.writing.manifest import load_manifest


def import_files(files: list[Path], out: Path, classifier: Path | None = None) -> list[str]:
    """``etn import``: each file into ``out/<stem>/``, and the classifier (``classifier``, or
    the weight and bias found in a file) into ``out/classifier.safetensors``; one line each.

    Every file is read and checked, and every target folder too, before anything is written.
    A rerun after a kill resumes: a folder already holding this very file's import is kept, a
    killed run's ``.partial-`` folder is removed under the folder's lock."""
    stems = [path.stem for path in files]
    if len(set(stems)) < len(stems):
        raise EtnError(
            f"Expected one new folder per file under {out}, but two files are named {stems}. "
            "Rename the files or import them into separate folders."
        )
    if out.exists() and not out.is_dir():
        raise EtnError(
            f"--out {out} is a file; expected a folder to write the splits into (new, or one an "
            "earlier etn import wrote). Choose another --out."
        )
    done = {path for path in files if imported_already(path, out / path.stem)}
    todo = {path: "ood" for path in files if path not in done}
    read = read_checked(todo) if todo else {}
    weights = found_classifier(read, classifier) if read or classifier else None
    lines = [f"import: {path} -> {out / path.stem}: up to date" for path in files if path in done]
    out.mkdir(parents=True, exist_ok=True)
    for path, features in read.items():
        target = out / path.stem
        with holding(target):  # its lock, a killed run's leftovers cleared
            write_split(features, target)
        lines.append(f"import: {path} -> {target} ({len(features.hidden)} rows)")
    if weights is not None:
        weight, bias, origin = weights
        source = {"kind": "given", "file": str(origin)}
        save_classifier(out / "classifier.safetensors", weight, bias, {"classifier_source": source})
        lines.append(f"import: classifier {tuple(weight.shape)} from {origin}")
    return lines


def imported_already(path: Path, target: Path) -> bool:
    """Whether ``target`` is a whole import of this very file; one line when it holds
    anything else, which an import never overwrites."""
    if not target.exists():
        return False
    expected = fingerprint_key(import_fingerprint(path))
    try:
        same = load_manifest(target)["key"] == expected and split_damage(target) is None
    except EtnError:
        same = False
    if not same:
        raise EtnError(
            f"Expected a new folder for {path.name} under {target.parent}, but {target} exists "
            "and holds something else. Remove it, rename the file or choose another --out."
        )
    return True


def found_classifier(
    read: dict[Path, FeatureFile], classifier: Path | None
) -> tuple[np.ndarray, np.ndarray, Path] | None:
    """``(weight, bias, file)`` from the classifier file, else from the first file with one."""
    first = next(iter(read.values()))
    if classifier is None:
        return next(((f.weight, f.bias, p) for p, f in read.items() if f.weight is not None), None)
    d, c = first.hidden.shape[1], first.logits.shape[1]
    return (*read_classifier_file(classifier, d, c), classifier)
