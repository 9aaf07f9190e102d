"""A folder sealed by a record: the files of a built unit (a trained head, a fine-tuned
backbone, the digits CNN) and, written last, a JSON record that lists their sha256 and carries
its own (:func:`~etn_cli.store.artefacts.sealed.seal_record`). A folder whose record reads,
matches its seal and agrees with every file it lists is intact; anything else is damage.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etn_cli.errors import EtnError
from etn_cli.store.artefacts.headfiles import read_json_object
from etn_cli.store.artefacts.sealed import check_record_seal, seal_record
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import file_sha256


def write_record(
    folder: Path, name: str, record: dict[str, Any], files: Sequence[str] | None = None
) -> dict[str, Any]:
    """Write ``record`` as ``folder/name`` with ``files`` (the sha256 of the named files, or of
    every file in ``folder`` when None) and its seal; return it as written (it reads back the
    same: JSON types, sealed)."""
    folder = Path(folder)
    if files is None:
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    record = {**record, "files": {f: file_sha256(folder / f) for f in files}}
    sealed = seal_record(json.loads(json.dumps(record)))
    atomic_write_text(folder / name, json.dumps(sealed, indent=2) + "\n")
    return sealed


def read_record(folder: Path, name: str) -> dict[str, Any]:
    """The record ``folder/name`` after checking its seal (an older etn's, without one, passes);
    :class:`EtnError` saying what is wrong otherwise."""
    path = Path(folder) / name
    record = read_json_object(path)
    check_record_seal(record, path, Path(folder))
    return record


def record_damage(folder: Path, name: str) -> str | None:
    """None when ``folder``'s record reads, matches its seal and every file it lists matches
    its sha256; "missing" without a folder; otherwise what is damaged."""
    folder = Path(folder)
    if not folder.exists():
        return "missing"
    try:
        record = read_record(folder, name)
    except EtnError as err:
        return str(err)
    return files_damage(folder, name, record)


def files_damage(folder: Path, name: str, record: dict[str, Any]) -> str | None:
    """What differs between the files in ``folder`` and the sha256 that ``record`` (read from
    ``folder/name``) lists; None when nothing does."""
    files = record.get("files") or {}
    for file, digest in files.items() if isinstance(files, dict) else ():
        path = Path(folder) / file
        found = file_sha256(path) if path.is_file() else "missing"
        if found != digest:
            return (
                f"{path} has sha256 {found[:12]}… but {name} records {str(digest)[:12]}…: "
                "the file changed or is corrupt."
            )
    return None


def intact_record(folder: Path, name: str) -> dict[str, Any] | None:
    """The record ``folder/name`` when it reads and matches its seal (its files are not
    checked), else None: what planning may trust of a unit without building it."""
    try:
        return read_record(folder, name)
    except EtnError:
        return None
