"""The threads etn's own passes over row blocks run on: torch's intra-op pool, never a pool of
etn's own beside it (no oversubscription), and one thread of it for a pass of many short
memory-bound operations.

Each torch operation on a large enough tensor is one parallel region of torch's threads, and a
region ends when its slowest thread is done. On a machine whose cores other processes share, a
thread that the scheduler takes off its core in a region holds every other thread at the
region's end for a time slice, so a pass of many short operations (a softmax's terms row block
by row block) pays a time slice per operation where one long operation pays one: measured on
this project's 2-core machine under load (`benchmarks/README.md`, "Post-hoc scorers under
load"), the maximum probability of 50,000 x 1,000 logits took 3.3 s on two threads against 0.68 s
on one. Such a pass gains little from a second thread on an idle machine (it is bound by memory,
not arithmetic), so :func:`one_thread` runs it on one; products keep torch's threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads at one for the block, restored after (also on an error); a
    setting already at one is left alone."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
