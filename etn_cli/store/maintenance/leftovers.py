"""Leftovers of interrupted runs under a data directory: find them, say what they are, clean them.

A run killed at any moment leaves only entries no reader mistakes for a finished unit:
``<unit>.partial-<random>/`` folders (an extraction's one holds journaled shards the next run
resumes from), ``<unit>.old-<random>/`` folders of an interrupted ``--force`` swap, and
``.<file>.<random>.tmp`` files of an interrupted atomic write. The unit each belongs to has a
kernel lock, so a leftover that a live process is still writing is recognised and kept.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.store.atomic import LOCK_SUFFIX, OLD_TAG, PARTIAL_TAG, is_locked, unit_lock
from etn_cli.store.writing.journal import peek_journal
from etn_cli.store.writing.pieces import PIECES_TAG, peek_pieces

TMP_FILE = re.compile(r"^\.(?P<unit>.+)\.[0-9a-f]{8}\.tmp$")
UNLOCKED_MIN_AGE_S = 3600  # a leftover without a lock is only removed once this old


@dataclass(frozen=True)
class Leftover:
    path: Path
    unit: Path | None  # the unit whose lock guards it; None when no lock does
    running: bool  # a live process holds the unit's lock (or, without a lock, wrote it lately)
    what: str

    def line(self) -> str:
        state = "in progress, held by a running etn process" if self.running else "interrupted"
        return f"partial {self.path}: {self.what} ({state})"


def find_leftovers(data_dir: Path) -> list[Leftover]:
    """Every leftover under ``data_dir``; the inside of a leftover folder is not searched."""
    found = []
    for folder, dirs, files in os.walk(data_dir):
        for name in sorted(dirs):
            if (left := classify(Path(folder) / name)) is not None:
                found.append(left)
                dirs.remove(name)
        for name in sorted(files):
            if not name.endswith(LOCK_SUFFIX) and (left := classify(Path(folder) / name)):
                found.append(left)
    return sorted(found, key=lambda left: str(left.path))


def classify(path: Path) -> Leftover | None:
    """The leftover ``path`` is, or None for an ordinary entry."""
    name = path.name
    for tag in (PARTIAL_TAG, OLD_TAG):
        if tag in name:
            unit = path.with_name(name.split(tag)[0])
            return Leftover(path, unit, is_locked(unit), _describe(path, tag))
    if match := TMP_FILE.match(name):
        unit = path.with_name(match.group("unit"))
        return Leftover(path, unit, is_locked(unit), "half-written file; the unit is rewritten")
    if name.startswith("."):
        recent = time.time() - path.stat().st_mtime < UNLOCKED_MIN_AGE_S
        return Leftover(path, None, recent, "temporary entry of an interrupted run")
    return None


def peek_partial(folder: Path) -> tuple[int, int] | None:
    """``(shards, rows)`` an unfinished extraction left in ``folder``, hashing nothing: the
    shards its journal lists, or for a torchrun pieces folder the pieces finished so far (one
    shard each); None when it holds neither."""
    if Path(folder).name.endswith(PIECES_TAG):
        return peek_pieces(Path(folder))
    return peek_journal(Path(folder))


def clean_leftover(left: Leftover) -> bool:
    """Delete ``left`` if no live process holds it; True when it was deleted."""
    if left.unit is None:
        if left.running:  # written within the hour and no lock says by whom: keep it
            return False
        _remove(left.path)
        return True
    try:
        with unit_lock(left.unit, timeout=0):
            _remove(left.path)
    except EtnError:  # the lock is held: a running process owns it
        return False
    return True


def _describe(path: Path, tag: str) -> str:
    if tag == OLD_TAG:
        return "the replaced copy of a unit from an interrupted --force; nothing reads it"
    journal = peek_partial(path)
    if journal is not None:
        shards, rows = journal
        return (
            f"unfinished extraction with {shards} journaled shard(s) ({rows} rows) that the "
            "next run resumes from"
        )
    return "unfinished unit folder; the next run rebuilds the unit"


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
