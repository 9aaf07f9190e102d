"""How the processes of an extraction share a split: alone, or as torchrun's ranks.

The extraction loop (:mod:`etn_cli.stages.extract`) calls this module at three points, and
this module never calls back:

* :func:`claim`, on rank 0 and told to every rank: skip a finished split, or take its lock and
  lay out how it is shared (:class:`~etn_cli.store.Layout`: each rank one block of batches);
* :func:`open_share`: where this process's batches go and which of them an earlier run wrote.
  A single process writes the whole split with a resumable :class:`~etn_cli.store.ShardWriter`
  (:class:`SplitShare`, whose journal keeps every finished shard); a rank writes its block as
  pieces (:class:`RankShare`), reusing those a killed run finished;
* :func:`publish_split`: the processes tell each other whether they succeeded, and rank 0
  merges the ranks' pieces into the split folder with one manifest (a single process's share
  has published the split already). A failure on any rank makes every rank raise one line and
  publishes nothing: pieces stay for the next run, except when the data itself was refused
  (NaN, wrong shapes), which discards them as a single process discards its journal.

Only :mod:`etn_cli.stages.distributed` talks to ``torch.distributed``; in a world of one process its
collectives return at once.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from etn_cli.errors import EtnError
from etn_cli.planning.plan import FeatureUnit, Plan
from etn_cli.provenance import provenance
from etn_cli.stages import units
from etn_cli.stages.distributed import BACKEND, World, describe, from_main, gather
from etn_cli.stages.extract_batches import batches_in, remaining_batches
from etn_cli.store.atomic import remove_partials
from etn_cli.store.fingerprint import canonical_json, fingerprint_key
from etn_cli.store.reading.reader import split_damage
from etn_cli.store.storage import is_storage_error, storage_error
from etn_cli.store.writing.manifest import split_is_complete
from etn_cli.store.writing.merge import merge_pieces
from etn_cli.store.writing.pieces import (
    Layout,
    PieceWriter,
    piece_index,
    pieces_folder,
    prune,
    reusable,
)
from etn_cli.store.writing.writer import ShardWriter

Fields = Callable[[list[dict[str, Any]]], dict[str, Any]]  # the ranks' reports -> manifest


class RefusedData(EtnError):
    """The writer refused what the backbone produced; the run keeps none of the split."""


@dataclass(frozen=True)
class Claim:
    layout: Layout | None  # None: the split needs no work
    reason: str


def claim(
    plan: Plan, unit: FeatureUnit, rows: Callable[[], int], world: World, lock: ExitStack
) -> Claim:
    """Whether ``unit`` needs work and, if so, how it is shared: decided on rank 0, which
    holds the split's lock (on ``lock``) from then on, and told to every rank. ``rows`` counts
    the split's rows; it is called only when the split needs work."""
    decide = functools.partial(_claim, plan, unit, rows, world.size, lock)
    return from_main(world, decide, f"claiming {unit.path.name}")


def _claim(
    plan: Plan, unit: FeatureUnit, rows: Callable[[], int], size: int, lock: ExitStack
) -> Claim:
    claimed = units.claim(ExtractedSplit(unit), lock)
    if not claimed.build:
        return Claim(None, claimed.reason)
    data = plan.pipeline.data
    assert data is not None
    if rows() == 0:
        raise EtnError(
            f"Expected rows for split {unit.path.name!r}, but the dataset split is empty; "
            "nothing was written. Check that the dataset split is not empty."
        )
    layout = Layout(rows(), data.batch_size, data.shard_rows, size)
    if size > 1:
        pieces_folder(unit.path).mkdir(exist_ok=True)
        prune(pieces_folder(unit.path), layout)
    return Claim(layout, claimed.reason)


class ExtractedSplit(units.Unit):
    """A split folder of shards and its manifest, claimed through the unit driver (skip, lock,
    check again, discard a damaged copy); its processes then write it themselves. What a killed
    run left is kept: the journal (or the pieces) resume it."""

    why = "no manifest with this key"

    def __init__(self, unit: FeatureUnit) -> None:
        self.path, self.name = unit.path, unit.path.name

    def damage(self) -> str | None:
        if not self.path.exists():
            return "missing"
        if (damage := split_damage(self.path)) is not None:
            return damage
        return None if split_is_complete(self.path) else "missing"

    def clear(self) -> None:
        """Nothing: the journal of a killed run is resumed, not cleared."""


def open_share(
    unit: FeatureUnit, layout: Layout, world: World, record: dict, fields: Fields
) -> SplitShare | RankShare:
    """This process's share of ``unit``: the whole split alone, a block of it under torchrun.
    ``fields`` turns the processes' reports into the manifest's fields."""
    if world.size == 1:
        return SplitShare(unit, layout, record, fields)
    return RankShare(unit, layout, world.rank, record)


class SplitShare:
    """The whole split, written by the one process with a journal; it publishes the split."""

    def __init__(self, unit: FeatureUnit, layout: Layout, record: dict, fields: Fields) -> None:
        resume = {"batch_size": layout.batch_size}  # the batches must be the same to skip them
        fingerprint = unit.fingerprint or {}
        self.writer = ShardWriter(unit.path, fingerprint, layout.shard_rows, record, resume=resume)
        self.layout, self.fields = layout, fields
        self.report: dict[str, Any] = {"rank": 0}

    def __enter__(self) -> SplitShare:
        self.writer.__enter__()
        reused = len(self.writer.resumed_index)
        self.report |= {"batches": self.layout.batches, "rows": self.layout.rows}
        self.report["reused"] = {"shards": self.writer.resumed_shards, "rows": reused}
        return self

    @property
    def todo_batches(self) -> int:
        return self.layout.batches - self.writer.resumed_batches

    def batches(self, loader: Iterable) -> Iterable:
        return remaining_batches(loader, self.writer)

    def append(self, *batch: Any) -> None:
        self.writer.append(*batch)

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:  # the manifest, written as the writer closes, records the work
            self.writer.extra = self.fields([self.report])
        self.writer.__exit__(*exc)


