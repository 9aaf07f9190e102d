"""Checksums recorded when an artefact is written and checked before it is used.

Two forms, both plain sha256:

* a **sidecar** ``<file>.sha256`` beside a single-file artefact (a metrics Parquet file, the
  backbone's ``classifier.safetensors``), in ``sha256sum`` format, so ``sha256sum -c`` checks it
  too. It is written after the file, so a file without it is unfinished; :func:`read_sealed`
  compares the bytes with it *before* they are parsed (the Parquet reader can abort the whole
  process on a damaged file, which Python cannot catch);
* a **self-seal** inside a JSON record (``manifest.json``, ``train.json``, a backbone's
  ``meta.json``): the field :data:`SEAL` holds the sha256 of the record's canonical JSON without
  that field, so an edited or bit-flipped record is refused even where it still parses.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from etn_cli.errors import REPAIR_PREFIX, DamagedArtefact
from etn_cli.store.atomic import atomic_write_bytes, atomic_write_text
from etn_cli.store.fingerprint import canonical_json
from etn_cli.store.notes import note_once

SIDECAR_SUFFIX = ".sha256"
SEAL = "record_sha256"


def sidecar(path: Path) -> Path:
    """``<path>.sha256``, the checksum file of a single-file artefact."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def write_sealed(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` atomically, then its sidecar; a crash between leaves an unsealed file,
    which :func:`seal_state` reports as unfinished."""
    digest = hashlib.sha256(data).hexdigest()
    atomic_write_bytes(Path(path), data)
    atomic_write_text(sidecar(path), f"{digest}  {Path(path).name}\n")


def recorded_sha256(path: Path) -> str | None:
    """The digest a sidecar records, None without a sidecar; a garbled sidecar is damage."""
    try:
        text = sidecar(path).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        text = ""
    digest, _, name = text.strip().partition("  ")
    if len(digest) != 64 or name != Path(path).name or text.count("\n") != 1:
        raise DamagedArtefact(path, f"The checksum file {sidecar(path)} is damaged.")
    return digest


def read_sealed(path: Path, unit: Path | None = None, *, legacy_ok: bool = True) -> bytes:
    """The bytes of ``path`` after checking them against its sidecar.

    A mismatch raises :class:`DamagedArtefact` for ``unit`` (default ``path``). A file without a
    sidecar was written by an older etn: with ``legacy_ok`` it is read unchecked and said once;
    otherwise it counts as unfinished (damage)."""
    path = Path(path)
    unit = path if unit is None else unit
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DamagedArtefact(unit, f"Expected {path}, found none.") from None
    expected = recorded_sha256(path)
    if expected is None:
        if not legacy_ok:
            raise DamagedArtefact(unit, f"{path} has no checksum file {sidecar(path).name}.")
        note_once(f"note: {path} carries no checksum (an older etn wrote it); read as is")
        return data
    found = hashlib.sha256(data).hexdigest()
    if found != expected:
        raise DamagedArtefact(
            unit,
            f"{path} has sha256 {found[:12]}… but {sidecar(path).name} records {expected[:12]}…: "
            "the file changed or is corrupt.",
        )
    return data


def seal_state(path: Path) -> str | None:
    """None when ``path`` and its sidecar agree; otherwise why not (missing, unsealed, damaged)."""
    try:
        read_sealed(path, legacy_ok=False)
    except DamagedArtefact as err:
        return str(err)
    return None


def remove_sealed(path: Path) -> None:
    """Delete a single-file artefact and its sidecar (call it holding the file's lock)."""
    Path(path).unlink(missing_ok=True)
    sidecar(path).unlink(missing_ok=True)


def seal_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with :data:`SEAL` set to the sha256 of its canonical JSON without it."""
    body = {k: v for k, v in record.items() if k != SEAL}
    return body | {SEAL: hashlib.sha256(canonical_json(body).encode()).hexdigest()}


def check_record_seal(record: dict[str, Any], path: Path, unit: Path) -> None:
    """Raise :class:`DamagedArtefact` for ``unit`` when ``record`` carries a seal that does not
    match its content; a record without one (an older etn's) passes."""
    if SEAL not in record:
        return
    if seal_record(record)[SEAL] != record[SEAL]:
        raise DamagedArtefact(
            unit, f"{path} does not match its own checksum ({SEAL}): it was edited or is corrupt."
        )


def without_advice(problem: object) -> str:
    """An error's problem without the advice to delete and rebuild by hand that a refusal gives
    (for lines that give their own: a repair, ``etn verify``'s ``Fix:``)."""
    what = re.split(
        r"(?<=[.:]) (?=(?:Delete|Run etn|Regenerate|Re-run|Fix|Save it)\b)", str(problem)
    )
    return what[0].strip()


def repair_line(problem: object, action: str) -> str:
    """``repair: <what is damaged> <what etn does about it>``, since etn is doing just that."""
    return f"{REPAIR_PREFIX}{without_advice(problem)} {action}"


def discard(path: Path) -> None:
    """Remove a damaged unit so it can be rebuilt (call it holding the unit's lock): a folder is
    first renamed to a private ``.partial-`` name, so a crash midway leaves only a leftover that
    ``etn verify --clean-partials`` knows; a file goes with its sidecar."""
    import secrets
    import shutil

    from etn_cli.store.atomic import PARTIAL_TAG

    path = Path(path)
    if path.is_dir():
        aside = path.with_name(f"{path.name}{PARTIAL_TAG}{secrets.token_hex(4)}")
        path.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        remove_sealed(path)
