"""Your own shard folders without a manifest: keyed by their shards' sha256, and recorded at
first use so that later bit rot is refused like damage in etn's own shards.

etn's own shards carry checksums of their values; a folder of ``*.h5`` files you wrote has
none, and a changed file is simply new data under a new key. A bit flipped on disk changes the
bytes without a write, though: size, modification time and inode stay as they were. So the
first ``etn train`` or ``etn evaluate`` (or ``etn run``) that reads such a folder, once every
input is checked, records each shard's size, mtime, inode and sha256 in
``<data>/features/own-folders.json`` (sealed), and every later use compares: a shard with the
recorded size, mtime and inode but another sha256 was not written, it rotted, and is refused
in one line naming it. A shard written anew (any new mtime) is new data, and its record is
updated at its next use. Nothing is ever written into your folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store.artefacts.sealed import check_record_seal, seal_record
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import file_sha256, fingerprint_key

OWN_RECORD = "own-folders.json"  # under <data>/features/


def shard_stamp(path: Path) -> list[int]:
    """What a write changes and bit rot does not: size, modification time, inode."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def read_record(path: Path) -> dict[str, Any]:
    """The recorded folders (real path -> shard name -> stamp and sha256); a damaged record
    is dropped, as a new one is made at the next use."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        check_record_seal(record, path, path)
    except (OSError, ValueError, RecursionError, AttributeError, DamagedArtefact):
        return {}
    folders = record.get("folders") if isinstance(record, dict) else None
    return folders if isinstance(folders, dict) else {}


def own_folder_key(folder: Path, record: Path) -> tuple[str, dict[str, Any]]:
    """The content key of a folder of your own shards, and what to record of each shard;
    refuses a shard that changed without a write since it was recorded."""
    shards = sorted(p for p in folder.glob("*.h5") if p.is_file())
    if not shards:
        raise EtnError(
            f"Feature folder {folder} holds no *.h5 shards. See docs/own-data.md ('Features you "
            "computed yourself')."
        )
    seen = {p.name: {"stamp": shard_stamp(p), "sha256": file_sha256(p)} for p in shards}
    earlier = read_record(record).get(os.path.realpath(folder), {})
    for name, now in seen.items():
        then = earlier.get(name) if isinstance(earlier, dict) else None
        if isinstance(then, dict) and then.get("stamp") == now["stamp"]:
            if then.get("sha256") != now["sha256"]:
                raise DamagedArtefact(
                    folder,
                    f"Shard {folder / name} has sha256 {now['sha256'][:12]}… but had "
                    f"{str(then.get('sha256'))[:12]}… when etn first read it, with the same "
                    "size, modification time and inode: it changed without being written (bit "
                    "rot or a failing disk). Restore it from a copy, or write it anew.",
                )
    hashes = {name: now["sha256"] for name, now in seen.items()}
    return fingerprint_key({"byof": True, "shards": hashes}), seen


def remember_plan_folders(plan: Any) -> None:
    """Record the own folders of ``plan`` (a stage that reads them calls it once its inputs are
    checked: a folder first read by ``evaluate``, its heads built already, is recorded too)."""
    remember_own_folders(plan.feature_units, plan.data_dir / "features" / OWN_RECORD)


def remember_own_folders(units: list[Any], record: Path) -> None:
    """Record the shards of every own folder of ``units`` as planning saw them."""
    seen = {
        os.path.realpath(unit.path): unit.fingerprint["shards"]
        for unit in units
        if (unit.fingerprint or {}).get("shards")
    }
    if not seen:
        return
    folders = read_record(record)
    if all(folders.get(path) == shards for path, shards in seen.items()):
        return
    folders.update(seen)
    atomic_write_text(record, json.dumps(seal_record({"folders": folders})))
