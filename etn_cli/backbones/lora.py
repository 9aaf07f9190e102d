"""LoRA fine-tuning of ``hf_causal_lm`` (``etn finetune``, stage zero) and loading adapters.

The paper makes RACE and OBQA in-distribution by training the LLM on their training sets
with cross-entropy (Supp. "Datasets"), using LoRA on all attention layers with rank 8 and
alpha 16, only the LoRA weights trained (Supp. "Models", after Yang et al. 2024), batch 4,
learning rate 2.5e-4, 3 epochs (Supp. Table "Training and hyperparameter settings"). The loss
of a batch is the mean over its prompts of

    CE(z, y) = -log softmax(z)_y,   z = the answer-letter logits at the last prompt token,

the same logits ``etn extract`` stores, optimised with AdamW over the LoRA weights from a
seeded initialisation and a seeded data order. The adapter is written with peft's
``save_pretrained`` as safetensors (``adapter_model.safetensors``, ``adapter_config.json``);
the returned record (settings, losses, provenance) goes into the stage's ``finetune.json``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from etn_cli import progress
from etn_cli.backbones.hf_files import ADAPTER_WEIGHTS, first_line
from etn_cli.backbones.lm_forward import pad_left
from etn_cli.backbones.settings import LoraSettings
from etn_cli.config import build_config, config_dict
from etn_cli.datasets.base import Split
from etn_cli.errors import EtnError
from etn_cli.provenance import provenance
from etn_cli.store.atomic import honour_umask

FINETUNE_VERSION = 1


class LetterModel(Protocol):
    """What LoRA fine-tuning needs of a causal LM that answers with letters; ``hf_causal_lm``
    (:mod:`etn_cli.backbones.hf_lm`, which imports this module, never the reverse) has it."""

    adapter_dir: Path | None
    device: torch.device
    location: Any  # where the weights are; its ``name`` names the adapter's base model
    tokenizer: Any

    def fingerprint(self) -> dict[str, Any]: ...

    def encode(self, split: Split) -> tuple[list[list[int]], torch.Tensor]: ...

    def load_base_model(self) -> Any: ...

    def letter_logits_of(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor: ...


def finetune_lora(
    backbone: LetterModel, train: Split, settings: dict[str, Any], out_dir: Path
) -> dict[str, Any]:
    """Train a LoRA adapter on ``train``, write it into ``out_dir`` and return the record."""
    config = build_config(LoraSettings, settings, "[finetune]")
    if backbone.adapter_dir is not None:
        raise EtnError(
            "etn finetune trains a new adapter, but [backbone] adapter is set. Remove adapter "
            "to train one, or remove [finetune] to use the given adapter."
        )
    base = dict(backbone.fingerprint(), adapter=None)
    encoded, labels = backbone.encode(train)
    started = time.perf_counter()
    devices = [backbone.device] if backbone.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(config.seed)
        model = make_lora(backbone.load_base_model(), config, backbone.location.name)
        losses, accuracy = train_lora(backbone, model, encoded, labels, config)
    record = {
        "method": "lora",
        "settings": config_dict(config),
        "base_fingerprint": base,
        "train_fingerprint": train.fingerprint,
        "samples": len(encoded),
        "steps": config.epochs * math.ceil(len(encoded) / config.batch_size),
        "epoch_losses": losses,
        "last_epoch_accuracy": accuracy,
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "seconds": round(time.perf_counter() - started, 3),
        "versions": {p: metadata.version(p) for p in ("torch", "transformers", "peft")},
        "provenance": provenance(),
        "finetune_version": FINETUNE_VERSION,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    honour_umask(out_dir)  # safetensors writes 0600
    return record


@contextmanager
def peft_quietly() -> Iterator[None]:
    """Hide the deprecation warning peft triggers in transformers on every wrap (not ours)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        yield


def make_lora(model: Any, config: LoraSettings, name: str) -> Any:
    """Wrap ``model`` with fresh LoRA layers on ``target_modules``; only those are trained."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with peft_quietly():
            model = get_peft_model(model, lora)
    except ValueError as err:
        raise EtnError(
            f"[finetune] target_modules {list(config.target_modules)} do not fit {name}: "
            f"{first_line(err)}. Use its attention projections (q_proj, k_proj, v_proj, o_proj)."
        ) from None
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def train_lora(
    backbone: LetterModel,
    model: Any,
    encoded: list[list[int]],
    labels: torch.Tensor,
    config: LoraSettings,
) -> tuple[list[float], float]:
    """AdamW over shuffled batches; returns per-epoch mean losses and last-epoch accuracy."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    order = torch.Generator().manual_seed(config.seed)
    pad_id = backbone.tokenizer.pad_token_id
    n, steps = len(encoded), math.ceil(len(encoded) / config.batch_size)
    losses: list[float] = []
    model.train()
    for epoch in range(config.epochs):
        total, correct = 0.0, 0
        batches = torch.randperm(n, generator=order).split(config.batch_size)
        for rows in progress.bar(batches, f"finetune epoch {epoch + 1}/{config.epochs}", steps):
            batch = pad_left([encoded[i] for i in rows.tolist()], pad_id)
            logits = backbone.letter_logits_of(model, batch).float()  # (B, C)
            target = labels[rows].to(logits.device)  # (B,)
            loss = F.cross_entropy(logits, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(rows)
            correct += int((logits.argmax(1) == target).sum())
        losses.append(total / n)
        if not math.isfinite(losses[-1]):
            raise EtnError(
                f"LoRA fine-tuning diverged: the loss became {losses[-1]} in epoch {epoch + 1}. "
                "Lower lr, or use dtype bfloat16 or float32 instead of float16."
            )
    model.eval()
    return losses, correct / n


def attach_adapter(model: Any, folder: Path, name: str) -> Any:
    """Load the peft adapter in ``folder`` onto ``model`` and merge it into the weights.

    Every tensor of the adapter file must land on a module of the model and every adapter
    tensor the model expects must be in the file; anything else means the adapter was made for
    another model."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open

    fix = "Use an adapter trained on this base model."
    try:
        with peft_quietly():
            peft_model = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    except (RuntimeError, ValueError) as err:  # shape mismatch, target modules not found
        raise EtnError(f"Adapter {folder} does not fit {name}: {first_line(err)}. {fix}") from None
    expected = set(get_peft_model_state_dict(peft_model))
    with safe_open(str(folder / ADAPTER_WEIGHTS), framework="pt") as handle:
        found = set(handle.keys())
    if expected != found:
        extra, missing = sorted(found - expected), sorted(expected - found)
        raise EtnError(
            f"Adapter {folder} does not fit {name}: {len(extra)} of its tensors match no module "
            f"({extra[:1]}) and {len(missing)} expected tensors are missing ({missing[:1]}). {fix}"
        )
    return peft_model.merge_and_unload()
