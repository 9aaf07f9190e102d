"""The backbone interface: features and head, as in timm's ``forward_features`` /
``forward_head``. Only ``etn extract`` (and ``etn finetune``) ever instantiate a backbone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from etn_cli.datasets.base import Split
from etn_cli.registry import Registry


class Backbone:
    """A pretrained classifier split into ``hidden = features(x)`` and ``logits = head(hidden)``.

    Subclasses declare ``Config`` (a frozen dataclass of their options, unknown keys rejected by
    the pipeline loader) and implement the methods below. ``cache_dir`` is where a backbone may
    keep artefacts it builds once (the digits CNN's trained weights).
    """

    name: ClassVar[str]
    Config: ClassVar[type]

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
    def hidden_size(self) -> int:
        raise NotImplementedError

    def batches(
        self, split: Split, batch_size: int
    ) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """Yield ``(inputs, labels, index)`` batches of ``split`` in order, for ``forward``."""
        raise NotImplementedError

    @torch.inference_mode()
    def forward(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(hidden (B, D), logits (B, C))`` for one batch, on the CPU, float32."""
        raise NotImplementedError

    def classifier(self) -> dict[str, torch.Tensor]:
        """The final classifier layer: ``weight`` (C, D) and ``bias`` (C,), so that
        ``logits == hidden @ weight.T + bias``. Last-layer baselines start from it."""
        raise NotImplementedError


backbones: Registry[type[Backbone]] = Registry("backbone")
