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

from etn_cli import progress
from etn_cli.datasets.class_check import check_id_classes
from etn_cli.errors import EtnError
from etn_cli.planning.plan import FeatureUnit, Plan, load_unit_split
from etn_cli.provenance import provenance
from etn_cli.stages.distributed import World, current_world, from_main, join, rank_device
from etn_cli.stages.extract_ranks import claim, manifest_fields, open_share, publish_split
from etn_cli.stages.input_checks import check_splits
from etn_cli.stages.prepare import require_prepared
from etn_cli.stages.result import StageResult
from etn_cli.stages.shard_sink import BackgroundAppender, shard_sink
from etn_cli.stages.units import Unit, build_unit, build_units
from etn_cli.store.artefacts.classifier import save_classifier
from etn_cli.store.artefacts.damage import classifier_damage
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
        refuse_unprepared(plan)  # the features' keys name the weights stage zero built
        backbone = functools.cache(lambda: load_backbone(plan, device))  # only if there is work
        splits = {unit.path: unit_split(plan, unit) for unit in plan.feature_units}
        pending = [unit for unit in plan.feature_units if not split_is_complete(unit.path)]
        if pending:  # every input checked and the model loaded before anything is written
            transform = getattr(backbone(), "transform", None)  # images: their sizes
            check = functools.partial(check_pending_inputs, pending, splits, transform)
            from_main(world, check, "checking the input files")
            load_weights(backbone())
        if world.main:  # the digests of the input files learnt while planning
            save_memos()
        for unit in plan.feature_units:
            extract_unit(plan, unit, splits[unit.path], backbone, device, world, result)
        if world.main:
            store_classifier(plan, backbone, result)
    return result


def import_features(plan: Plan, result: StageResult) -> StageResult:
    """The extract stage of a ``[features]`` pipeline: import the files not imported yet
    (:mod:`etn_cli.own_features.importer`); folders of shards are read where they are."""
    from etn_cli.own_features.importer import check_before_import, read_checked

    read: dict[Path, Any] = {}

    def before(todo: list[ImportedSplit]) -> None:  # the checks train and evaluate would make
        read.update(read_checked({u.file: u.unit.role for u in todo}))
        check_before_import(plan, read)

    found = [ImportedSplit(unit, read) for unit in plan.feature_units]
    return build_units(found, result, before=before)


class ImportedSplit(Unit):
    """A split imported from a file of your own features (or, with no file, a folder of shards
    read where it is, never built)."""

    kept = "your own features"

    def __init__(self, unit: FeatureUnit, read: dict[Path, Any]) -> None:
        self.unit, self.read = unit, read
        file = (unit.fingerprint or {}).get("file")
        self.file = Path(file) if file is not None else None
        self.path, self.name = unit.path, split_name(unit)
        self.why = f"import {self.file.name}" if self.file else ""
        self.again = f"Importing {self.file.name} again." if self.file else ""

    def damage(self) -> str | None:
        if self.file is None:
            return None
        if not self.path.exists():
            return "missing"
        return split_damage(self.path) or (None if split_is_complete(self.path) else "missing")

    def clear(self) -> None:
        """Nothing: an import writes through a journal, as extraction does."""

    def write(self, force: bool) -> None:
        from etn_cli.own_features.importer import write_split

        write_split(self.read[self.file], self.path)


def unit_split(plan: Plan, unit: FeatureUnit) -> Callable[[], Any]:
    """The dataset split of ``unit``, read once when first asked for (fit_rows: a sample)."""
    return functools.cache(lambda: load_unit_split(plan.pipeline, unit))


def check_pending_inputs(
    pending: list[FeatureUnit], splits: dict[Path, Callable], transform: Any = None, roles=None
) -> None:
    """Read every split still to extract and check its inputs
    (:mod:`~etn_cli.stages.input_checks`), so that a bad file in the last split stops the run
    before the first split is written; every problem is listed at once."""
    check_splits([(unit, splits[unit.path]) for unit in pending], transform, roles)


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
            return report_fields(reports) | backbone().manifest_extras(split())

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
    """How a feature unit is named in progress lines: ``digits.test`` (its role if own); the
    rows of the adaptation split that ``[conformal]`` holds out of fitting are
    ``digits.adapt (held out for calibration)``."""
    if not unit.dataset:
        return f"{unit.name} ({unit.role})"
    held_out = unit.part is not None and unit.part[0] == "holdout"
    return f"{unit.dataset}.{unit.split}" + (" (held out for calibration)" if held_out else "")


def refuse_unprepared(plan: Plan) -> None:
    """A plan made before the backbone's stage zero was built names features by weights that
    did not exist yet: one line saying how to plan for extraction instead."""
    spec = plan.backbone
    if spec is not None and spec.cache_folder is not None and not spec.cache_folder.is_dir():
        raise EtnError(
            f"Expected the {spec.name} backbone built in {spec.cache_folder} before the plan "
            "was made, found none: its features are keyed by its weights. Plan with "
            "etn_cli.stages.prepare.plan_for_extract (as `etn extract` and `etn run` do)."
        )


def load_backbone(plan: Plan, device: str) -> Any:
    """The plan's backbone, built from its spec on ``device``, with ``etn finetune``'s output
    when the pipeline has a ``[finetune]`` table."""
    from etn_cli.stages.finetune import require_finetuned

    backbone = plan.backbone.build(device)
    if plan.finetune is not None:
        backbone.use_finetuned(require_finetuned(plan.finetune))
    require_prepared(backbone)  # the digits CNN's weights, checked
    check_id_classes(plan, backbone)  # before any split is claimed (extract loads it first)
    return backbone


CLASSIFIER_UNIT = "classifier (backbone's final layer)"


def store_classifier(plan: Plan, backbone: Callable[[], Any], result: StageResult) -> None:
    """Save the backbone's final layer once per backbone, for the baselines that start from it:
    one unit of the run, after the feature splits, as ``etn status`` lists it (and counted in
    the extract summary, so that a run's ``N built`` agrees with its ``[k/N]``)."""
    if plan.classifier_path is not None:
        build_unit(ExtractedClassifier(plan.classifier_path, backbone), result)


class ExtractedClassifier(Unit):
    """The backbone's final layer, one sealed safetensors file beside the splits."""

    name = CLASSIFIER_UNIT
    why = "no intact classifier.safetensors"
    again = "Saving it again."  # derived from the backbone

    def __init__(self, path: Path, backbone: Callable[[], Any]) -> None:
        self.path, self.backbone = path, backbone

    def damage(self) -> str | None:
        return classifier_damage(self.path)

    def write(self, force: bool) -> None:
        weights = self.backbone().classifier()
        save_classifier(self.path, weights["weight"], weights["bias"], provenance())
