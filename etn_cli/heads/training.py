"""The minibatch loop shared by every head trained with gradients."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch

from etn_cli.errors import EtnError


def progress(iterable, desc: str, total: int | None = None):  # noqa: ANN001, ANN201
    """A tqdm bar on a terminal, silent otherwise (cron, CI, pipes, ``-q``)."""
    from etn_cli.progress import bar

    return bar(iterable, desc, total)


def fit_module(
    module: torch.nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    tensors: tuple[torch.Tensor, ...],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    device: torch.device,
    weight_decay: float = 0.0,
    schedule: str = "constant",
    warmup_fraction: float = 0.0,
    desc: str = "train",
) -> list[float]:
    """Adam over shuffled minibatches; keeps the epoch with the lowest mean adaptation loss.

    ``loss_fn(*batch)`` returns per-sample losses (B,). ``schedule`` is ``constant`` or
    ``cosine`` (with linear warm-up over ``warmup_fraction`` of the steps, as the paper uses for
    LLMs). Returns the per-epoch mean losses; the module ends with its best epoch's weights.
    """
    module.to(device)
    data = tuple(t.to(device) for t in tensors)
    n = len(data[0])
    steps = epochs * math.ceil(n / batch_size)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(schedule, steps, warmup_fraction)
    )
    generator = torch.Generator().manual_seed(seed)
    history: list[float] = []
    best = (math.inf, copy.deepcopy(module.state_dict()))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for _ in progress(range(epochs), desc):
            total = torch.zeros((), device=device)
            for idx in torch.randperm(n, generator=generator).split(batch_size):
                idx = idx.to(device)
                loss = loss_fn(*(t[idx] for t in data))  # (B,)
                optimizer.zero_grad(set_to_none=True)
                loss.mean().backward()
                optimizer.step()
                scheduler.step()
                total += loss.detach().sum()
            history.append(total.item() / n)
            if not math.isfinite(history[-1]):
                raise EtnError(
                    f"{desc}: the loss became {history[-1]} in epoch {len(history)}. "
                    "Lower the learning rate or check the features for extreme values."
                )
            if history[-1] < best[0]:
                best = (history[-1], copy.deepcopy(module.state_dict()))
    module.load_state_dict(best[1])
    return history


def lr_lambda(schedule: str, steps: int, warmup_fraction: float) -> Callable[[int], float]:
    warmup = int(warmup_fraction * steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            progress_ = (step - warmup) / max(1, steps - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress_)))
        return 1.0

    return factor
