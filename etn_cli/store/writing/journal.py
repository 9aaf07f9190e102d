"""The progress journal of an extraction in progress, so that a killed run resumes at a shard.

While ``extract`` writes a split, its private ``<split>.partial-<random>/`` folder holds the
finished shards and ``journal.json``: the settings the shards depend on (content key,
``shard_rows``, batch size) and, per shard, its file, rows, sha256, the rows of the split it
covers (``first_row``..``stop_row``) and the number of backbone batches it completes
(``batches``). A shard is written to a temporary name, fsynced and renamed before its journal
entry is written (atomically), so every journaled shard is whole.

A rerun holds the unit's lock, so no live process owns a partial folder it finds: it adopts the
one whose journal matches its settings after re-hashing each journaled shard (a prefix of good
shards is kept, everything after the first bad one is dropped), deletes the others, and skips
the batches the adopted shards cover. The journal is removed when the manifest is written.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etn_cli.store.atomic import atomic_write_text, new_partial, partial_folders
from etn_cli.store.fingerprint import canonical_json, file_sha256

JOURNAL_NAME = "journal.json"
KIND = "etn-extract-journal"
FORMAT = 1
ENTRY_FIELDS = ("file", "rows", "sha256", "first_row", "stop_row", "batches")


@dataclass
class Journal:
    """Finished shards of one split in progress, saved after every shard."""

    folder: Path
    settings: dict[str, Any]  # what the shards depend on besides the content key
    entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.entries[-1]["stop_row"] if self.entries else 0

    @property
    def batches(self) -> int:
        return self.entries[-1]["batches"] if self.entries else 0

    def record(self, entry: dict[str, Any]) -> None:
        """Append one finished shard and save the journal atomically."""
        missing = [name for name in ENTRY_FIELDS if name not in entry]
        assert not missing, f"journal entry lacks {missing}"
        self.entries.append({name: entry[name] for name in ENTRY_FIELDS})
        self.save()

    def save(self) -> None:
        document = {"kind": KIND, "format": FORMAT, **self.settings, "shards": self.entries}
        atomic_write_text(self.folder / JOURNAL_NAME, json.dumps(document, indent=1) + "\n")

    def tidy(self) -> None:
        """Delete every file of the folder that no journal entry names (torn or unjournaled
        shards, temporary files), keeping the journaled shards for the next run."""
        keep = {JOURNAL_NAME, *(entry["file"] for entry in self.entries)}
        for path in self.folder.iterdir():
            if path.name not in keep:
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    def close(self) -> None:
        """Forget the journal once the manifest makes the split complete."""
        (self.folder / JOURNAL_NAME).unlink(missing_ok=True)


def open_journal(final: Path, settings: dict[str, Any]) -> Journal:
    """A journal for building ``final``: the best matching interrupted one, or a fresh one.

    Call it only while holding the unit's lock: every other ``.partial-`` folder of ``final``
    is deleted, being the leftover of a dead process.
    """
    best: Journal | None = None
    for folder in partial_folders(final):
        journal = read_journal(folder, settings)
        if journal is not None and (best is None or journal.batches > best.batches):
            best = journal
    for folder in partial_folders(final):
        if best is None or folder != best.folder:
            shutil.rmtree(folder, ignore_errors=True)
    if best is None:
        best = Journal(new_partial(final), settings)
        best.save()
        return best
    best.tidy()
    best.save()  # drops entries after the first bad shard
    return best


def peek_journal(folder: Path) -> tuple[int, int] | None:
    """``(shards, rows)`` a partial folder's journal lists, without hashing anything (for
    ``etn status`` and ``etn verify``); None when it has no readable journal."""
    try:
        document = json.loads((Path(folder) / JOURNAL_NAME).read_text(encoding="utf-8"))
        shards = document["shards"]
        return len(shards), int(shards[-1]["stop_row"]) if shards else 0
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def read_journal(folder: Path, settings: dict[str, Any]) -> Journal | None:
    """The journal of ``folder`` cut to its leading shards that still hash to their recorded
    sha256, or None when it is missing, unreadable, or made with other settings."""
    try:
        document = json.loads((folder / JOURNAL_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("kind") != KIND:
        return None
    if document.get("format") != FORMAT or not isinstance(document.get("shards"), list):
        return None
    recorded = {name: document.get(name) for name in settings}
    if canonical_json(recorded) != canonical_json(settings):
        return None
    journal = Journal(folder, settings)
    for entry in document["shards"]:
        if not _entry_is_whole(folder, entry, journal):
            break
        journal.entries.append(entry)
    return journal


def _entry_is_whole(folder: Path, entry: Any, journal: Journal) -> bool:
    """The entry is well formed, follows the previous one and its file hashes as recorded."""
    if not isinstance(entry, dict) or any(name not in entry for name in ENTRY_FIELDS):
        return False
    if entry["first_row"] != journal.rows or entry["file"] in {"", JOURNAL_NAME}:
        return False
    if entry["stop_row"] - entry["first_row"] != entry["rows"] or "/" in str(entry["file"]):
        return False
    path = folder / entry["file"]
    return path.is_file() and file_sha256(path) == entry["sha256"]
