"""Read a whole split folder into memory, checking it against its manifest on every read.

A split folder normally comes from ``etn extract`` and carries a ``manifest.json``. A folder of
``*.h5`` shards without one ("bring your own features") is read the same way: its shards are
checked identically and an in-memory manifest is built whose fingerprint lists each file's
sha256, so the content key changes whenever a file does. Nothing is written into such a folder
unless the user asks for a manifest with :func:`write_manifest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store.fingerprint import file_sha256
from etn_cli.store.notes import note_once
from etn_cli.store.writing.checks import check_unique_index
from etn_cli.store.writing.manifest import (
    MANIFEST_NAME,
    build_manifest,
    load_manifest,
    save_manifest,
    shard_unchanged,
)
from etn_cli.store.writing.shardfile import (
    ShardLayout,
    inspect_shard,
    list_shard_files,
    read_shard_into,
)

FORCE_HINT = "Delete the split folder and run etn extract again (or rewrite your own shards)."


@dataclass(frozen=True, eq=False)
class Features:
    """Cached backbone outputs of one (backbone, dataset, split), in source-split row order."""

    hidden: np.ndarray  # (N, D) float32, last hidden state
    logits: np.ndarray  # (N, C) float32
    labels: np.ndarray  # (N,) int64
    index: np.ndarray  # (N,) int64, position of each sample in its source split
    layers: dict[str, np.ndarray]  # name -> (N, D_l) float32, pooled intermediate layers
    manifest: dict[str, Any]
    key: str  # content key of the split, from its fingerprint
    path: Path

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def hidden_size(self) -> int:
        return self.hidden.shape[1]

    @property
    def num_classes(self) -> int:
        return self.logits.shape[1]


def read_split(split_dir: Path, *, validate_checksums: bool = True) -> Features:
    """Read every shard of ``split_dir`` and check it: manifest, checksums, shapes, finiteness.

    A manifest's shard is re-hashed only when its size or modification time differs from what
    the manifest recorded at writing time (like ``make`` and ``rsync``; ``etn verify`` and
    :func:`check_split` always re-hash), so a full read runs near ``numpy.load``'s speed.
    ``validate_checksums=False`` skips the sha256 pass altogether (the other checks still run);
    a folder without a manifest is always hashed because its key needs the hashes.
    """
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise EtnError(
            f"Expected a split folder at {split_dir}, found none. Run etn extract for it, or "
            "point to a folder of shard-*.h5 files."
        )
    if (split_dir / MANIFEST_NAME).exists():
        try:  # etn wrote and checked these shards: anything wrong now is damage
            manifest = load_manifest(split_dir)
            _check_listed_files(split_dir, manifest, "changed" if validate_checksums else "never")
            files = [e["file"] for e in manifest["shards"]]
            arrays, layouts = load_shards(split_dir, files, checked_at_write=True)
            _check_manifest_matches(split_dir, manifest, layouts, arrays)
        except DamagedArtefact:
            raise
        except EtnError as err:
            raise DamagedArtefact(split_dir, str(err)) from None
        note_unchecked_chunks(split_dir, layouts)
    else:
        arrays, layouts = load_shards(split_dir, list_shard_files(split_dir))
        manifest = _byof_manifest(split_dir, layouts, arrays)
    layers = {key.removeprefix("layers/"): a for key, a in arrays.items() if "/" in key}
    return Features(
        hidden=arrays["hidden"],
        logits=arrays["logits"],
        labels=arrays["labels"],
        index=arrays["index"],
        layers=layers,
        manifest=manifest,
        key=manifest["key"],
        path=split_dir,
    )


def split_damage(split_dir: Path) -> str | None:
    """Why a split folder with a manifest cannot be used as it is, found cheaply (manifest,
    listed shards present, re-hashed where their size or time changed); None if it looks whole.
    The shards' values are checked when they are read (recorded checksums, finite values)."""
    try:
        _check_listed_files(split_dir, load_manifest(split_dir), "changed")
    except EtnError as err:
        return str(err)
    return None


def note_unchecked_chunks(split_dir: Path, layouts: list[ShardLayout]) -> None:
    """Say once per split that shards written before value checksums carry none (a bit flipped
    in them with size and time unchanged is then found by ``etn verify`` only)."""
    if all(layout.checksummed for layout in layouts):
        return
    note_once(
        f"note: the shards of {split_dir} carry no checksums of their values (written by an "
        "older etn); `etn verify` still checks them in full"
    )


def check_split(split_dir: Path) -> dict[str, Any]:
    """Check a split folder as :func:`read_split` does, holding one shard in memory at a time
    (for ``etn verify`` over large caches); return its manifest."""
    split_dir = Path(split_dir)
    manifest = load_manifest(split_dir)
    _check_listed_files(split_dir, manifest, "always")
    files = [entry["file"] for entry in manifest["shards"]]
    if not files:
        raise EtnError(f"Manifest of split {split_dir.name} lists no shards. {FORCE_HINT}")
    layouts = [inspect_shard(split_dir, file) for file in files]
    check_same_columns(split_dir, layouts)
    indices = []
    for layout in layouts:
        out = _empty_arrays(layout.rows, layouts[0].widths)
        read_shard_into(split_dir, layout, out, 0)
        indices.append(out["index"])
    check_unique_index(np.concatenate(indices), f"split {split_dir.name}", FORCE_HINT)
    _check_manifest_matches(split_dir, manifest, layouts, _empty_arrays(0, layouts[0].widths))
    return manifest