class RankShare:
    """One rank's block of the split as pieces; a killed run's finished pieces are reused."""

    def __init__(self, unit: FeatureUnit, layout: Layout, rank: int, record: dict) -> None:
        self.folder, self.name = pieces_folder(unit.path), unit.path.name
        key = fingerprint_key(unit.fingerprint or {})
        mine = layout.pieces(rank)
        self.todo = [piece for piece in mine if not reusable(self.folder, piece, key)]
        self.reused = [piece for piece in mine if piece not in self.todo]
        self.writer = PieceWriter(self.folder, self.todo, unit.fingerprint or {}, record)
        self.report: dict[str, Any] = {
            "rank": rank,
            "batches": sum(piece.batches for piece in mine),
            "rows": sum(piece.rows for piece in mine),
            "pieces": len(mine),
            "reused": {"pieces": len(self.reused), "rows": sum(p.rows for p in self.reused)},
        }

    def __enter__(self) -> RankShare:
        self.writer.__enter__()
        return self

    @property
    def todo_batches(self) -> int:
        return sum(piece.batches for piece in self.todo)

    def batches(self, loader: Iterable) -> Iterable:
        done = [(piece, piece_index(self.folder, piece)) for piece in self.reused]
        return batches_in(loader, self.todo, done, self.name)

    def append(self, *batch: Any) -> None:
        self.writer.append(*batch)

    def __exit__(self, *exc: Any) -> None:
        """Whatever the writer refused (NaN, wrong shapes, too few batches) is RefusedData."""
        try:
            self.writer.__exit__(*exc)
        except EtnError as err:
            raise RefusedData(str(err)) from None
        if isinstance(exc[1], EtnError) and not isinstance(exc[1], RefusedData):
            raise RefusedData(str(exc[1])) from None


def publish_split(
    unit: FeatureUnit, layout: Layout, world: World, write: Callable[[], dict], fields: Fields
) -> None:
    """Run ``write`` (this process's share; it returns a report of the work), agree with the
    other ranks that every share succeeded, then merge the pieces on rank 0."""
    error: BaseException | None = None
    try:
        report = write()
    except Exception as err:  # told to the other ranks, then raised here
        error = storage_error(err) if is_storage_error(err) else err
        report = {"failed": describe(error), "refused": isinstance(error, RefusedData)}
    reports = gather(world, report, f"extracting {unit.path.name}")
    failed = [(rank, r) for rank, r in enumerate(reports) if "failed" in r]
    if failed:
        if world.main and any(r["refused"] for _, r in failed):
            shutil.rmtree(pieces_folder(unit.path), ignore_errors=True)
        if error is not None:
            raise error
        rank, first = failed[0]
        raise EtnError(f"Rank {rank} of {world.size} failed on {unit.path.name}: {first['failed']}")
    if world.size > 1:
        merge = functools.partial(_merge, unit, layout, reports, fields)
        from_main(world, merge, f"merging {unit.path.name}")


def _merge(unit: FeatureUnit, layout: Layout, reports: list[dict], fields: Fields) -> None:
    """On rank 0: one split folder and manifest from every rank's pieces. Pieces that cannot
    make a split (two backbones, a repeated index) are discarded, as a single process
    discards shards it refused."""
    try:
        extra = fields(reports)
        merge_pieces(unit.path, layout, unit.fingerprint or {}, provenance(), extra)
    except EtnError:
        shutil.rmtree(pieces_folder(unit.path), ignore_errors=True)
        raise
    remove_partials(unit.path)  # a killed single process's journal, now of no use


def manifest_fields(
    plan: Plan,
    unit: FeatureUnit,
    layout: Layout,
    world: World,
    started: float,
    reports: list[dict[str, Any]],
) -> dict[str, Any]:
    """What a split's manifest records besides its shards: timing (summed over the ranks), the
    loader, the backbone every rank loaded and, under torchrun, how the work was shared."""
    data = plan.pipeline.data
    assert data is not None
    backbones = {canonical_json(r["loaded_backbone"]) for r in reports if "loaded_backbone" in r}
    if len(backbones) > 1:
        raise EtnError(
            f"The ranks loaded {len(backbones)} different backbones for {unit.path.name}; "
            "expected one. Give every node the same model files and settings."
        )
    timed = [r["timing"] for r in reports if "timing" in r]
    forward_s = sum(t["forward_s"] for t in timed)
    computed = sum(r["rows"] - r["reused"]["rows"] for r in reports)
    fields: dict[str, Any] = {
        "timing": {
            "wall_s": time.perf_counter() - started,
            "forward_s": forward_s,
            "forward_s_per_sample": forward_s / max(1, computed),
            "write_s": sum(t["write_s"] for t in timed),
            "waiting_for_writer_s": sum(t["waiting_for_writer_s"] for t in timed),
        },
        "loader": {"batch_size": data.batch_size, "workers": data.workers},
    }
    if backbones:
        fields["loaded_backbone"] = json.loads(backbones.pop())
    if world.size > 1:
        fields["distributed"] = {
            "world_size": world.size,
            "backend": BACKEND,
            "pieces": sum(len(group) for group in layout.shards()),
            "ranks": [{k: v for k, v in r.items() if k != "loaded_backbone"} for r in reports],
        }
        reused = [r["reused"] for r in reports]
        fields["resumed"] = {
            "pieces": sum(r["pieces"] for r in reused),
            "rows": sum(r["rows"] for r in reused),
        }
    return fields
