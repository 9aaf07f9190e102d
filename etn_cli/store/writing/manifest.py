"""The ``manifest.json`` of a split folder: what it holds, how it was made, and its content key.

A manifest is written last, inside the private folder, so a split folder that has one under its
final name is complete. Readers trust nothing in it blindly: :mod:`etn_cli.store.reading.reader`
checks every shard against it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.provenance import provenance
from etn_cli.store.artefacts.sealed import SEAL, check_record_seal, seal_record
from etn_cli.store.artefacts.unitkey import check_recorded_key
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import canonical_json, fingerprint_key

FORMAT_VERSION = 1
KIND = "etn-features"
MANIFEST_NAME = "manifest.json"
SHARD_NAME = "shard-{:05d}.h5"
REQUIRED_FIELDS = ("format", "kind", "complete", "fingerprint", "key", "shards")


def default_provenance(command: str | None = None) -> dict[str, Any]:
    """How an artefact was made (etn and library versions, code revision, host, time, command),
    shared with every other artefact etn writes."""
    record = provenance()
    return record if command is None else record | {"command": command}


def build_manifest(
    fingerprint: dict[str, Any],
    shards: list[dict[str, Any]],
    hidden_size: int,
    num_classes: int,
    layers: list[str],
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble a complete manifest; ``shards`` holds ``{"file", "rows", "sha256"}`` entries."""
    return {
        "format": FORMAT_VERSION,
        "kind": KIND,
        "complete": True,
        "fingerprint": json.loads(canonical_json(fingerprint)),
        "key": fingerprint_key(fingerprint),
        "shards": shards,
        "rows": sum(int(shard["rows"]) for shard in shards),
        "hidden_size": int(hidden_size),
        "num_classes": int(num_classes),
        "layers": sorted(layers),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "provenance": {**default_provenance(), **(provenance or {})},
    }


def save_manifest(split_dir: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically, indented so that people can read it.

    Each listed shard's size and modification time (``bytes``, ``mtime_ns``) are recorded
    beside its sha256 as the shard is on disk now, so that readers re-hash only a shard that
    changed since (:func:`shard_unchanged`); ``etn verify`` re-hashes every shard. The
    manifest is sealed by the sha256 of its own content (``record_sha256``).
    """
    for entry in manifest["shards"]:
        path = Path(split_dir) / entry["file"]
        if path.is_file():
            stat = path.stat()
            entry["bytes"], entry["mtime_ns"] = stat.st_size, stat.st_mtime_ns
    sealed = seal_record(json.loads(json.dumps(manifest)))  # sealed as it will read back
    manifest[SEAL] = sealed[SEAL]
    atomic_write_text(Path(split_dir) / MANIFEST_NAME, json.dumps(sealed, indent=2) + "\n")


def split_is_complete(split_dir: Path) -> bool:
    """True when ``split_dir`` holds a manifest marked complete (the skip test of a rerun)."""
    try:
        return load_manifest(split_dir)["complete"] is True
    except EtnError:
        return False


def load_manifest(split_dir: Path) -> dict[str, Any]:
    """Read and check the top level of ``<split_dir>/manifest.json``; shards are checked later."""
    path = Path(split_dir) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedArtefact(
            split_dir, f"Expected a manifest at {path}, found none. Run etn extract for this split."
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        why = "nested too deep" if isinstance(error, RecursionError) else error
        raise DamagedArtefact(
            split_dir,
            f"Manifest {path} is not valid JSON ({why}). Delete the split folder and re-run "
            "extract, or regenerate the manifest with etn_cli.store.reading.reader.write_manifest.",
        ) from None
    if isinstance(manifest, dict) and isinstance(manifest.get("format"), int):
        if manifest["format"] > FORMAT_VERSION:  # a newer etn's: ask for the upgrade first
            check_format(manifest["format"], f"Manifest {path}")
    if isinstance(manifest, dict):
        check_record_seal(manifest, path, Path(split_dir))
    try:
        _check_top_level(manifest, path)
    except EtnError as err:
        raise DamagedArtefact(split_dir, str(err)) from None
    fix = "Delete the split folder and run etn extract again."
    check_recorded_key(Path(split_dir), manifest["key"], f"Manifest {path}", fix)
    return manifest


def check_format(found: Any, what: str) -> None:
    """Accept format 1; name the upgrade for a newer format and reject anything else."""
    if isinstance(found, int) and not isinstance(found, bool) and found > FORMAT_VERSION:
        raise EtnError(
            f"{what} was written by a newer etn (format {found}); this etn reads format "
            f"{FORMAT_VERSION}. Upgrade etn."
        )
    if found != FORMAT_VERSION or isinstance(found, bool):
        raise EtnError(
            f"{what} declares format {found!r}; expected the integer {FORMAT_VERSION}. "
            "Fix the file's format field or re-run extract."
        )


def _check_top_level(manifest: Any, path: Path) -> None:
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        found = manifest.get("kind") if isinstance(manifest, dict) else type(manifest).__name__
        raise EtnError(
            f"Manifest {path} has kind {found!r}; expected {KIND!r}. Point etn at a folder of "
            "feature shards."
        )
    check_format(manifest.get("format"), f"Manifest {path}")
    missing = [field for field in REQUIRED_FIELDS if field not in manifest]
    if missing:
        raise EtnError(
            f"Manifest {path} lacks the fields {', '.join(missing)}. Regenerate it with "
            "etn_cli.store.reading.reader.write_manifest or re-run extract."
        )
    if manifest["complete"] is not True:
        raise EtnError(
            f"Manifest {path} says the split is incomplete. Delete the split folder and run etn "
            "extract again."
        )
    for entry in manifest["shards"]:
        if not (isinstance(entry, dict) and {"file", "rows", "sha256"} <= entry.keys()):
            raise EtnError(
                f"Manifest {path} has a shard entry {entry!r}; expected file, rows and sha256. "
                "Regenerate it with etn_cli.store.reading.reader.write_manifest."
            )
        if not is_plain_name(entry["file"]):
            raise EtnError(
                f"Manifest {path} names shard {entry['file']!r}; expected a file name inside "
                "its folder (no path, '..' or separator). Delete the split folder and run etn "
                "extract again."
            )


def is_plain_name(name: Any) -> bool:
    """A file name that stays in its folder: a string with no separator, not '.' or '..',
    not absolute, no NUL."""
    if not isinstance(name, str) or name in ("", ".", "..") or "\0" in name:
        return False
    return "/" not in name and "\\" not in name and not Path(name).is_absolute()


def shard_unchanged(path: Path, entry: dict[str, Any]) -> bool:
    """Whether the shard at ``path`` has the size and modification time its manifest
    ``entry`` recorded when it was written (False for entries without them)."""
    if "bytes" not in entry or "mtime_ns" not in entry:
        return False
    stat = path.stat()
    return stat.st_size == entry["bytes"] and stat.st_mtime_ns == entry["mtime_ns"]
