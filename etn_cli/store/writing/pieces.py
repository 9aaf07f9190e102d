"""A split extracted by several processes at once (torchrun): its pieces, and their merge.

One process reads a split of N rows in B = ceil(N / batch_size) batches, in order, and ends
shard k after batch (k + 1) * bps, with bps = ceil(shard_rows / batch_size) (the resumable
:class:`ShardWriter`). Under torchrun the batches are dealt out in W contiguous blocks, rank r
taking batches [r * B // W, (r + 1) * B // W), so the ranks share the work evenly however large
the shards are. A rank writes its block as pieces, one per shard its block touches: a piece is a
small split folder (one shard and a manifest) named by its shard and batches, inside the private
folder ``<split>.partial-ranks/`` (a leftover of the split to ``etn verify`` and ``etn status``,
guarded by the split's lock). A killed run keeps its finished pieces; the next one re-hashes them
and reuses those its own layout has, whatever its number of ranks.

The merge links a piece that is a whole shard into the split folder as it is, writes each shard
that several ranks share from their pieces, checks the split's index and writes one manifest.
Shards end where a single process ends them and :func:`write_shard` is deterministic, so the
split, its shards and their sha256 equal a single-process run's.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.atomic import PARTIAL_TAG, new_partial, publish
from etn_cli.store.fingerprint import file_sha256
from etn_cli.store.writing.checks import check_unique_index
from etn_cli.store.writing.manifest import (
    MANIFEST_NAME,
    SHARD_NAME,
    build_manifest,
    load_manifest,
    save_manifest,
)
from etn_cli.store.writing.shardfile import open_shard, read_index, write_shard

PIECES_TAG = f"{PARTIAL_TAG}ranks"
RETRY = "Run the same torchrun command again; finished pieces are reused."


@dataclass(frozen=True)
class Piece:
    """The batches [first_batch, stop_batch) of shard ``shard`` that one rank extracts."""

    shard: int
    first_batch: int
    stop_batch: int
    first_row: int
    stop_row: int
    batch_size: int

    @property
    def name(self) -> str:
        return f"shard-{self.shard:05d}.batches-{self.first_batch}-{self.stop_batch}"

    @property
    def rows(self) -> int:
        return self.stop_row - self.first_row

    @property
    def batches(self) -> int:
        return self.stop_batch - self.first_batch

    def record(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Layout:
    """How a split of ``rows`` rows is shared out among ``world_size`` ranks."""

    rows: int
    batch_size: int
    shard_rows: int
    world_size: int

    @property
    def batches(self) -> int:
        return -(-self.rows // self.batch_size)

    @property
    def batches_per_shard(self) -> int:
        return -(-self.shard_rows // self.batch_size)

    def block(self, rank: int) -> tuple[int, int]:
        """The batches [first, stop) of ``rank``; empty for some ranks of a tiny split."""
        return rank * self.batches // self.world_size, (rank + 1) * self.batches // self.world_size

    def pieces(self, rank: int) -> list[Piece]:
        """The block of ``rank`` cut at shard boundaries, in order."""
        first, stop = self.block(rank)
        found = []
        while first < stop:
            shard = first // self.batches_per_shard
            end = min(stop, (shard + 1) * self.batches_per_shard)
            rows = (first * self.batch_size, min(end * self.batch_size, self.rows))
            found.append(Piece(shard, first, end, *rows, self.batch_size))
            first = end
        return found

    def shards(self) -> list[list[Piece]]:
        """Every piece of every rank, grouped by the shard it belongs to."""
        grouped: list[list[Piece]] = []
        for piece in (p for rank in range(self.world_size) for p in self.pieces(rank)):
            if piece.shard == len(grouped):
                grouped.append([])
            grouped[piece.shard].append(piece)
        return grouped


def pieces_folder(split_dir: Path) -> Path:
    return Path(split_dir).with_name(f"{Path(split_dir).name}{PIECES_TAG}")


def prune(folder: Path, layout: Layout) -> None:
    """Delete what ``layout`` has no use for: pieces of another layout, folders of writers that
    died. Call it holding the split's lock, before any rank writes."""
    if not folder.is_dir():
        return
    wanted = {piece.name for group in layout.shards() for piece in group}
    for path in folder.iterdir():
        if path.name not in wanted:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def peek_pieces(folder: Path) -> tuple[int, int]:
    """``(pieces, rows)`` finished in a pieces folder, from their manifests, hashing nothing
    (for ``etn status`` and ``etn verify``)."""
    rows = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            rows.append(int(json.loads((path / MANIFEST_NAME).read_text(encoding="utf-8"))["rows"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return len(rows), sum(rows)


def reusable(folder: Path, piece: Piece, key: str) -> bool:
    """True for a finished piece made for this content key and these rows whose shard still
    hashes as recorded; anything else under the piece's name is deleted."""
    path = folder / piece.name
    if not path.exists():
        return False
    try:
        manifest = load_manifest(path)
        good = manifest["key"] == key and manifest.get("piece") == piece.record()
        good = good and all(
            (path / e["file"]).is_file() and file_sha256(path / e["file"]) == e["sha256"]
            for e in manifest["shards"]
        )
    except (EtnError, KeyError, TypeError):
        good = False
    if not good:
        shutil.rmtree(path, ignore_errors=True)
    return good


def merge_pieces(
    split_dir: Path,
    layout: Layout,
    fingerprint: dict[str, Any],
    provenance: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Build the split folder from every rank's pieces, publish it and delete the pieces;
    return its manifest. Call it holding the split's lock, once every rank has succeeded."""
    folder = pieces_folder(split_dir)
    groups = layout.shards()
    found = [[piece_manifest(folder, piece) for piece in group] for group in groups]
    columns, widths = _agreed_columns([m for group in found for m in group], split_dir)
    partial = new_partial(split_dir)
    try:
        shards, indices = [], []
        for number, (group, manifests) in enumerate(zip(groups, found, strict=True)):
            entry, index = _merge_shard(folder, group, manifests, columns, partial, number)
            shards.append(entry)
            indices.append(index)
        fix = "Each sample's position in its source split must appear once; nothing was written."
        check_unique_index(np.concatenate(indices), f"split {split_dir.name!r}", fix)
        manifest = build_manifest(fingerprint, shards, *widths, provenance)
        manifest.update(extra)
        save_manifest(partial, manifest)
        publish(partial, split_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    return manifest


def piece_manifest(folder: Path, piece: Piece) -> dict[str, Any]:
    """The manifest of a finished piece, checked to hold one shard of the piece's rows."""
    manifest = load_manifest(folder / piece.name)
    shards = manifest["shards"]
    whole = (len(shards), manifest["rows"]) == (1, piece.rows)
    if manifest.get("piece") != piece.record() or not whole:
        raise EtnError(
            f"Expected piece {piece.name} of {folder.name} to hold one shard of {piece.rows} "
            f"rows, found {len(shards)} shard(s) of {manifest['rows']} rows. {RETRY}"
        )
    return manifest


def _agreed_columns(
    manifests: list[dict[str, Any]], split_dir: Path
) -> tuple[list[str], tuple[int, int, list[str]]]:
    """The column order the pieces were written in and (hidden size, classes, layers), which
    every piece must share (ranks that loaded different backbones would not)."""
    shapes = {
        repr((m.get("columns"), m["hidden_size"], m["num_classes"], m["layers"])) for m in manifests
    }
    if len(shapes) != 1:
        raise EtnError(
            f"The ranks' pieces of {split_dir.name} disagree on their columns ({sorted(shapes)}); "
            "expected one backbone on every rank. Check that every node loads the same model."
        )
    first = manifests[0]
    return first["columns"], (first["hidden_size"], first["num_classes"], first["layers"])


def _merge_shard(
    folder: Path,
    group: list[Piece],
    manifests: list[dict[str, Any]],
    columns: list[str],
    partial: Path,
    number: int,
) -> tuple[dict[str, Any], np.ndarray]:
    """Shard ``number`` of the split in ``partial``: a whole piece's file linked as it is, or
    the pieces of several ranks written as one shard; its manifest entry and index (R,)."""
    name = SHARD_NAME.format(number)
    pairs = zip(group, manifests, strict=True)
    files = [folder / piece.name / found["shards"][0]["file"] for piece, found in pairs]
    rows = sum(piece.rows for piece in group)
    if len(group) == 1:
        _link(files[0], partial / name)
        entry = {"file": name, "rows": rows, "sha256": manifests[0]["shards"][0]["sha256"]}
        return entry, read_index(partial / name)
    parts = [_read_columns(file, columns) for file in files]
    arrays = {key: np.concatenate([part[key] for part in parts]) for key in columns}
    write_shard(partial / name, arrays)
    return {"file": name, "rows": rows, "sha256": file_sha256(partial / name)}, arrays["index"]


def _read_columns(path: Path, columns: list[str]) -> dict[str, np.ndarray]:
    """Every dataset of one shard as stored (dtype kept), so a rewrite gives the same bytes."""
    with open_shard(path, f"piece {path.parent.name}/{path.name}") as handle:
        return {key: handle[key][()] for key in columns}


def _link(source: Path, target: Path) -> None:
    """Hard-link ``source`` as ``target`` (the piece keeps its file until the split is
    published, so a kill during the merge loses nothing); copy where links are refused."""
    try:
        os.link(source, target)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):
            raise
        shutil.copyfile(source, target)
