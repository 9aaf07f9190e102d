"""The minibatch loop shared by every head trained with gradients."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.steps import Steps


def progress(iterable, desc: str, total: int | None = None):
    """A tqdm bar on a terminal, silent otherwise (cron, CI, pipes, ``-q``)."""
    from etn_cli.progress import bar

    return bar(iterable, desc, total)


EVAL_ROWS = 1024  # rows per forward pass when an epoch's adaptation accuracy is measured


@dataclass
class Training:
    """What :func:`fit_module` did: per-epoch mean adaptation losses, the adaptation accuracy
    after each epoch (measured only when the rule needs it), the rule and the kept epoch
    (1-based)."""

    select: str
    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    epoch: int = 0
    steps: str = "eager"  # or "cuda graph" (etn_cli.heads.steps)

    def record(self) -> dict[str, Any]:
        """The provenance of the kept checkpoint, for ``head.json`` and ``train.json``."""
        kept = {"select": self.select, "epoch": self.epoch, "epochs": len(self.losses)}
        if self.steps != "eager":  # how the steps ran, where it is not the plain way
            kept["steps"] = self.steps
        kept["loss"] = self.losses[self.epoch - 1] if self.epoch else None
        if self.accuracies:
            kept["accuracy"] = self.accuracies[self.epoch - 1]
        return kept

    def rank(self) -> tuple[float, ...]:
        """The latest epoch's sort key, lower is better: the loss, or the accuracy with the
        loss breaking ties (a head that never changes the argmax then keeps its best loss)."""
        if self.select == "accuracy":
            return (-self.accuracies[-1], self.losses[-1])
        return (self.losses[-1],)


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
    select: str = "loss",
    class_scores: Callable[..., torch.Tensor] | None = None,
) -> Training:
    """Adam over shuffled minibatches; keeps the best epoch by the rule ``select``.

    ``loss_fn(*batch)`` returns per-sample losses (B,); the last tensor holds the labels.
    ``select = "loss"`` keeps the epoch with the lowest mean adaptation loss (the paper's rule
    for ETN), ``"accuracy"`` the one whose weights classify the adaptation set best after the
    epoch (the paper's rule for the post-hoc baselines, Supp. "Experimental Setting"), ties
    going to the lower loss; it needs ``class_scores(*batch)`` (B, C), whose argmax is the
    predicted class, and only then is the adaptation set evaluated. ``schedule`` is
    ``constant`` or ``cosine`` (with linear warm-up over ``warmup_fraction`` of the steps, as
    the paper uses for LLMs). The module ends with its kept epoch's weights.
    """
    if select not in ("loss", "accuracy"):
        raise EtnError(f"{desc}: select must be 'loss' or 'accuracy', got {select!r}.")
    if select == "accuracy" and class_scores is None:
        raise EtnError(f"{desc}: select = 'accuracy' needs the head's class scores.")
    module.to(device)
    data = tuple(t.to(device) for t in tensors)
    n = len(data[0])
    steps = epochs * math.ceil(n / batch_size)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    factor = lr_lambda(schedule, steps, warmup_fraction)
    total = torch.zeros((), device=device)  # the epoch's summed loss, kept on the device

    def step(*batch: torch.Tensor) -> None:
        loss = loss_fn(*batch)  # (B,)
        optimizer.zero_grad(set_to_none=True)
        loss.mean().backward()
        optimizer.step()
        total.add_(loss.detach().sum())

    runner = Steps(step, data, batch_size, [optimizer])
    generator = torch.Generator().manual_seed(seed)  # the same batches on every device
    training = Training(select)
    best: tuple[tuple[float, ...], dict] = ((math.inf,), copy.deepcopy(module.state_dict()))
    done = 0
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for _ in progress(range(epochs), desc):
            total.zero_()
            order = torch.randperm(n, generator=generator).to(device)
            for idx in order.split(batch_size):
                runner.set_lr(lr * factor(done))  # LambdaLR's value for this step
                runner(idx)
                done += 1
            training.losses.append(total.item() / n)
            if not math.isfinite(training.losses[-1]):
                raise EtnError(
                    f"{desc}: the loss became {training.losses[-1]} in epoch "
                    f"{len(training.losses)}. Lower the learning rate or check the features "
                    "for extreme values."
                )
            if select == "accuracy":
                training.accuracies.append(accuracy(module, class_scores, data))
            if training.rank() < best[0]:
                best = (training.rank(), copy.deepcopy(module.state_dict()))
                training.epoch = len(training.losses)
    training.steps = runner.mode
    runner.close()
    module.load_state_dict(best[1])
    return training


@torch.no_grad()
def accuracy(
    module: torch.nn.Module, class_scores: Callable[..., torch.Tensor], data: tuple
) -> float:
    """The fraction of the adaptation rows whose ``class_scores`` argmax is the label, with the
    module in evaluation mode (no dropout)."""
    was_training = module.training
    module.eval()
    correct = torch.zeros((), dtype=torch.int64, device=data[-1].device)
    with torch.random.fork_rng(devices=[]):  # measuring never moves the training's draws
        for start in range(0, len(data[-1]), EVAL_ROWS):
            batch = tuple(t[start : start + EVAL_ROWS] for t in data)
            correct += (class_scores(*batch).argmax(-1) == batch[-1]).sum()
    module.train(was_training)
    return correct.item() / len(data[-1])


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
