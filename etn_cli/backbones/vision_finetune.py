"""``etn finetune`` for torchvision models: cross-entropy training of the whole network.

The paper trains VGG16-BN on 95% of the CIFAR-10 training set with cross-entropy, batch 1024,
learning rate 2.5e-4, 200 epochs (Supp. Table "Training and hyperparameter settings"); those
values live in ``pipelines/cifar10_vgg16.toml``, not here. The paper does not name the
optimiser or augmentation: the defaults are Adam without augmentation; ``optimizer = "sgd"``
(momentum 0.9) and ``augment = true`` (random 4-pixel-padded crops and horizontal flips, drawn
on the device from the seeded generator) are options.

Training is seeded (initialisation, data order, dropout, augmentation); on the CPU it is
reproducible run to run. The last batch of an epoch is dropped only when it would hold a
single sample, which batch norm cannot train on.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from etn_cli import progress
from etn_cli.backbones.settings import TorchvisionFinetuneConfig as FinetuneConfig
from etn_cli.config import config_dict
from etn_cli.errors import EtnError


def make_optimizer(model: nn.Module, cfg: FinetuneConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crops of the 4-pixel zero-padded images and random horizontal flips, (B, 3, H, W).

    Padding with zeros in the normalised space pads with the dataset mean, as is usual."""
    b, _, h, w = x.shape
    padded = F.pad(x, (4, 4, 4, 4))  # (B, 3, H + 8, W + 8)
    dy = torch.randint(0, 9, (b,), generator=generator, device=x.device)
    dx = torch.randint(0, 9, (b,), generator=generator, device=x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    cropped = padded[batch, channels, rows, cols]  # (B, 3, H, W)
    flip = torch.rand(b, generator=generator, device=x.device) < 0.5
    return torch.where(flip[:, None, None, None], cropped.flip(3), cropped)


def train_classifier(
    model: nn.Module,
    loader: DataLoader,
    cfg: FinetuneConfig,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    desc: str,
    normalize: Callable[[torch.Tensor], torch.Tensor],
) -> list[dict[str, float]]:
    """Minimise the mean cross-entropy with ``cfg``'s optimiser; per-epoch loss and accuracy.
    ``normalize`` turns the loader's pixel batches, on the device, into the model's inputs.

    ``amp_dtype`` (bfloat16 / float16) turns on autocast, on CUDA only; float16 also scales
    the loss against gradient underflow."""
    model.to(device).train()
    optimizer = make_optimizer(model, cfg)
    steps = cfg.epochs * max(1, len(loader))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg.schedule, steps))
    mixed = amp_dtype is not None and device.type == "cuda"
    scaler = torch.amp.GradScaler(device.type, enabled=mixed and amp_dtype == torch.float16)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    history = []
    for epoch in progress.bar(range(cfg.epochs), desc):
        started, total, correct, seen = time.perf_counter(), 0.0, 0, 0
        for inputs, labels, _ in loader:
            x = normalize(inputs.to(device, non_blocking=True))
            y = labels.to(device, non_blocking=True)
            if cfg.augment:
                x = augment(x, generator)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=mixed):
                logits = model(x)  # (B, C)
                loss = F.cross_entropy(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            total += loss.item() * len(y)
            correct += int((logits.argmax(1) == y).sum())
            seen += len(y)
        if not math.isfinite(total):
            hint = ' or use dtype = "bfloat16"' if amp_dtype == torch.float16 else ""
            raise EtnError(
                f"{desc}: the training loss became {total} in epoch {epoch + 1}; nothing was "
                f"saved. Lower lr in the [finetune] table{hint}."
            )
        history.append(
            {
                "epoch": epoch + 1,
                "loss": total / max(1, seen),
                "train_accuracy": correct / max(1, seen),
                "seconds": time.perf_counter() - started,
            }
        )
    return history


def lr_factor(schedule: str, steps: int) -> Any:
    """The learning-rate multiplier per step: 1, or a cosine decay from 1 to 0."""
    if schedule == "cosine":
        return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, steps) / steps))
    return lambda step: 1.0


@contextlib.contextmanager
def seeded(seed: int, device: torch.device):
    """Seed torch's global generators inside (dropout, random init); restore them after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def finetune_backbone(backbone: Any, train: Any, settings: dict[str, Any], out_dir: Any) -> dict:
    """Train ``backbone`` (a torchvision backbone) on ``train`` with the ``[finetune]``
    settings; write ``model.safetensors`` into ``out_dir`` and return the training record."""
    from safetensors.torch import save

    from etn_cli.backbones.precision import DTYPES
    from etn_cli.backbones.torchvision_weights import FINETUNED_FILE
    from etn_cli.config import build_config

    cfg = build_config(FinetuneConfig, settings, "the pipeline's [finetune] table")
    if backbone.weights.kind == "torchscript":
        raise EtnError(
            "etn finetune trains torchvision architectures; a TorchScript checkpoint cannot be "
            "re-trained here. Remove [finetune], or give a state dict and model = ...."
        )
    started = time.perf_counter()
    with seeded(cfg.seed, backbone.device):
        model = backbone.model
        loader = train_loader(backbone, train, cfg)
        amp = None if backbone.dtype == "float32" else DTYPES[backbone.dtype]
        desc = f"finetune {backbone.config.model}"
        normalize = backbone.transform.normalize
        history = train_classifier(model, loader, cfg, backbone.device, amp, desc, normalize)
    model.eval()
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    (out_dir / FINETUNED_FILE).write_bytes(save(state))  # a full disk: an OSError, one line
    return {
        "model": backbone.config.model,
        "started_from": backbone.weights.fingerprint,
        "settings": config_dict(cfg),
        "train_rows": len(train),
        "history": history,
        "seconds": time.perf_counter() - started,
        "device": str(backbone.device),
        "dtype": backbone.dtype,
        "weights_file": FINETUNED_FILE,
    }


def train_loader(backbone: Any, train: Any, cfg: FinetuneConfig) -> DataLoader:
    """Shuffled, seeded batches of ``train`` with the backbone's preprocessing."""
    from etn_cli.backbones.image_inputs import TransformedImages, collate_images

    data = TransformedImages(train.data, train.index, backbone.transform)
    return DataLoader(
        data,
        batch_size=cfg.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(cfg.seed),
        num_workers=cfg.workers,
        pin_memory=backbone.device.type == "cuda",
        collate_fn=collate_images,
        drop_last=len(data) % cfg.batch_size == 1,  # batch norm cannot train on one sample
    )
