"""Running under ``torchrun``: which process this is, its device, and small collectives.

``torchrun --nproc-per-node N -m etn_cli extract P.toml`` starts N processes with ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` in their environment. etn then joins them in one process
group (once per process, left at exit) and exchanges only small Python objects: which splits
need work, and whether every rank succeeded. Those collectives run on the CPU with gloo even
when the backbone runs on CUDA: they carry no tensors, and gloo waits as long as the slowest
rank needs (NCCL's watchdog would abort a rank that waits more than its timeout for a long
split). A rank that fails says so in the next collective, so every rank exits non-zero with
the same one-line message instead of waiting forever in a barrier.

A single process is the world of one (:data:`SINGLE`): it joins no process group, keeps its
device, and its collectives return at once, so code written for any number of ranks runs
unchanged without torchrun.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from etn_cli.errors import EtnError

BACKEND = "gloo"
# A rank with little work waits at the end of each split for the slowest one.
COLLECTIVE_TIMEOUT = timedelta(hours=24)
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the ``size`` processes torchrun started."""

    rank: int
    size: int
    local_rank: int

    @property
    def main(self) -> bool:
        return self.rank == 0

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.size}"


SINGLE = World(rank=0, size=1, local_rank=0)


def current_world() -> World:
    """The :class:`World` of this process: torchrun's, or :data:`SINGLE`."""
    return torchrun_world() or SINGLE


def torchrun_world() -> World | None:
    """The :class:`World` torchrun described in the environment, or None for a single process
    (no torchrun, or ``--nproc-per-node 1`` on one node)."""
    if int(os.environ.get("WORLD_SIZE", "1") or "1") <= 1:
        return None
    try:
        values = {name: int(os.environ[name]) for name in ENV}
    except (KeyError, ValueError):
        found = {name: os.environ.get(name) for name in ENV}
        raise EtnError(
            f"WORLD_SIZE > 1 asks for several processes, but RANK, WORLD_SIZE and LOCAL_RANK are "
            f"{found}; expected integers set by torchrun. Start etn with torchrun, or unset "
            "WORLD_SIZE."
        ) from None
    return World(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])


def is_main_process() -> bool:
    """True outside torchrun and on rank 0: the process that prints and goes on alone."""
    world = torchrun_world()
    return world is None or world.main


def refuse_under_torchrun(command: str) -> None:
    """Stop a command that has no multi-process mode before every rank runs it in parallel."""
    world = torchrun_world()
    if world is not None:
        raise EtnError(
            f"etn {command} runs in one process, but torchrun started {world.size}. Run it "
            "without torchrun; under torchrun use etn extract or etn run (extraction is split "
            "over the ranks, then rank 0 alone trains, evaluates and reports)."
        )


def join(world: World) -> None:
    """Join torchrun's process group (once per process); it is left when the process exits."""
    if world.size == 1:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        return
    dist.init_process_group(BACKEND, timeout=COLLECTIVE_TIMEOUT)
    if (dist.get_rank(), dist.get_world_size()) != (world.rank, world.size):
        raise EtnError(
            f"The process group has rank {dist.get_rank()} of {dist.get_world_size()}, but the "
            f"environment says {world}. Start etn with torchrun and leave RANK and WORLD_SIZE "
            "to it."
        )
    atexit.register(leave)


def leave() -> None:
    """Destroy the process group if this process joined one."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: str, world: World) -> str:
    """The device of this rank: ``cuda`` becomes ``cuda:LOCAL_RANK``; another fixed GPU is
    refused, since every rank would share it; ``cpu`` stays as it is."""
    own = f"cuda:{world.local_rank}"
    if world.size == 1 or not device.startswith("cuda") or device == own:
        return device
    if device != "cuda":
        raise EtnError(
            f"Under torchrun each rank uses the GPU cuda:LOCAL_RANK, but --device is {device!r}, "
            "which every rank would share. Pass --device cuda (or auto), and choose GPUs with "
            "CUDA_VISIBLE_DEVICES."
        )
    import torch

    if world.local_rank >= torch.cuda.device_count():
        raise EtnError(
            f"{world} has LOCAL_RANK {world.local_rank}, but this node shows "
            f"{torch.cuda.device_count()} GPU(s). Start at most that many processes per node "
            "(torchrun --nproc-per-node)."
        )
    torch.cuda.set_device(world.local_rank)
    return own


def from_main(world: World, compute: Callable[[], T], what: str) -> T:
    """Run ``compute`` on rank 0 and hand its value to every rank. When it fails, rank 0
    raises its own error and every other rank an :class:`EtnError` naming it."""
    if world.size == 1:
        return compute()
    payload: list[Any] = [None]
    error: BaseException | None = None
    if world.main:
        try:
            payload[0] = ("ok", compute())
        except BaseException as err:  # told to the other ranks, then raised here
            error = err
            payload[0] = ("failed", describe(err))
    _collective(lambda: _broadcast(payload), what, world)
    if error is not None:
        raise error
    state, value = payload[0]
    if state != "ok":
        raise EtnError(f"Rank 0 of {world.size} failed while {what}: {value}")
    return value


def gather(world: World, value: T, what: str) -> list[T]:
    """``value`` of every rank, in rank order, on every rank."""
    if world.size == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * world.size
    _collective(lambda: dist.all_gather_object(values, value), what, world)
    return values


def describe(error: BaseException) -> str:
    """One line for another rank: an EtnError's message, or a bug's type and message (the
    failing rank raises it again, with its traceback)."""
    if isinstance(error, EtnError):
        return str(error)
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first} (a bug; its traceback is in that rank's output)"


def _broadcast(payload: list[Any]) -> None:
    import torch.distributed as dist

    dist.broadcast_object_list(payload, src=0)


def _collective(call: Callable[[], Any], what: str, world: World) -> None:
    """Run one collective; a rank that died or hung becomes one line, not a gloo traceback."""
    try:
        call()
    except RuntimeError as err:  # gloo's errors (DistBackendError and others) derive from it
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise EtnError(
            f"{world} lost contact with the other ranks while {what} ({first}); another rank "
            "probably died or was killed. Its output says why; run the same torchrun command "
            "again to resume."
        ) from None


def resolve_device(device: str) -> str:
    """``auto`` as ``cuda`` where a GPU is visible, else ``cpu``; any other name is checked
    here, before any work, so a wrong one is one line instead of a traceback mid-run."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise EtnError(
            f"Unknown device {device!r}. Use cpu, cuda, cuda:N, mps or auto (the default)."
        ) from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise EtnError(
                f"Device {device!r}: this machine has no CUDA GPU (or torch {torch.__version__} "
                "was built without CUDA). Use --device cpu, or leave --device out (auto)."
            )
        if parsed.index is not None and parsed.index >= count:
            raise EtnError(
                f"Device {device!r}: this machine shows {count} CUDA GPU(s), cuda:0 to "
                f"cuda:{count - 1}. Pick one of those."
            )
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise EtnError(f"Device {device!r}: MPS is not available here. Use --device cpu.")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise EtnError(f"Device {device!r}: etn runs on cpu, cuda or mps, not {parsed.type}.")
    return device