def _empty_arrays(rows: int, widths: dict[str, int]) -> dict[str, np.ndarray]:
    out = {"labels": np.empty(rows, np.int64), "index": np.empty(rows, np.int64)}
    for key, width in widths.items():
        out[key] = np.empty((rows, width), np.float32)
    return out


def write_manifest(
    split_dir: Path, fingerprint: dict[str, Any], provenance: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Check hand-written shards in ``split_dir`` and record them in a proper ``manifest.json``.

    Every ``*.h5`` file is read and checked as :func:`read_split` would; rows and checksums are
    computed. An existing manifest is replaced. Returns the manifest written.
    """
    split_dir = Path(split_dir)
    arrays, layouts = load_shards(split_dir, list_shard_files(split_dir))
    hashes = {layout.file: file_sha256(split_dir / layout.file) for layout in layouts}
    manifest = _manifest_for(layouts, arrays, fingerprint, provenance, hashes)
    save_manifest(split_dir, manifest)
    return manifest


def load_shards(
    split_dir: Path, files: list[str], *, checked_at_write: bool = False
) -> tuple[dict[str, np.ndarray], list[ShardLayout]]:
    """Read ``files`` into one array per dataset, allocated once for the whole split
    (``checked_at_write``: see :func:`read_shard_into`)."""
    if not files:
        raise EtnError(f"Manifest of split {split_dir.name} lists no shards. {FORCE_HINT}")
    layouts = [inspect_shard(split_dir, file) for file in files]
    check_same_columns(split_dir, layouts)
    out = _empty_arrays(sum(layout.rows for layout in layouts), layouts[0].widths)
    start = 0
    for layout in layouts:
        read_shard_into(split_dir, layout, out, start, checked_at_write)
        start += layout.rows
    check_unique_index(out["index"], f"split {split_dir.name}", FORCE_HINT)
    return out, layouts


def check_same_columns(split_dir: Path, layouts: list[ShardLayout]) -> None:
    """All shards of a split must agree on D, C and the set of layers with their widths."""
    first = layouts[0]
    for layout in layouts[1:]:
        if layout.widths != first.widths:
            raise EtnError(
                f"Shard {split_dir.name}/{layout.file} has columns {layout.widths} but "
                f"{first.file} has {first.widths}; expected every shard of a split to share "
                f"them. {FORCE_HINT}"
            )


def _check_listed_files(split_dir: Path, manifest: dict[str, Any], checksums: str) -> None:
    """Every listed shard must exist; ``checksums`` is ``always``, ``changed`` (shards whose size
    or modification time differ from the manifest's record) or ``never``."""
    for entry in manifest["shards"]:
        path = split_dir / entry["file"]
        if not path.is_file():
            raise EtnError(
                f"Manifest of split {split_dir.name} lists {entry['file']}, which is missing "
                f"from {split_dir}. {FORCE_HINT}"
            )
        if checksums == "never" or (checksums == "changed" and shard_unchanged(path, entry)):
            continue
        if (found := file_sha256(path)) != entry["sha256"]:
            raise DamagedArtefact(
                split_dir,
                f"Shard {split_dir.name}/{entry['file']} has sha256 {found[:12]}… but its "
                f"manifest records {entry['sha256'][:12]}…: the file changed or is corrupt. "
                f"{FORCE_HINT}",
            )


def _check_manifest_matches(
    split_dir: Path, manifest: dict[str, Any], layouts: list[ShardLayout], arrays: dict
) -> None:
    """The manifest's row counts, D, C and layer names must describe the shards on disk."""
    for entry, layout in zip(manifest["shards"], layouts, strict=True):
        if int(entry["rows"]) != layout.rows:
            raise EtnError(
                f"Shard {split_dir.name}/{layout.file} holds {layout.rows} rows but the "
                f"manifest records {entry['rows']}. {FORCE_HINT}"
            )
    found = _summary(layouts, arrays)
    expected = {field: manifest.get(field) for field in found}
    if expected != found:
        raise EtnError(
            f"Manifest of split {split_dir.name} records {expected} but the shards hold "
            f"{found}. {FORCE_HINT}"
        )


def _byof_manifest(split_dir: Path, layouts: list[ShardLayout], arrays: dict) -> dict[str, Any]:
    """In-memory manifest of a folder without one; its key follows the files' checksums."""
    hashes = {layout.file: file_sha256(split_dir / layout.file) for layout in layouts}
    manifest = _manifest_for(layouts, arrays, {"byof": True, "shards": hashes}, None, hashes)
    # The shards' producer is unknown; this process's command line would be misleading.
    manifest["provenance"] = {"source": "bring your own features, manifest built by read_split"}
    return manifest


def _manifest_for(
    layouts: list[ShardLayout],
    arrays: dict[str, np.ndarray],
    fingerprint: dict[str, Any],
    provenance: dict[str, Any] | None,
    hashes: dict[str, str],
) -> dict[str, Any]:
    shards = [{"file": s.file, "rows": s.rows, "sha256": hashes[s.file]} for s in layouts]
    summary = _summary(layouts, arrays)
    hidden_size, num_classes = summary["hidden_size"], summary["num_classes"]
    return build_manifest(
        fingerprint, shards, hidden_size, num_classes, summary["layers"], provenance
    )


def _summary(layouts: list[ShardLayout], arrays: dict) -> dict[str, Any]:
    return {
        "rows": sum(layout.rows for layout in layouts),
        "hidden_size": arrays["hidden"].shape[1],
        "num_classes": arrays["logits"].shape[1],
        "layers": sorted(key.removeprefix("layers/") for key in arrays if "/" in key),
    }
