"""The backbone interface: features and head, as in timm's ``forward_features`` /
``forward_head``. Only ``etn extract`` (and ``etn finetune``) ever instantiate a backbone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from etn_cli.backbones import backbones as backbones  # the registry, for the modules that register
from etn_cli.datasets.base import Split


class Backbone:
    """A pretrained classifier split into ``hidden = features(x)`` and ``logits = head(hidden)``.

    Subclasses declare ``Config`` (a frozen dataclass of their options, unknown keys rejected by
    the pipeline loader) and implement the methods below. ``cache_dir`` is where a backbone may
    keep artefacts it builds once (the digits CNN's trained weights).
    """

    name: ClassVar[str]
    Config: ClassVar[type]
    cache_record: ClassVar[str] = "meta.json"  # seals the folder :meth:`build_cache` writes

    def __init__(self, config: Any, cache_dir: Path, device: str = "cpu") -> None:
        self.config = config
        self.cache_dir = Path(cache_dir)
        self.device = torch.device(device)

    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes the outputs: model id, revision or weights hash, dtype,
        transform. Must be cheap: it is computed on every run to find cached features."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        raise NotImplementedError

    @property
    def planned_num_classes(self) -> int | None:
        """The class count when known without building the model (a dry run checks the ID
        classes against it), else None: the check then waits for extract to load the model."""
        return None

    @property
    def hidden_size(self) -> int:
        raise NotImplementedError

    def batches(
        self, split: Split, batch_size: int
    ) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """Yield ``(inputs, labels, index)`` batches of ``split`` in order, for ``forward``."""
        raise NotImplementedError

    def loader(
        self, split: Split, batch_size: int, *, workers: int = 0, pin_memory: bool = False
    ) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """``batches`` with ``workers`` loading processes and pinned memory where the backbone
        supports them (image backbones); by default the same as ``batches``."""
        return self.batches(split, batch_size)

    @torch.inference_mode()
    def forward(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(hidden (B, D), logits (B, C))`` for one batch, on the CPU, float32."""
        raise NotImplementedError

    def extract_batch(
        self, inputs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """What ``etn extract`` stores for one batch: ``hidden``, ``logits`` and extra per-sample
        arrays (name -> (B, D_l), float32, CPU) that the pipeline asked for through backbone
        options, such as pooled intermediate layers for ``dmm`` or ODIN's perturbed logits.
        Backbones without such options return ``forward``'s outputs and no extras."""
        hidden, logits = self.forward(inputs)
        return hidden, logits, {}

    def start_batch(
        self, inputs: Any
    ) -> Callable[[], tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]:
        """Begin :meth:`extract_batch` on ``inputs``; the function returned waits for its
        outputs on the host. A GPU backbone queues the work and copies the outputs back without
        waiting, so extract can start the next batch before it stores this one; by default the
        work is done here."""
        outputs = self.extract_batch(inputs)
        return lambda: outputs

    def manifest_extras(self, split: Split) -> dict[str, Any]:
        """What a split's manifest records about how this backbone read it, beyond the
        fingerprint (an LLM's rendered example prompt and answer token ids); JSON-able."""
        return {}

    def finetune(self, train: Split, settings: dict[str, Any], out_dir: Path) -> dict[str, Any]:
        """Stage zero (``etn finetune``): train the in-distribution model on ``train`` with the
        pipeline's ``[finetune]`` settings and write it (weights or adapter, safetensors) into
        ``out_dir``; return a JSON-able record of what was done. ``use_finetuned(out_dir)`` then
        makes this backbone load it (and changes its fingerprint)."""
        from etn_cli.errors import EtnError

        raise EtnError(
            f"Backbone {self.name!r} has no fine-tuning stage; remove [finetune] from the pipeline."
        )

    def use_finetuned(self, out_dir: Path) -> None:
        """Load what ``finetune`` wrote into ``out_dir``; ``fingerprint()`` must reflect it."""
        from etn_cli.errors import EtnError

        raise EtnError(f"Backbone {self.name!r} cannot load fine-tuned weights from {out_dir}.")

    def cache_folder(self) -> Path | None:
        """Where etn builds what this backbone needs before extraction, once (stage zero, as
        ``etn finetune``; the digits CNN's trained weights), or None when it needs nothing.
        Computed from settings alone: planning never builds it."""
        return None

    def build_cache(self, folder: Path) -> dict[str, Any]:
        """Build into the private ``folder`` what :meth:`cache_folder` names; return a
        JSON-able record of it, which the unit driver seals (with every file's sha256) as
        :attr:`cache_record` before renaming the folder into place."""
        raise NotImplementedError

    def use_cache(self, record: dict[str, Any] | None) -> None:
        """What planning read of the prepared folder's record (None: not built, or damaged
        beyond reading); ``fingerprint()`` must reflect it, and the model loads from it."""

    def classifier(self) -> dict[str, torch.Tensor]:
        """The final classifier layer: ``weight`` (C, D) and ``bias`` (C,), so that
        ``logits == hidden @ weight.T + bias``. Last-layer baselines start from it."""
        raise NotImplementedError
