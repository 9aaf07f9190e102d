"""``etn extract`` under torchrun: every rank extracts a block of each split, rank 0 merges.

Every rank walks the plan's feature splits in the same order. For each one, rank 0 takes the
split's lock, decides whether it needs work (a finished split is skipped by every rank), clears
pieces of another layout and tells the others how the split is shared out
(:class:`~etn_cli.store.Layout`). Each rank then writes its pieces, reusing the finished
ones a killed run left; the ranks tell each other whether they succeeded, and rank 0 merges the
pieces into the split folder, writes its one manifest and publishes it. A failure on any rank
makes every rank raise one line and publishes nothing: the pieces stay for the next run, except
when the data itself was refused (NaN, wrong shapes), which discards them as a single process
discards its journaled shards. Only rank 0 prints progress and writes the classifier.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import time
from collections.abc import Callable
from typing import Any

from etn_cli.distributed import BACKEND, World, describe, from_main, gather, join, rank_device
from etn_cli.errors import EtnError
from etn_cli.plan import FeatureUnit, Plan, open_source
from etn_cli.provenance import provenance
from etn_cli.stages.extract import load_backbone, store_classifier
from etn_cli.stages.extract_pieces import RefusedData, write_pieces
from etn_cli.stages.result import StageResult
from etn_cli.store.atomic import remove_partials, unit_lock
from etn_cli.store.fingerprint import canonical_json
from etn_cli.store.storage import ensure_writable, is_storage_error, storage_error
from etn_cli.store.writing.manifest import split_is_complete
from etn_cli.store.writing.pieces import Layout, merge_pieces, pieces_folder, prune


def extract_on_ranks(plan: Plan, device: str, result: StageResult, world: World) -> None:
    """Write every missing feature unit of ``plan`` together with the other ranks."""
    join(world)
    device = rank_device(device, world)
    backbone = functools.cache(lambda: load_backbone(plan, device))
    for unit in plan.feature_units:
        with contextlib.ExitStack() as lock:
            claim = functools.partial(_claim, plan, unit, world, lock)
            layout = from_main(world, claim, f"claiming {unit.path.name}")
            if layout is None:
                result.skipped.append(str(unit.path))
                continue
            _extract_unit(plan, unit, layout, backbone, device, world)
            result.done.append(str(unit.path))
    if world.main:
        store_classifier(plan, backbone)


def _claim(plan: Plan, unit: FeatureUnit, world: World, lock: contextlib.ExitStack) -> Any:
    """On rank 0: None for a finished split, else the split's layout, holding its lock."""
    if split_is_complete(unit.path):
        return None
    ensure_writable(unit.path.parent)
    lock.enter_context(unit_lock(unit.path))
    if split_is_complete(unit.path):  # another process finished it while we waited
        return None
    data = plan.pipeline.data
    assert data is not None
    rows = len(open_source(plan.pipeline, unit.dataset).load_split(unit.split))
    if rows == 0:
        raise EtnError(
            f"Expected rows for split {unit.path.name!r}, but the dataset split is empty; "
            "nothing was written. Check that the dataset split is not empty."
        )
    layout = Layout(rows, data.batch_size, data.shard_rows, world.size)
    folder = pieces_folder(unit.path)
    folder.mkdir(exist_ok=True)
    prune(folder, layout)
    return layout


def _extract_unit(
    plan: Plan,
    unit: FeatureUnit,
    layout: Layout,
    backbone: Callable[[], Any],
    device: str,
    world: World,
) -> None:
    """Write this rank's pieces, agree that every rank succeeded, then merge on rank 0."""
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        report: dict[str, Any] = write_pieces(plan, unit, layout, backbone, device, world)
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
    merge = functools.partial(_merge, plan, unit, layout, reports, started, world)
    from_main(world, merge, f"merging {unit.path.name}")


def _merge(
    plan: Plan,
    unit: FeatureUnit,
    layout: Layout,
    reports: list[dict[str, Any]],
    started: float,
    world: World,
) -> None:
    """On rank 0: one split folder and manifest from every rank's pieces. Pieces that cannot
    make a split (two backbones, a repeated index) are discarded, as a single process
    discards shards it refused."""
    try:
        extra = _manifest_extra(plan, unit, layout, reports, started, world)
        merge_pieces(unit.path, layout, unit.fingerprint or {}, provenance(), extra)
    except EtnError:
        shutil.rmtree(pieces_folder(unit.path), ignore_errors=True)
        raise
    remove_partials(unit.path)  # a killed single process's journal, now of no use


def _manifest_extra(
    plan: Plan,
    unit: FeatureUnit,
    layout: Layout,
    reports: list[dict[str, Any]],
    started: float,
    world: World,
) -> dict[str, Any]:
    """What the manifest records besides the shards: timing over all ranks, the backbone
    every rank loaded, and how the work was shared (``distributed``) and resumed."""
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
    extra: dict[str, Any] = {
        "timing": {
            "wall_s": time.perf_counter() - started,
            "forward_s": forward_s,  # summed over the ranks, as are the two below
            "forward_s_per_sample": forward_s / max(1, computed),
            "write_s": sum(t["write_s"] for t in timed),
            "waiting_for_writer_s": sum(t["waiting_for_writer_s"] for t in timed),
        },
        "loader": {"batch_size": data.batch_size, "workers": data.workers},
        "distributed": {
            "world_size": world.size,
            "backend": BACKEND,
            "pieces": sum(len(group) for group in layout.shards()),
            "ranks": [{k: v for k, v in r.items() if k != "loaded_backbone"} for r in reports],
        },
        "resumed": {
            "pieces": sum(r["reused"]["pieces"] for r in reports),
            "rows": sum(r["reused"]["rows"] for r in reports),
        },
    }
    if backbones:
        extra["loaded_backbone"] = json.loads(backbones.pop())
    return extra
