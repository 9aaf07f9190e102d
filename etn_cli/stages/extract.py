"""Stage 1: run the backbone once per dataset split and cache hidden states and logits.

On a GPU the forward pass and the writing of shards overlap: a writer thread appends each
batch's outputs to the :class:`ShardWriter` (checks, HDF5 writes, checksums) while the main
thread runs the next batch, with a bounded queue between them so memory stays flat; on the CPU
the same writing runs inline (:func:`shard_sink`). An error in the
writer thread is raised again in the main thread, and no error leaves a split folder under its
final name. Extraction resumes at shard granularity: every finished shard is journaled in the
split's private folder (:mod:`etn_cli.store.journal`), a run killed at any moment leaves them
there, and the next run adopts them and skips the batches they hold (the batch order is
deterministic and shards end at batch boundaries, so the result equals an uninterrupted run).
Refused data (NaN, wrong shapes) discards the private folder. Backbones run their forward
passes under ``torch.inference_mode`` themselves; this stage does not impose it, since ODIN
needs a gradient. Batches come from ``backbone.loader(split, batch_size, workers,
pin_memory)``: the torchvision backbone uses ``[data] workers`` loader processes and pinned
memory on CUDA; the base class falls back to ``batches(split, batch_size)``. Under torchrun the
ranks share each split out and rank 0 merges their pieces (:mod:`etn_cli.stages.extract_ranks`).
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from etn_cli.datasets.class_check import check_id_classes
from etn_cli.distributed import torchrun_world
from etn_cli.errors import EtnError
from etn_cli.heads.training import progress
from etn_cli.plan import FeatureUnit, Plan, open_source
from etn_cli.provenance import provenance
from etn_cli.stages.result import StageResult
from etn_cli.store.atomic import unit_lock
from etn_cli.store.checks import to_numpy
from etn_cli.store.fingerprint import canonical_json
from etn_cli.store.manifest import split_is_complete
from etn_cli.store.shards import ShardWriter, save_classifier
from etn_cli.store.storage import ensure_writable, explained_storage_errors

QUEUE_BATCHES = 4  # batches waiting for the writer: enough to smooth bursts, little memory
POLL_SECONDS = 0.1


def extract(plan: Plan, *, device: str = "cpu") -> StageResult:
    """Write every missing feature unit of ``plan``; finished units are left untouched, and
    a unit a killed run left half done is resumed from its journaled shards."""
    result = StageResult("extract")
    if plan.backbone is None:  # your own features: files are imported, folders read in place
        from etn_cli.own_features.importer import import_features

        with explained_storage_errors():
            return import_features(plan, result)
    world = torchrun_world()
    with explained_storage_errors():
        if world is None:
            _extract_units(plan, device, result)
        else:  # torchrun: every rank extracts a block of each split, rank 0 merges
            from etn_cli.stages.extract_ranks import extract_on_ranks

            extract_on_ranks(plan, device, result, world)
    return result


def _extract_units(plan: Plan, device: str, result: StageResult) -> None:
    backbone = cache(lambda: load_backbone(plan, device))  # built only when there is work
    for unit in plan.feature_units:
        if split_is_complete(unit.path):
            result.skip(unit.path, split_name(unit))
            continue
        ensure_writable(unit.path.parent)
        with unit_lock(unit.path):
            if split_is_complete(unit.path):  # another process finished it while we waited
                result.skip(unit.path, split_name(unit), "finished by another run")
                continue
            with result.build(unit.path, split_name(unit), "no manifest with this key"):
                extract_split(plan, unit, backbone(), device)
    store_classifier(plan, backbone)


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
    check_id_classes(plan, backbone)  # before the first split is written
    return backbone


def batches_of(backbone: Any, split: Any, plan: Plan, device: str) -> Iterable:
    data = plan.pipeline.data
    assert data is not None
    pin = device.startswith("cuda")
    return backbone.loader(split, data.batch_size, workers=data.workers, pin_memory=pin)


def extract_split(plan: Plan, unit: FeatureUnit, backbone: Any, device: str) -> None:
    """Write one split's shards and manifest, resuming from an interrupted run's shards."""
    data = plan.pipeline.data
    assert data is not None
    split = open_source(plan.pipeline, unit.dataset).load_split(unit.split)
    record = provenance()
    started = time.perf_counter()
    fingerprint = unit.fingerprint or {}
    resume = {"batch_size": data.batch_size}  # the batches must be the same to skip them
    with ShardWriter(unit.path, fingerprint, data.shard_rows, record, resume=resume) as writer:
        with shard_sink(writer.append, device) as sink:
            total = -(-len(split) // data.batch_size) - writer.resumed_batches
            batches = remaining_batches(batches_of(backbone, split, plan, device), writer)
            batches = progress(batches, f"extract {unit.path.name}", total)
            forward_s = forward_into(sink, backbone, batches)
        computed = max(1, len(split) - len(writer.resumed_index))
        writer.extra["timing"] = {
            "wall_s": time.perf_counter() - started,
            "forward_s": forward_s,
            "forward_s_per_sample": forward_s / computed,
            "write_s": sink.busy_s,
            "waiting_for_writer_s": sink.blocked_s,
        }
        writer.extra["loaded_backbone"] = json.loads(canonical_json(backbone.fingerprint()))
        writer.extra.update(backbone.manifest_extras(split))
        writer.extra["loader"] = {"batch_size": data.batch_size, "workers": data.workers}


def shard_sink(append: Callable[..., None], device: str) -> BackgroundAppender:
    """Where extraction puts its batches: a writer thread that overlaps writing with the next
    forward pass on a GPU; inline on the CPU, where the thread would compete with the forward
    pass for the same cores (``benchmarks/bench_extract.py``: 1.08x the forward pass inline,
    1.16x threaded, on 2 cores)."""
    return BackgroundAppender(append, threaded=device.startswith("cuda"))


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


def remaining_batches(loader: Iterable, writer: ShardWriter) -> Iterable:
    """The batches after the ``writer.resumed_batches`` that adopted shards already hold.

    A torch ``DataLoader`` reading its dataset in order restarts at the first row not yet
    written (no image is decoded twice); any other loader is read through the skipped batches
    without a forward pass, checking that they hold the rows the shards hold.
    """
    skip = writer.resumed_batches
    if skip == 0:
        return loader
    tail = tail_loader(loader, skip, len(writer.resumed_index))
    return tail if tail is not None else _skipped(loader, skip, writer.resumed_index, writer)


def tail_loader(loader: Any, skip: int, rows: int) -> Any:
    """A copy of a sequential ``DataLoader`` that starts after its first ``skip`` batches, or
    None when ``loader`` is not one (or the skipped batches do not hold ``rows`` rows)."""
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return None
    size = len(loader.dataset)
    if min(skip * loader.batch_size, size) != rows:
        return None
    return sliced_loader(loader, rows, size)


def sliced_loader(loader: Any, start: int, stop: int) -> Any:
    """A copy of a sequential ``DataLoader`` that reads only rows [start, stop) of its dataset,
    in batches of the same size, or None when ``loader`` is not one."""
    from torch.utils.data import DataLoader, SequentialSampler, Subset

    if not isinstance(loader, DataLoader) or not isinstance(loader.sampler, SequentialSampler):
        return None
    if loader.batch_size is None or loader.drop_last:
        return None
    options = {
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers:
        options["prefetch_factor"] = loader.prefetch_factor
    rows = range(start, min(stop, len(loader.dataset)))
    return DataLoader(Subset(loader.dataset, rows), shuffle=False, **options)


def _skipped(loader: Iterable, skip: int, covered: np.ndarray, writer: ShardWriter) -> Iterator:
    batches = iter(loader)
    seen = [to_numpy(index) for _, _, index in itertools.islice(batches, skip)]
    found = np.concatenate(seen).astype(np.int64) if seen else np.empty(0, np.int64)
    if not np.array_equal(found, covered):
        raise EtnError(
            f"Expected the first {skip} batches of {Path(writer.split_dir).name} to hold the "
            f"{len(covered)} rows its interrupted run wrote, found {len(found)} rows in another "
            "order; the interrupted shards were discarded. Run etn extract again to start afresh."
        )
    yield from batches


class BackgroundAppender:
    """Call ``append(*batch)`` in a thread, fed through a bounded queue.

    ``put`` blocks while the queue is full and raises at once if the thread has failed;
    leaving the block waits for the thread to write everything and re-raises its error. When
    the block itself fails, the thread is told to stop and joined before the error goes on.
    With ``threaded=False``, ``put`` calls ``append`` itself (same interface and timings).
    """

    def __init__(
        self, append: Callable[..., None], depth: int = QUEUE_BATCHES, *, threaded: bool = True
    ) -> None:
        self.append = append
        self.threaded = threaded
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.busy_s = 0.0  # time the thread spent appending
        self.blocked_s = 0.0  # time the main thread waited for room in the queue
        self.thread = threading.Thread(target=self._run, name="etn-shard-writer", daemon=True)

    def __enter__(self) -> BackgroundAppender:
        if self.threaded:
            self.thread.start()
        return self

    def put(self, *batch: Any) -> None:
        tick = time.perf_counter()
        if not self.threaded:
            self.append(*batch)
            self.busy_s += time.perf_counter() - tick
            return
        while True:
            self._raise_if_failed()
            try:
                self.queue.put(batch, timeout=POLL_SECONDS)
                break
            except queue.Full:
                continue
        self.blocked_s += time.perf_counter() - tick

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is not None:
            self.stop.set()
        while self.threaded and self.thread.is_alive():
            try:
                self.queue.put(None, timeout=POLL_SECONDS)  # the end-of-batches marker
                break
            except queue.Full:
                continue
        if self.threaded:
            self.thread.join()
        if kind is None:
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            batch = self.queue.get()
            if batch is None or self.stop.is_set():
                return
            tick = time.perf_counter()
            try:
                self.append(*batch)
            except BaseException as err:  # handed to the main thread, which raises it
                self.error = err
                return
            finally:
                self.busy_s += time.perf_counter() - tick


def store_classifier(plan: Plan, backbone: Callable[[], Any]) -> None:
    path = plan.classifier_path
    if path is None or path.exists():
        return
    with unit_lock(path):
        if not path.exists():
            weights = backbone().classifier()
            save_classifier(path, weights["weight"], weights["bias"], provenance())
