"""Minibatch training steps, replayed from a CUDA graph on a GPU.

A head's step on a batch of 64 rows is a few hundred small kernels: launched one by one from
Python, the GPU waits on the host (about 4 ms a step for the scalar ETN at ImageNet shape). On
CUDA, :class:`Steps` runs the first steps eagerly (warm-up on a side stream, as capture needs),
then captures one whole step — forward, backward, optimizer — in a CUDA graph and replays it
for every later full batch: one launch per step, no host synchronisation inside an epoch. The
rows stay on the device and a batch is gathered there by index. A step the graph cannot hold
(it reads a value back to the host, or uses a CPU tensor) makes the capture fail; training then
goes on eagerly with the same results, and :attr:`Steps.mode` says so. ``ETN_CUDA_GRAPHS=0``
turns graphs off. On the CPU every step runs eagerly, exactly as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

WARMUP = 3  # eager steps before capture (lazy optimizer state, cuBLAS workspaces)


def use_graphs(device: torch.device) -> bool:
    """Whether steps on ``device`` are captured: on CUDA unless ``ETN_CUDA_GRAPHS=0``."""
    return device.type == "cuda" and os.environ.get("ETN_CUDA_GRAPHS", "1") != "0"


class Steps:
    """Runs ``step(*batch)`` on the rows ``idx`` of ``data`` (tensors on one device).

    ``step`` does the whole update (loss, gradients, optimizer step, running sums kept in
    tensors it owns) and returns nothing; ``optimizers`` are those it steps, whose learning
    rate :meth:`set_lr` sets (a device tensor read by the fused kernels under a graph, so a
    schedule reaches the replays)."""

    def __init__(
        self,
        step: Callable[..., None],
        data: tuple[torch.Tensor, ...],
        batch_size: int,
        optimizers: list[torch.optim.Optimizer],
    ) -> None:
        self.step, self.data, self.batch_size = step, data, batch_size
        self.optimizers = optimizers
        device = data[0].device
        self.capturing = use_graphs(device) and batch_size <= len(data[0])
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failure: str | None = None
        self.eager_steps = 0
        if self.capturing:
            self.idx = torch.zeros(batch_size, dtype=torch.int64, device=device)
            self.side = torch.cuda.Stream(device)
            for group in self._groups():  # fused kernels read a tensor learning rate
                group["lr"] = torch.tensor(float(group["lr"]), device=device)
                if "capturable" in group:  # Adam: allowed under capture (fused: no change)
                    group["capturable"] = True
            for optimizer in optimizers:  # its eager warm-up steps are expected here
                optimizer._warned_capturable_if_run_uncaptured = True  # type: ignore[attr-defined]
        self._lr: float | None = None

    @property
    def mode(self) -> str:
        """``cuda graph`` once steps replay from a graph, else ``eager``."""
        return "cuda graph" if self.graph is not None else "eager"

    def _groups(self) -> list[dict]:
        return [g for optimizer in self.optimizers for g in optimizer.param_groups]

    def set_lr(self, value: float) -> None:
        """The learning rate of the coming steps (every parameter group)."""
        if value == self._lr:
            return
        self._lr = value
        for group in self._groups():
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(value)
            else:
                group["lr"] = value

    def __call__(self, idx: torch.Tensor) -> None:
        """One step on the rows ``idx`` (a tensor on the data's device)."""
        full = len(idx) == self.batch_size
        if full and self.graph is None and self.capturing and self.eager_steps >= WARMUP:
            self._capture()
        if full and self.graph is not None:
            self.idx.copy_(idx)
            self.graph.replay()
            return
        if self.capturing and self.graph is None:  # warm-up: on a side stream
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                self.step(*(t[idx] for t in self.data))
            torch.cuda.current_stream().wait_stream(self.side)
        else:
            self.step(*(t[idx] for t in self.data))
        self.eager_steps += 1

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates them
        try:
            with torch.cuda.graph(graph):
                self.step(*(t[self.idx] for t in self.data))
        except Exception as error:
            self.capturing = False
            self.failure = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            log.warning("Training steps run eagerly: a CUDA graph failed (%s).", self.failure)
            return
        self.graph = graph

    def close(self) -> None:
        """Free the graph and its memory pool (gradients included)."""
        self.graph = None
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
