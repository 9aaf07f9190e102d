"""One rank's share of a split under torchrun: its pieces, read and written in order.

A rank reads only the batches of its pieces that no earlier run finished
(:func:`batches_in`), runs the backbone on them and hands the outputs to the shard writer (a
thread on a GPU, :func:`~etn_cli.stages.extract.shard_sink`) that fills one
:class:`~etn_cli.store.writing.writer.ShardWriter` per piece (:class:`PieceWriter`) and
publishes each piece as soon as its last batch is in, so a killed run keeps every finished piece.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from etn_cli.distributed import World
from etn_cli.errors import EtnError
from etn_cli.heads.training import progress
from etn_cli.plan import FeatureUnit, Plan, open_source
from etn_cli.provenance import provenance
from etn_cli.stages.extract import batches_of, forward_into, shard_sink, sliced_loader
from etn_cli.store.fingerprint import canonical_json, fingerprint_key
from etn_cli.store.writing.pieces import Layout, Piece, pieces_folder, reusable
from etn_cli.store.writing.writer import ShardWriter


class RefusedData(EtnError):
    """The writer refused what the backbone produced; the run keeps none of the split."""


def write_pieces(
    plan: Plan,
    unit: FeatureUnit,
    layout: Layout,
    backbone: Callable[[], Any],
    device: str,
    world: World,
) -> dict[str, Any]:
    """Extract this rank's pieces of ``unit`` that no earlier run finished; return a report
    of the work (rows, batches, timing, the backbone's fingerprint) for the manifest."""
    data = plan.pipeline.data
    assert data is not None
    split = open_source(plan.pipeline, unit.dataset).load_split(unit.split)
    if len(split) != layout.rows:
        raise EtnError(
            f"{world} reads {len(split)} rows of {unit.path.name}, rank 0 read {layout.rows}; "
            "expected the same dataset on every rank. Check the dataset files on every node."
        )
    folder = pieces_folder(unit.path)
    key = fingerprint_key(unit.fingerprint or {})
    mine = layout.pieces(world.rank)
    todo = [piece for piece in mine if not reusable(folder, piece, key)]
    reused = [piece for piece in mine if piece not in todo]
    report = {
        "rank": world.rank,
        "batches": sum(piece.batches for piece in mine),
        "rows": sum(piece.rows for piece in mine),
        "pieces": len(mine),
        "reused": {"pieces": len(reused), "rows": sum(p.rows for p in reused)},
    }
    if not todo:
        return report
    started = time.perf_counter()
    loader = batches_of(backbone(), split, plan, device)
    batches = batches_in(loader, todo)
    if world.main:
        total = sum(piece.batches for piece in todo)
        batches = progress(batches, f"extract {unit.path.name} ({world.size} ranks)", total)
    record = provenance()
    try:
        with PieceWriter(folder, todo, unit.fingerprint or {}, record) as pieces:
            with shard_sink(pieces.append, device) as sink:
                forward_s = forward_into(sink, backbone(), batches)
    except EtnError as err:
        raise RefusedData(str(err)) from None
    report["timing"] = {
        "wall_s": time.perf_counter() - started,
        "forward_s": forward_s,
        "write_s": sink.busy_s,
        "waiting_for_writer_s": sink.blocked_s,
    }
    report["loaded_backbone"] = json.loads(canonical_json(backbone().fingerprint()))
    return report


def batches_in(loader: Iterable, pieces: list[Piece]) -> Iterator:
    """The batches of ``pieces`` from a loader over the whole split. A sequential
    ``DataLoader`` reads only their rows; any other loader is read through the batches in
    between without a forward pass (its order need not follow the rows, as for LLM prompts
    sorted by length, so the batches are the very ones a single process reads)."""
    runs: list[list[Piece]] = []  # pieces that follow each other: one loader each
    for piece in pieces:
        if runs and runs[-1][-1].stop_batch == piece.first_batch:
            runs[-1].append(piece)
        else:
            runs.append([piece])
    sliced = [sliced_loader(loader, run[0].first_row, run[-1].stop_row) for run in runs]
    if all(part is not None for part in sliced):
        for part in sliced:
            yield from part
        return
    wanted = {number for p in pieces for number in range(p.first_batch, p.stop_batch)}
    last = max(wanted)
    for number, batch in enumerate(loader):
        if number in wanted:
            yield batch
        if number == last:
            return


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
