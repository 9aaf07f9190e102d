"""A trained head's folder: ``head.json``, ``weights.safetensors`` and ``train.json``, written last.

``train.json`` records how the head was trained and the sha256 of the other two files, and is
sealed by the sha256 of its own content (:mod:`.sealed`), so a changed or corrupt checkpoint is
caught before it is scored or used to predict. ``Head.save`` also writes ``checksums.sha256``
(``sha256sum`` format) beside the two files, so a head saved from Python, without
``train.json``, is checked too when it is loaded. Only JSON and safetensors are ever read;
nothing here imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store.artefacts.sealed import check_record_seal
from etn_cli.store.artefacts.unitkey import check_recorded_key, named_key
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import file_sha256
from etn_cli.store.notes import note_once

RECORD = "train.json"
CHECKED_FILES = ("head.json", "weights.safetensors")
HEAD_FIELDS = ("head", "config", "n_features", "n_classes")
CHECKSUMS = "checksums.sha256"  # written by Head.save, for folders without train.json


def head_checksums(folder: Path) -> dict[str, str]:
    """sha256 of ``head.json`` and ``weights.safetensors`` in ``folder``."""
    return {name: file_sha256(Path(folder) / name) for name in CHECKED_FILES}


def seal_head_files(folder: Path) -> None:
    """Record the sha256 of ``head.json`` and ``weights.safetensors`` in ``checksums.sha256``
    (called by ``Head.save`` after writing both)."""
    lines = "".join(f"{digest}  {name}\n" for name, digest in head_checksums(folder).items())
    atomic_write_text(Path(folder) / CHECKSUMS, lines)


def check_saved_head(folder: Path) -> None:
    """Check a head folder without ``train.json`` against its ``checksums.sha256``; one that
    has none (saved by an older etn) is said once to load unchecked."""
    folder = Path(folder)
    fix = "Save the head again (Head.save) or retrain it."
    try:
        text = (folder / CHECKSUMS).read_text(encoding="ascii")
    except FileNotFoundError:
        note_once(f"note: head folder {folder} carries no checksums (saved by an older etn)")
        return
    except (OSError, UnicodeDecodeError):
        text = ""
    recorded = dict(reversed(line.split("  ", 1)) for line in text.splitlines() if "  " in line)
    if set(recorded) != set(CHECKED_FILES) or any(len(d) != 64 for d in recorded.values()):
        raise DamagedArtefact(folder, f"The checksum file {folder / CHECKSUMS} is damaged. {fix}")
    for name, found in head_checksums(folder).items():
        if found != recorded[name]:
            raise DamagedArtefact(
                folder,
                f"Head folder {folder} is damaged: {name} has sha256 {found[:12]}… but "
                f"{CHECKSUMS} records {recorded[name][:12]}…: the file changed or is corrupt. "
                + fix,
            )


def check_head_folder(folder: Path) -> dict[str, Any]:
    """Check that a head folder is whole and unchanged; return its ``train.json`` record.

    Raises :class:`DamagedArtefact` naming the first problem and saying to delete the folder
    and train again (``etn run`` retrains it by itself).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise EtnError(
            f"Expected the trained head at {folder}, found none. Run etn train (or etn run) first."
        )
    fix = f"Delete {folder} and run etn train again."
    try:
        record = read_json_object(folder / RECORD, fix)
    except EtnError as err:
        raise DamagedArtefact(folder, str(err)) from None
    check_record_seal(record, folder / RECORD, folder)
    check_recorded_key(folder, record.get("key"), str(folder / RECORD), fix)
    files = record.get("files")
    if not isinstance(files, dict) or set(files) != set(CHECKED_FILES):
        what = " and ".join(CHECKED_FILES)
        raise DamagedArtefact(folder, f"{folder / RECORD} records no checksums of {what}. {fix}")
    for name, expected in files.items():
        path = folder / name
        found = file_sha256(path) if path.is_file() else "missing"
        if found != expected:
            raise DamagedArtefact(
                folder,
                f"Head file {path} has sha256 {found[:12]}… but {RECORD} records "
                f"{str(expected)[:12]}…: the file changed or is corrupt. {fix}",
            )
    try:
        meta = read_json_object(folder / "head.json", fix)
    except EtnError as err:
        raise DamagedArtefact(folder, str(err)) from None
    missing = [name for name in HEAD_FIELDS if name not in meta]
    if missing:
        raise DamagedArtefact(folder, f"{folder / 'head.json'} lacks {', '.join(missing)}. {fix}")
    check_head_name(folder, meta["head"], record.get("head"), fix)
    try:
        with safe_open(folder / "weights.safetensors", "np") as handle:
            handle.keys()
    except (SafetensorError, OSError) as err:
        raise DamagedArtefact(
            folder,
            f"{folder / 'weights.safetensors'} is not a readable safetensors file ({err}). {fix}",
        ) from None
    return record


def check_head_name(folder: Path, head: object, recorded: object, fix: str) -> None:
    """``head.json`` and ``train.json`` name one head, the one a keyed folder is named after
    (``etn-<key>`` holds an ETN head)."""
    named = folder.name.removesuffix(f"-{named_key(folder)}") if named_key(folder) else None
    if (recorded is not None and head != recorded) or (named is not None and head != named):
        raise DamagedArtefact(
            folder,
            f"{folder / 'head.json'} names head {head!r}, but {RECORD} names {recorded!r} and "
            f"the folder {named!r}: the folder holds another unit's files. {fix}",
        )


def read_json_object(path: Path, fix: str = "") -> dict[str, Any]:
    """A JSON file holding one object, or an EtnError saying what is wrong with it (+ ``fix``)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EtnError(
            f"Expected {path}, found none: the unit is incomplete. {fix}".strip()
        ) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        why = "nested too deep" if isinstance(err, RecursionError) else err
        raise EtnError(f"{path} is not valid JSON ({why}). {fix}".strip()) from None
    if not isinstance(value, dict):
        raise EtnError(
            f"{path} holds {type(value).__name__}, expected a JSON object. {fix}".strip()
        )
    return value
