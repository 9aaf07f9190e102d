"""Where extraction puts each batch's outputs: the shard writer, inline or in a thread.

On a GPU the forward pass and the writing of shards overlap: a writer thread appends each
batch's outputs (checks, HDF5 writes, checksums) while the main thread runs the next batch,
with a bounded queue between them so memory stays flat. On the CPU the same writing runs
inline, where a thread would compete with the forward pass for the same cores. An error in the
writer thread is raised again in the main thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

QUEUE_BATCHES = 4  # batches waiting for the writer: enough to smooth bursts, little memory
POLL_SECONDS = 0.1


def shard_sink(append: Callable[..., None], device: str) -> BackgroundAppender:
    """Where extraction puts its batches: a writer thread that overlaps writing with the next
    forward pass on a GPU; inline on the CPU, where the thread would compete with the forward
    pass for the same cores (``benchmarks/bench_extract.py``: 1.08x the forward pass inline,
    1.16x threaded, on 2 cores)."""
    return BackgroundAppender(append, threaded=device.startswith("cuda"))


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
