"""Digests of input files, remembered by where and when each file was last written.

Your own inputs are keyed by their bytes: every image of an image folder or list, each model
file of a local LLM folder. Hashing them all on every run would make a rerun of 10,000 images
read every byte again, so a :class:`FileMemo` remembers each file's digest under its absolute
path with its size, modification time, status-change time and inode. Any write to a file
changes its ``ctime``, which no tool can set back (``touch`` and ``cp -p`` set ``mtime``), so a file
rewritten with the same size and ``mtime`` is hashed again; a file whose bytes rot on disk
without a write keeps its old digest, and the features cached from its intact bytes stay the
right ones.

The memo is a cache: one that does not parse or fails its seal is dropped and rebuilt. It is
read while planning and saved by the stages that build (:func:`save_memos`), so a run refused
while planning leaves the data directory as it was.

Images are hashed with XXH3-128 (``xxhash``, about 10 GB/s on one core here), model files with
sha256 as their published checksums are.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import xxhash

from etn_cli.errors import DamagedArtefact
from etn_cli.store.artefacts.sealed import SEAL, check_record_seal, seal_record
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import CHUNK_BYTES

ALGORITHMS = {"sha256": hashlib.sha256, "xxh3-128": xxhash.xxh3_128, "md5": hashlib.md5}
MEMO_FORMAT = 2
CONTENT_MEMO = "content-hashes.json"  # under <data>/features/: the digests of your inputs
MD5_MEMO = "content-md5.json"  # beside it: md5 of files whose publishers give md5 (CIFAR, SVHN)


def file_stamp(stat: os.stat_result) -> list[int]:
    """What changes whenever a file is written: size, mtime, ctime and inode."""
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def file_digest(path: Path, algorithm: str = "xxh3-128") -> str:
    """The hex digest of ``path``'s bytes, read in 1 MiB chunks."""
    digest = ALGORITHMS[algorithm]()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class FileMemo:
    """Digests of files (one ``algorithm``) by absolute path and :func:`file_stamp`, kept in
    ``path``; entries of the first format (size and mtime only) are read too."""

    def __init__(self, path: Path | None, algorithm: str = "xxh3-128") -> None:
        self.path, self.algorithm = path, algorithm
        self.dirty = False
        self.entries: dict[str, dict[str, Any]] = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return {}
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # absent or unreadable: rebuilt
            return {}
        if not isinstance(record, dict):
            return {}
        if SEAL not in record and self.algorithm == "sha256":  # the first format: a flat dict
            return {k: v for k, v in record.items() if isinstance(v, dict)}
        try:
            check_record_seal(record, self.path, self.path)
        except DamagedArtefact:  # a damaged cache is dropped, never trusted
            return {}
        same = record.get("format") == MEMO_FORMAT and record.get("algorithm") == self.algorithm
        entries = record.get("entries")
        return entries if same and isinstance(entries, dict) else {}

    def digest(self, file: Path) -> str:
        """``file``'s digest, from the memo when its stamp is unchanged. The memo is keyed by
        the absolute path as given: a link's stamp is its target's (inode included), so a link
        pointed elsewhere is hashed again."""
        path = os.path.abspath(file)
        stamp = file_stamp(os.stat(path))
        entry = self.entries.get(path)
        if isinstance(entry, dict) and self._matches(entry, stamp):
            return entry[self.algorithm]
        found = file_digest(Path(path), self.algorithm)
        self.entries[path] = {"stamp": stamp, self.algorithm: found}
        self.dirty = True
        return found

    def _matches(self, entry: dict[str, Any], stamp: list[int]) -> bool:
        if not isinstance(entry.get(self.algorithm), str):
            return False
        if "stamp" in entry:
            return entry["stamp"] == stamp
        return [entry.get("size"), entry.get("mtime_ns")] == stamp[:2]  # the first format

    def sha256(self, file: Path) -> str:
        """The name the first memo (of model files) gave :meth:`digest`."""
        return self.digest(file)

    def save(self) -> None:
        """Write atomically and sealed; a concurrent writer's entries may be lost, never mixed."""
        if not self.dirty or self.path is None:
            return
        record = {"format": MEMO_FORMAT, "algorithm": self.algorithm, "entries": self.entries}
        atomic_write_text(self.path, json.dumps(seal_record(record)))
        self.dirty = False


_MEMOS: dict[tuple[Path | None, str], FileMemo] = {}
_ACTIVE: list[FileMemo | None] = [None]


def memo_at(path: Path | None, algorithm: str = "xxh3-128") -> FileMemo:
    """The process's memo kept in ``path`` (read from it the first time); None: in memory."""
    key = (None if path is None else Path(path).resolve(), algorithm)
    if key not in _MEMOS:
        _MEMOS[key] = FileMemo(key[0], algorithm)
    return _MEMOS[key]


def use_data_dir(data_dir: Path) -> None:
    """Keep the digests of input files in ``<data_dir>/features/`` (planning calls it)."""
    _ACTIVE[0] = memo_at(Path(data_dir) / "features" / CONTENT_MEMO)


def content_digest(path: Path) -> str:
    """XXH3-128 of an input file's bytes, through the data directory's memo."""
    memo = _ACTIVE[0] if _ACTIVE[0] is not None else memo_at(None)
    return memo.digest(path)


def published_md5(path: Path) -> str:
    """md5 of a dataset file whose publisher gives its md5 (CIFAR's batches, SVHN's .mat), so
    that the official file keeps the key it had when torchvision checked it."""
    active = _ACTIVE[0]
    where = None if active is None or active.path is None else active.path.with_name(MD5_MEMO)
    return memo_at(where, "md5").digest(path)


def save_memos() -> None:
    """Write every memo that learnt a digest (a stage that builds calls it once its inputs are
    checked)."""
    for memo in list(_MEMOS.values()):
        memo.save()
