"""Stage 1: run the backbone once per dataset split and cache hidden states and logits.

One path, whatever the number of processes (a single process is torchrun's world of one):

1. rank 0 claims each split (:func:`~etn_cli.stages.extract_ranks.claim`): a finished split is
   skipped by every process; otherwise it takes the split's lock and lays out each process's
   block of batches (a single process's block is the whole split);
2. every process writes its share (:func:`write_share`, the one loop over batches): it reads
   only the batches no earlier run wrote (:mod:`~etn_cli.stages.extract_batches`), runs the
   backbone on each and hands the outputs to the shard writer (:mod:`~etn_cli.stages.shard_sink`:
   a thread on a GPU, inline on the CPU). Alone, it writes the split with a journal, so a run
   killed at any moment resumes at its last finished shard; a torchrun rank writes pieces;
3. the processes agree that every share succeeded and rank 0 merges the pieces
   (:func:`~etn_cli.stages.extract_ranks.publish_split`); only rank 0 prints progress and
   saves the backbone's classifier.

The batch order is deterministic and shards end at batch boundaries, so a resumed or a
multi-process extraction writes the same shards, byte for byte, as one uninterrupted process.
Refused data (NaN, wrong shapes) keeps nothing. Backbones run their forward passes under
``torch.inference_mode`` themselves (ODIN needs a gradient). Batches come from
``backbone.loader(split, batch_size, workers, pin_memory)``: the torchvision backbone uses
``[data] workers`` loader processes and pinned memory on CUDA; the base class falls back to
``batches(split, batch_size)``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from etn_cli import progress
from etn_cli.distributed import World, current_world, join, rank_device
from etn_cli.errors import EtnError
from etn_cli.plan import FeatureUnit, Plan, open_source
from etn_cli.provenance import provenance
from etn_cli.stages.extract_ranks import claim, manifest_fields, open_share, publish_split
from etn_cli.stages.result import StageResult
from etn_cli.stages.shard_sink import BackgroundAppender, shard_sink
from etn_cli.store.artefacts.classifier import save_classifier
from etn_cli.store.atomic import unit_lock
from etn_cli.store.fingerprint import canonical_json
from etn_cli.store.storage import explained_storage_errors
from etn_cli.store.writing.pieces import Layout


def extract(plan: Plan, *, device: str = "cpu") -> StageResult:
    """Write every missing feature unit of ``plan``; finished units are left untouched, and a
    unit a killed run left half done is resumed from what it finished."""
    result = StageResult("extract")
    if plan.backbone is None:  # the user's own shards: nothing to extract
        for u in plan.feature_units:
            result.skip(u.path, split_name(u), "your own features")
        return result
    world = current_world()
    with explained_storage_errors():
        join(world)
        device = rank_device(device, world)
        backbone = functools.cache(lambda: load_backbone(plan, device))  # only if there is work
        for unit in plan.feature_units:
            extract_unit(plan, unit, backbone, device, world, result)
        if world.main:
            store_classifier(plan, backbone)
    return result


def extract_unit(
    plan: Plan,
    unit: FeatureUnit,
    backbone: Callable[[], Any],
    device: str,
    world: World,
    result: StageResult,
) -> None:
    """Claim one split, write this process's share of it and publish it, or skip it."""
    split = functools.cache(lambda: open_source(plan.pipeline, unit.dataset).load_split(unit.split))
    quiet = not world.main
    with contextlib.ExitStack() as lock:
        claimed = claim(plan, unit, lambda: len(split()), world, lock)
        if claimed.layout is None:
            result.skip(unit.path, split_name(unit), claimed.reason, quiet=quiet)
            return
        layout, started = claimed.layout, time.perf_counter()
        fields = functools.partial(manifest_fields, plan, unit, layout, world, started)

        def write() -> dict[str, Any]:
            return write_share(plan, unit, layout, split, backbone, device, world, fields)

        with result.build(unit.path, split_name(unit), claimed.reason, quiet=quiet):
            publish_split(unit, layout, world, write, fields)


def write_share(
    plan: Plan,
    unit: FeatureUnit,
    layout: Layout,
    split: Callable[[], Any],
    backbone: Callable[[], Any],
    device: str,
    world: World,
    fields: Callable[[list[dict]], dict],
) -> dict[str, Any]:
    """Run the backbone on the batches of this process's share that no earlier run wrote and
    write their outputs; return a report of the work (rows, timing, the backbone loaded)."""
    if len(split()) != layout.rows:
        raise EtnError(
            f"{world} reads {len(split())} rows of {unit.path.name}, rank 0 read {layout.rows}; "
            "expected the same dataset on every rank. Check the dataset files on every node."
        )
    started = time.perf_counter()
    with open_share(unit, layout, world, provenance(), fields) as share:
        if share.todo_batches:
            model = backbone()
            batches = share.batches(batches_of(model, split(), plan, device))
            if world.main:
                ranks = f" ({world.size} ranks)" if world.size > 1 else ""
                label = f"extract {unit.path.name}{ranks}"
                batches = progress.bar(batches, label, share.todo_batches)
            with shard_sink(share.append, device) as sink:
                forward_s = forward_into(sink, model, batches)
            share.report["timing"] = {
                "wall_s": time.perf_counter() - started,
                "forward_s": forward_s,
                "write_s": sink.busy_s,
                "waiting_for_writer_s": sink.blocked_s,
            }
            share.report["loaded_backbone"] = json.loads(canonical_json(model.fingerprint()))
    return share.report


def forward_into(sink: BackgroundAppender, backbone: Any, batches: Iterable) -> float:
    """Run the backbone on each ``(inputs, labels, index)`` batch and put its outputs into
    ``sink``; return the seconds spent in forward passes."""
    forward_s = 0.0
    for inputs, labels, index in batches:
        tick = time.perf_counter()
        hidden, logits, extras = backbone.extract_batch(inputs)
        forward_s += time.perf_counter() - tick
        sink.put(hidden, logits, labels, index, extras)
    return forward_s


def batches_of(backbone: Any, split: Any, plan: Plan, device: str) -> Iterable:
    """The backbone's loader over the whole split, in ``[data] batch_size`` batches."""
    data = plan.pipeline.data
    assert data is not None
    pin = device.startswith("cuda")
    return backbone.loader(split, data.batch_size, workers=data.workers, pin_memory=pin)


def split_name(unit: FeatureUnit) -> str:
    """How a feature unit is named in progress lines: ``digits.test`` (its role if own)."""
    return f"{unit.dataset}.{unit.split}" if unit.dataset else f"{unit.name} ({unit.role})"


def load_backbone(plan: Plan, device: str) -> Any:
    """The plan's backbone on ``device``, with ``etn finetune``'s output when the pipeline has
    a ``[finetune]`` table (a fresh instance, so the plan's copy keeps its fingerprint)."""
    import torch

    from etn_cli.stages.finetune import require_finetuned

    template = plan.backbone
    if plan.finetune is None and template.device == torch.device(device):
        return template
    backbone = type(template)(template.config, template.cache_dir, device)
    if plan.finetune is not None:
        backbone.use_finetuned(require_finetuned(plan.finetune))
    return backbone


def store_classifier(plan: Plan, backbone: Callable[[], Any]) -> None:
    """Save the backbone's final layer once per backbone, for the baselines that start from it."""
    path = plan.classifier_path
    if path is None or path.exists():
        return
    with unit_lock(path):
        if not path.exists():
            weights = backbone().classifier()
            save_classifier(path, weights["weight"], weights["bias"], provenance())
