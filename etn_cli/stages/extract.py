"""Stage 1: run the backbone once per dataset split and cache hidden states and logits.

One path, whatever the number of processes (a single process is torchrun's world of one):

0. before any split is claimed, rank 0 reads every split still to extract and checks its
   inputs (every image file's header), and every process loads the model and checks the ID
   classes against it: a bad file in the last split, weights that do not fit or a class-count
   mismatch stop the run with nothing written, not even a lock file;
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
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli import progress
from etn_cli.datasets.base import check_inputs
from etn_cli.datasets.class_check import check_id_classes
from etn_cli.distributed import World, current_world, from_main, join, rank_device
from etn_cli.errors import EtnError
from etn_cli.plan import FeatureUnit, Plan, load_unit_split
from etn_cli.provenance import provenance
from etn_cli.stages.extract_ranks import claim, manifest_fields, open_share, publish_split
from etn_cli.stages.result import StageResult
from etn_cli.stages.shard_sink import BackgroundAppender, shard_sink
from etn_cli.store.artefacts.classifier import load_classifier, save_classifier
from etn_cli.store.artefacts.sealed import discard, repair_line
from etn_cli.store.atomic import unit_lock
from etn_cli.store.content import save_memos
from etn_cli.store.fingerprint import canonical_json
from etn_cli.store.reading.reader import split_damage
from etn_cli.store.storage import explained_storage_errors
from etn_cli.store.writing.manifest import split_is_complete
from etn_cli.store.writing.pieces import Layout


def extract(plan: Plan, *, device: str = "cpu") -> StageResult:
    """Write every missing feature unit of ``plan``; finished units are left untouched, and a
    unit a killed run left half done is resumed from what it finished."""
    result = StageResult("extract")
    if plan.backbone is None:  # your own features: files are imported, folders read in place
        with explained_storage_errors():
            return import_features(plan, result)
    world = current_world()
    with explained_storage_errors():
        join(world)
        device = rank_device(device, world)
        backbone = functools.cache(lambda: load_backbone(plan, device))  # only if there is work
        splits = {unit.path: unit_split(plan, unit) for unit in plan.feature_units}
        pending = [unit for unit in plan.feature_units if not split_is_complete(unit.path)]
        if pending:  # every input checked and the model loaded before anything is written
            transform = getattr(plan.backbone, "transform", None)  # images: their sizes
            check = functools.partial(check_pending_inputs, pending, splits, transform)
            from_main(world, check, "checking the input files")
            load_weights(backbone())
        if world.main:  # the digests of the input files learnt while planning
            save_memos()
        for unit in plan.feature_units:
            extract_unit(plan, unit, splits[unit.path], backbone, device, world, result)
        if world.main:
            store_classifier(plan, backbone)
    return result


def import_features(plan: Plan, result: StageResult) -> StageResult:
    """The extract stage of a ``[features]`` pipeline: import the files not imported yet
    (:mod:`etn_cli.own_features.importer`); folders of shards are read where they are."""
    from etn_cli.own_features.importer import check_before_import, read_checked, write_split

    pending = {}
    for unit in plan.feature_units:
        file = (unit.fingerprint or {}).get("file")
        if file is None or (split_is_complete(unit.path) and split_damage(unit.path) is None):
            result.skip(unit.path, split_name(unit), "your own features")
        else:
            pending[Path(file)] = unit
    read = read_checked({path: unit.role for path, unit in pending.items()}) if pending else {}
    if read:  # the checks train and evaluate would make, before the first file is written
        check_before_import(plan, read)
    for path, unit in pending.items():
        unit.path.parent.mkdir(parents=True, exist_ok=True)
        with unit_lock(unit.path):
            if unit.path.exists():
                if (damage := split_damage(unit.path)) is None:  # imported while we waited
                    result.skip(unit.path, split_name(unit), "finished by another run")
                    continue
                progress.say(repair_line(damage, f"Importing {path.name} again."))
                discard(unit.path)
            with result.build(unit.path, split_name(unit), f"import {path.name}"):
                write_split(read[path], unit.path)
    return result


def unit_split(plan: Plan, unit: FeatureUnit) -> Callable[[], Any]:
    """The dataset split of ``unit``, read once when first asked for (fit_rows: a sample)."""
    return functools.cache(lambda: load_unit_split(plan.pipeline, unit))


def check_pending_inputs(
    pending: list[FeatureUnit], splits: dict[Path, Callable], transform: Any = None
) -> None:
    """Read every split still to extract and check its inputs (every image file's header,
    :func:`~etn_cli.datasets.base.check_inputs`), so that a bad file in the last split stops
    the run before the first split is written."""
    for unit in pending:
        split = splits[unit.path]()
        if len(split) == 0:
            raise EtnError(
                f"Expected rows for split {unit.path.name!r}, but the dataset split is empty; "
                "nothing was written. Check that the dataset split is not empty."
            )
        check_sizes(unit, check_inputs(split), transform)
        if unit.role == "test":
            check_test_classes(unit, getattr(split.data, "labels", None))


def check_sizes(unit: FeatureUnit, sizes: Any, transform: Any) -> None:
    """Images the backbone's transform leaves of several sizes cannot share a batch; said
    before anything is extracted (the images were decoded to be checked)."""
    if not sizes or transform is None:
        return
    shapes = sorted({transform.output_size(*size) for size in sizes})
    if len(shapes) > 1:
        raise EtnError(
            f"Images of split {unit.path.name!r} come to the sizes {shapes[:3]} (width, height) "
            "after the backbone's resize and crop; the model needs one size. Set crop = N (and "
            "resize) in the pipeline's [backbone] table."
        )


def check_test_classes(unit: FeatureUnit, labels: Any) -> None:
    """A test split of one class makes every confidence metric meaningless (nothing wrong to
    rank against right); said before anything is extracted, where the labels are known."""
    if labels is None:
        return
    classes = np.unique(np.asarray(labels)[np.asarray(labels) >= 0])
    if len(classes) == 1:
        raise EtnError(
            f"The ID test split {unit.split!r} of {unit.dataset} holds only class {classes[0]} "
            f"in its {len(labels)} rows; expected at least two classes, or confidence metrics "
            "cannot rank right against wrong. Use a test split with several classes."
        )


def load_weights(backbone: Any) -> None:
    """Build the model now: the torchvision and Hugging Face backbones build it lazily, as
    their ``model``, and weights or an adapter that do not fit must fail before any lock or
    split is written. Backbones without a lazy ``model`` load in :func:`load_backbone`."""
    getattr(backbone, "model", None)


def extract_unit(
    plan: Plan,
    unit: FeatureUnit,
    split: Callable[[], Any],
    backbone: Callable[[], Any],
    device: str,
    world: World,
    result: StageResult,
) -> None:
    """Claim one split, write this process's share of it and publish it, or skip it."""
    quiet = not world.main
    with contextlib.ExitStack() as lock:
        claimed = claim(plan, unit, lambda: len(split()), world, lock)
        if claimed.layout is None:
            result.skip(unit.path, split_name(unit), claimed.reason, quiet=quiet)
            return
        layout, started = claimed.layout, time.perf_counter()
        report_fields = functools.partial(manifest_fields, plan, unit, layout, world, started)

        def fields(reports: list[dict]) -> dict[str, Any]:  # and e.g. an LLM's example prompt
            return report_fields(reports) | plan.backbone.manifest_extras(split())

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
    ``sink``, in order; return the seconds spent in forward passes. Each batch is started
    (``Backbone.start_batch``) before the previous one's outputs are waited for and stored, so
    on a GPU the next forward pass runs while the host stores the last."""
    forward_s = 0.0
    pending = None
    for inputs, labels, index in batches:
        tick = time.perf_counter()
        started = backbone.start_batch(inputs)
        forward_s += time.perf_counter() - tick
        if pending is not None:
            forward_s += store_outputs(sink, *pending)
        pending = (started, labels, index)
    if pending is not None:
        forward_s += store_outputs(sink, *pending)
    return forward_s


def store_outputs(sink: BackgroundAppender, outputs: Any, labels: Any, index: Any) -> float:
    """Wait for a started batch's outputs and put them into ``sink``; the seconds waited."""
    tick = time.perf_counter()
    hidden, logits, extras = outputs()
    waited = time.perf_counter() - tick
    sink.put(hidden, logits, labels, index, extras)
    return waited


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
        backbone = template
    else:
        backbone = type(template)(template.config, template.cache_dir, device)
    if plan.finetune is not None:
        backbone.use_finetuned(require_finetuned(plan.finetune))
    check_id_classes(plan, backbone)  # before any split is claimed (extract loads it first)
    return backbone


CLASSIFIER_UNIT = "classifier (backbone's final layer)"


def store_classifier(plan: Plan, backbone: Callable[[], Any]) -> None:
    """Save the backbone's final layer once per backbone, for the baselines that start from it:
    one unit of the run, after the feature splits, as ``etn status`` lists it."""
    path = plan.classifier_path
    if path is None:
        return
    if classifier_damage(path) is None:
        progress.skipped("extract", CLASSIFIER_UNIT)
        return
    with (
        progress.unit("extract", CLASSIFIER_UNIT, "no intact classifier.safetensors"),
        unit_lock(path),
    ):
        if (damage := classifier_damage(path)) is not None:
            if path.exists():  # derived from the backbone: saved again
                progress.say(repair_line(damage, "Saving it again."))
                discard(path)
            weights = backbone().classifier()
            save_classifier(path, weights["weight"], weights["bias"], provenance())


def classifier_damage(path: Path) -> str | None:
    """None when the stored classifier reads and matches its recorded sha256; else why not."""
    if not path.exists():
        return "missing"
    try:
        load_classifier(path)
    except EtnError as err:
        return str(err)
    return None
