"""Stage 1: run the backbone once per dataset split and cache hidden states and logits."""

from __future__ import annotations

import time

from etn_cli.heads.training import progress
from etn_cli.plan import FeatureUnit, Plan
from etn_cli.provenance import provenance
from etn_cli.stages.result import StageResult
from etn_cli.store.atomic import unit_lock
from etn_cli.store.manifest import split_is_complete
from etn_cli.store.shards import ShardWriter, save_classifier


def extract(plan: Plan, *, device: str = "cpu") -> StageResult:
    """Write every missing feature unit of ``plan``; finished units are left untouched."""
    result = StageResult("extract")
    if plan.backbone is None:  # the user's own shards: nothing to extract
        result.skipped += [str(u.path) for u in plan.feature_units]
        return result
    for unit in plan.feature_units:
        if split_is_complete(unit.path):
            result.skipped.append(str(unit.path))
            continue
        unit.path.parent.mkdir(parents=True, exist_ok=True)
        with unit_lock(unit.path):
            if split_is_complete(unit.path):  # another process finished it while we waited
                result.skipped.append(str(unit.path))
                continue
            extract_split(plan, unit, device)
            result.done.append(str(unit.path))
    _store_classifier(plan)
    return result


def extract_split(plan: Plan, unit: FeatureUnit, device: str) -> None:
    from etn_cli.datasets import datasets

    backbone = plan.backbone
    data = plan.pipeline.data
    assert data is not None
    root = str(plan.pipeline.resolve(data.root)) if data.root else None
    split = datasets.get(unit.dataset)(root=root).load_split(unit.split)
    record = provenance()
    started = time.perf_counter()
    forward_s = 0.0
    with ShardWriter(unit.path, unit.fingerprint or {}, data.shard_rows, record) as writer:
        batches = backbone.batches(split, data.batch_size)
        total = -(-len(split) // data.batch_size)
        for inputs, labels, index in progress(batches, f"extract {unit.path.name}", total):
            tick = time.perf_counter()
            hidden, logits, layers = backbone.extract_batch(inputs)
            forward_s += time.perf_counter() - tick
            writer.append(hidden, logits, labels, index, layers)
        writer.extra["timing"] = {
            "wall_s": time.perf_counter() - started,
            "forward_s": forward_s,
            "forward_s_per_sample": forward_s / max(1, len(split)),
        }


def _store_classifier(plan: Plan) -> None:
    path = plan.classifier_path
    if path is None or path.exists():
        return
    with unit_lock(path):
        if not path.exists():
            weights = plan.backbone.classifier()
            save_classifier(path, weights["weight"], weights["bias"], provenance())
