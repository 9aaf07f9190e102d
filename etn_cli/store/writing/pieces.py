"""A split extracted by several processes at once (torchrun): how it is shared out in pieces,
and the writer of one rank's pieces (merged by :mod:`~etn_cli.store.writing.merge`).

One process reads a split of N rows in B = ceil(N / batch_size) batches, in order, and ends
shard k after batch (k + 1) * bps, with bps = ceil(shard_rows / batch_size) (the resumable
:class:`ShardWriter`). Under torchrun the batches are dealt out in W contiguous blocks, rank r
taking batches [r * B // W, (r + 1) * B // W), so the ranks share the work evenly however large
the shards are. A rank writes its block as pieces, one per shard its block touches: a piece is a
small split folder (one shard and a manifest) named by its shard and batches, inside the private
folder ``<split>.partial-ranks/`` (a leftover of the split to ``etn verify`` and ``etn status``,
guarded by the split's lock). A killed run keeps its finished pieces; the next one re-hashes them
and reuses those its own layout has, whatever its number of ranks.

:class:`PieceWriter` takes a rank's batches in order and fills one :class:`ShardWriter` per
piece, publishing each piece as soon as its last batch is in, so a killed run keeps every
finished piece.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.atomic import PARTIAL_TAG
from etn_cli.store.fingerprint import file_sha256
from etn_cli.store.writing.manifest import MANIFEST_NAME, load_manifest
from etn_cli.store.writing.shardfile import read_index
from etn_cli.store.writing.writer import ShardWriter

PIECES_TAG = f"{PARTIAL_TAG}ranks"


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


def piece_index(folder: Path, piece: Piece) -> np.ndarray:
    """The ``index`` (R,) of a finished piece, in the order its rank wrote it."""
    shards = load_manifest(folder / piece.name)["shards"]
    return np.concatenate([read_index(folder / piece.name / e["file"]) for e in shards])


class PieceWriter:
    """Route appended batches to one :class:`ShardWriter` per piece, in order, and publish
    each piece once its last batch is in; a piece left open by a failure is discarded."""

    def __init__(
        self, folder: Path, pieces: list[Piece], fingerprint: dict, record: dict[str, Any]
    ) -> None:
        self.folder = folder
        self.pending = list(pieces)
        self.fingerprint = fingerprint
        self.record = record
        self.piece: Piece | None = None
        self.writer: ShardWriter | None = None
        self.batches = 0  # of the open piece
        self.columns: list[str] | None = None  # in the order the writer stores them

    def __enter__(self) -> PieceWriter:
        return self

    def append(self, hidden: Any, logits: Any, labels: Any, index: Any, layers: dict) -> None:
        if self.columns is None:
            self.columns = ["hidden", "logits", "labels", "index"]
            self.columns += [f"layers/{name}" for name in layers]
        if self.writer is None:
            self._open()
        assert self.writer is not None and self.piece is not None
        self.writer.append(hidden, logits, labels, index, layers)
        self.batches += 1
        if self.batches == self.piece.batches:
            self._close()

    def _open(self) -> None:
        if not self.pending:
            raise EtnError(
                f"The loader of {self.folder.name} yielded more batches than its pieces hold; "
                "expected batches of [data] batch_size rows in a fixed order. Check the backbone."
            )
        self.piece = self.pending.pop(0)
        path = self.folder / self.piece.name
        writer = ShardWriter(path, self.fingerprint, self.piece.rows, self.record)
        self.writer = writer.__enter__()
        self.batches = 0

    def _close(self) -> None:
        writer, piece = self.writer, self.piece
        assert writer is not None and piece is not None
        self.writer = None
        if writer.rows != piece.rows:
            error = EtnError(
                f"Batches {piece.first_batch}..{piece.stop_batch - 1} of {self.folder.name} held "
                f"{writer.rows} rows, expected {piece.rows} ([data] batch_size rows each). "
                "Check the backbone's loader."
            )
            writer.__exit__(EtnError, error, None)
            raise error
        writer.extra = {"piece": piece.record(), "columns": self.columns}
        writer.__exit__(None, None, None)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        writer, self.writer = self.writer, None
        if kind is not None:
            if writer is not None:
                writer.__exit__(kind, error, tb)
            return
        if writer is not None or self.pending:
            short = EtnError(
                f"The loader of {self.folder.name} ended before the last batch of this rank's "
                "pieces; expected every batch of the split. Check the backbone's loader."
            )
            if writer is not None:
                writer.__exit__(EtnError, short, None)
            raise short
