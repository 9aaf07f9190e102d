"""Which batches of a split a process still has to run: extraction's one resume logic.

A split is read in B batches of ``[data] batch_size`` rows, always in the same order, and what
a process writes is described as runs of consecutive batches (a torchrun piece is one; so is
everything after the shards a journal kept). :func:`batches_in` reads the runs still to do
from a loader over the whole split: a sequential ``DataLoader`` reads only their rows (no image
is decoded twice); any other loader (LLM prompts sorted by length, say) is read through the
batches in between without a forward pass, and those of them that finished shards hold are
checked to carry the same rows, so a loader that changed its order is never resumed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.writing.checks import to_numpy


class Batches(Protocol):
    """Batches [first_batch, stop_batch) holding rows [first_row, stop_row) of a split; None
    stops: to the end (a :class:`~etn_cli.store.Piece` is one)."""

    @property
    def first_batch(self) -> int: ...
    @property
    def stop_batch(self) -> int | None: ...
    @property
    def first_row(self) -> int: ...
    @property
    def stop_row(self) -> int | None: ...


@dataclass(frozen=True)
class Run:
    first_batch: int
    stop_batch: int | None
    first_row: int
    stop_row: int | None


def batches_in(
    loader: Iterable,
    todo: Sequence[Batches],
    done: Sequence[tuple[Batches, np.ndarray]] = (),
    where: str = "the split",
) -> Iterator:
    """The batches of the runs ``todo``, in order, from a loader over the whole split of
    ``where``; ``done`` pairs runs finished earlier with their ``index`` (R,), checked against
    the loader's wherever it has to be read through them."""
    runs = _joined(todo)
    if not runs:
        return iter(())
    sliced = [tail_loader(loader, r.first_batch, r.first_row, r.stop_row) for r in runs]
    if all(part is not None for part in sliced):
        return itertools.chain.from_iterable(sliced)
    return _read_through(loader, runs, done, where)


def remaining_batches(loader: Iterable, writer: Any) -> Iterator:
    """The batches of ``loader`` after the ``writer.resumed_batches`` that the shards a
    resumable :class:`~etn_cli.store.ShardWriter` adopted from its journal already hold."""
    skip, rows = writer.resumed_batches, len(writer.resumed_index)
    done = [(Run(0, skip, 0, rows), writer.resumed_index)] if skip else []
    return batches_in(loader, [Run(skip, None, rows, None)], done, writer.split_dir.name)


def tail_loader(loader: Any, skip: int, rows: int, stop_row: int | None = None) -> Any:
    """A copy of a sequential ``DataLoader`` that starts after its first ``skip`` batches and
    stops at row ``stop_row``, or None when ``loader`` is not one (or the skipped batches do
    not hold ``rows`` rows); the loader itself when that is all of it."""
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return None
    size = len(loader.dataset)
    if min(skip * loader.batch_size, size) != rows:
        return None
    if rows == 0 and (stop_row is None or stop_row >= size):
        return loader
    return sliced_loader(loader, rows, size if stop_row is None else stop_row)


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


def _joined(runs: Sequence[Batches]) -> list[Batches]:
    """Runs that follow each other as one run each (one loader slice each)."""
    joined: list[Batches] = []
    for run in runs:
        if joined and joined[-1].stop_batch == run.first_batch:
            last = joined.pop()
            run = Run(last.first_batch, run.stop_batch, last.first_row, run.stop_row)
        joined.append(run)
    return joined


def _read_through(
    loader: Iterable, runs: list[Batches], done: Sequence[tuple[Batches, np.ndarray]], where: str
) -> Iterator:
    """Yield the batches of ``runs``, reading through the others without a forward pass; stop
    after the last batch ``runs`` want. Finished runs read on the way must hold their rows."""
    last = runs[-1].stop_batch
    ahead = [(run, index, []) for run, index in done if last is None or run.stop_batch <= last]
    for number, batch in enumerate(loader):
        if any(_holds(run, number) for run in runs):
            yield batch
        for run, index, read in ahead:
            if _holds(run, number):
                read.append(to_numpy(batch[2]))
                if number == run.stop_batch - 1:
                    _check_same_rows(run, index, read, where)
        if number + 1 == last:
            break
    for run, index, read in ahead:  # a loader that ended before a finished run was read
        if len(read) < run.stop_batch - run.first_batch:
            _check_same_rows(run, index, read, where)


def _holds(run: Batches, number: int) -> bool:
    return run.first_batch <= number and (run.stop_batch is None or number < run.stop_batch)


def _check_same_rows(run: Batches, index: np.ndarray, read: list[np.ndarray], where: str) -> None:
    found = np.concatenate(read).astype(np.int64) if read else np.empty(0, np.int64)
    if not np.array_equal(found, index):
        raise EtnError(
            f"Expected batches {run.first_batch}..{run.stop_batch - 1} of {where} to hold the "
            f"{len(index)} rows an interrupted run wrote, found {len(found)} rows in another "
            "order; the interrupted shards were discarded. Run etn extract again to start afresh."
        )
