"""Where a ``[features]`` pipeline's splits and classifier live: your own features, as files
or as shard folders (``etn_cli.planning.plan`` builds the plan's units from these answers).

```toml
[features]
adapt = "mine/adapt.npz"             # a feature file (README format), imported into the store
test = "mine/test"                   # or a folder of shard-*.h5 files, read where it is
ood = ["mine/ood.npz"]
classifier = "mine/classifier.npz"   # optional: weight (C, D), bias (C,); or "fit", "none"
```

A **file** becomes a split folder under ``<data>/features/<backbone>-own/`` named by the
sha256 of its bytes (``etn run`` / ``etn extract`` import it, :mod:`.importer`); a **folder** is
read in place, keyed by its manifest or the checksums of its shards, which are recorded at
first use so that later bit rot is refused (:mod:`.folders`).

The **classifier** (``weight``, ``bias``) that last-layer heads start from (``needs_classifier``:
map_edl, ib_edl, laplace, mcd, ensemble) is, in this order: the ``classifier`` file; the
``weight`` / ``bias`` stored in one of the split files; or, when neither is given or with
``classifier = "fit"``, the least-squares fit of the adaptation logits on the hidden states
(:mod:`.classifier`), which recovers the backbone's final layer exactly when the logits are an
affine function of the hidden states, and which every record of those heads names. With
``classifier = "none"`` those heads are skipped, each named in one line with what they miss.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from etn_cli.errors import EtnError
from etn_cli.own_features.files import SUFFIXES, is_feature_file
from etn_cli.own_features.folders import OWN_RECORD, own_folder_key
from etn_cli.store.fingerprint import file_sha256, fingerprint_key

CLASSIFIER = "classifier.safetensors"


def file_digest(path: Path) -> str:
    """``file_sha256``, remembered for this process by path, size and modification time."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(Path(path))


def split_key(path: Path) -> str:
    """The content key of a shard folder with a manifest: the manifest's key."""
    from etn_cli.store.writing.manifest import load_manifest

    return load_manifest(path)["key"]


def import_fingerprint(path: Path) -> dict[str, Any]:
    """What an imported split's manifest records: the file's name and sha256."""
    return {"imported": {"file": path.name, "sha256": file_digest(path)}, "version": 1}


def own_store(pipeline: Any, data_dir: Path) -> Path:
    """Where a ``[features]`` pipeline's imported files and fitted classifier are kept."""
    return data_dir / "features" / f"{pipeline.features.backbone}-own"


def feature_entry(pipeline: Any, store: Path, role: str, entry: str) -> tuple[Path, dict]:
    """The split folder of one ``[features]`` entry and its fingerprint: a file's import
    target under ``store`` (keyed by its sha256), or a folder of shards, where it is."""
    path = pipeline.resolve(entry)
    if path.is_file() and is_feature_file(path):
        key = fingerprint_key(import_fingerprint(path))
        return store / f"{path.stem}-{key}", {"byof": key, "file": str(path)}
    if not path.is_dir():
        raise EtnError(
            f"Feature folder {path} ({pipeline.path} [features] {role}) does not exist. "
            f"Point it at a folder of shard-*.h5 files or a {'/'.join(SUFFIXES)} file."
            + pipeline.standins_hint()
        )
    if (path / "manifest.json").is_file():
        return path, {"byof": split_key(path)}
    key, shards = own_folder_key(path, store.parent / OWN_RECORD)
    return path, {"byof": key, "shards": shards}


def classifier_path(store: Path, source: dict[str, Any] | None) -> Path | None:
    """Where the classifier of ``source`` is kept (keyed by its source); None for none."""
    if source is None:
        return None
    key = fingerprint_key(source, 12)
    return store.with_name(f"{store.name}-classifier-{key}") / CLASSIFIER


def classifier_source(pipeline: Any, plan: Any) -> dict[str, Any] | None:
    """Where the classifier comes from (see the module docstring); None for ``"none"``."""
    choice = pipeline.features.classifier
    if choice == "none":
        return None
    if choice not in (None, "fit"):
        path = pipeline.resolve(choice)
        if not path.is_file():
            raise EtnError(
                f'[features] classifier = "{choice}" names no file ({path}). Give a .safetensors '
                'or .npz file with weight (C, D) and bias (C,), or "fit" or "none".'
            )
        return {"kind": "given", "file": str(path), "sha256": file_digest(path)}
    if choice is None:
        for unit in plan.feature_units:
            file = unit.fingerprint.get("file")
            if file and "weight" in array_names(Path(file)):
                return {"kind": "in a split file", "file": file, "sha256": file_digest(Path(file))}
    return {"kind": "fitted", "adapt": plan.adapt.key, "method": "least squares"}


def array_names(path: Path) -> set[str]:
    """The array names of a feature file, read from its index only; one line when it is not
    a readable file of its kind."""
    from etn_cli.own_features.files import FIX, read_errors

    try:
        return _array_names(path)
    except read_errors() as err:
        raise EtnError(
            f"Cannot read the features in {path} ({type(err).__name__}: {str(err)[:80]}); "
            f"expected a readable {path.suffix} file. {FIX}"
        ) from None


def _array_names(path: Path) -> set[str]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        import zipfile

        with zipfile.ZipFile(path) as archive:
            return {name.removesuffix(".npy") for name in archive.namelist()}
    if suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "np") as handle:
            return set(handle.keys())
    import h5py

    with h5py.File(path, "r") as handle:
        return set(handle.keys())


def drop_unusable(units: list[Any], plan: Any) -> tuple[list[Any], list[str]]:
    """Heads that start from the backbone's classifier, with none to be had (``classifier =
    "none"``), are left out; each gets one line saying what it misses."""
    if plan.classifier_path is not None:
        return units, []
    kept = [u for u in units if not u.head.needs_classifier]
    labels = sorted({u.label for u in units if u.head.needs_classifier})
    if not labels:
        return units, []
    line = (
        f"skipped {', '.join(labels)}: they start from the backbone's final layer (weight, "
        'bias), which [features] classifier = "none" withholds; name a classifier file or '
        'set classifier = "fit" to run them'
    )
    return kept, [line]
