"""What every image classifier backbone shares (``torchvision``, ``timm``, ``hf_image``):
batches of preprocessed images, one hooked forward pass, the logits check, pooled ``layers``,
ODIN's perturbed logits, autocast and the classifier's weights.

A subclass builds its network lazily as ``model`` and sets, when it does, ``head_name`` and
``head`` (the final ``nn.Linear``), ``layer_modules`` (``layers`` by name) and optionally
``features_module``; it sets ``transform`` (an object with ``pixels`` per image, ``normalize``
per batch, ``std`` and ``output_size``: :mod:`etn_cli.backbones.image_inputs`), ``dtype`` and
``tokens`` (how 3-D token outputs of ``layers`` are pooled; None refuses them) in ``__init__``.

Hidden state = the input of ``head``, read by a forward pre-hook; logits = the model's output,
checked to be ``head``'s output, so ``logits == hidden @ W.T + b`` with :meth:`classifier`'s
``W``, ``b`` (:mod:`etn_cli.backbones.torchvision_hooks`). ``odin``: ``layers/odin = f(x') / T``
with ``x' = x - eps * sign(-grad_x log S_yhat(x; T)) / std`` (Liang et al. 2018, Eq. 2; ``eps``
in pixel units as in the authors' code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from etn_cli.backbones import own_model
from etn_cli.backbones.base import Backbone
from etn_cli.backbones.image_inputs import TransformedImages, collate_images
from etn_cli.backbones.precision import DTYPES
from etn_cli.backbones.torchvision_hooks import TokenPooling, capture, check_head
from etn_cli.datasets.base import Split


class ImageBackbone(Backbone):
    """The shared forward pass of image classifiers (see the module docstring)."""

    transform: Any
    dtype: str
    tokens: TokenPooling | None = None
    features_module: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        raise NotImplementedError

    def logits_of(self, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The model's logits (B, C) for normalised pixels (B, 3, H, W)."""
        return model(x)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast in the resolved dtype (torch's CPU autocast for half precision on a CPU)."""
        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.dtype])

    @property
    def num_classes(self) -> int:
        return own_model.linear_shape(self.final_layer())[1]

    @property
    def hidden_size(self) -> int:
        return own_model.linear_shape(self.final_layer())[0]

    def final_layer(self) -> torch.nn.Linear:
        self.model  # noqa: B018 - builds the model, which sets self.head
        return self.head

    # -- batches ----------------------------------------------------------------------------

    def loader(
        self, split: Split, batch_size: int, workers: int = 0, pin_memory: bool = False
    ) -> DataLoader:
        """``(pixels (B, 3, H, W), labels (B,), index (B,))`` batches of ``split`` in order,
        resized and cropped in ``workers`` processes, in pinned memory when asked (CUDA);
        :meth:`extract_batch` and :meth:`forward` normalise them on the device
        (:meth:`prepare`)."""
        data = TransformedImages(split.data, split.index, self.transform)
        return DataLoader(
            data,
            batch_size=batch_size,
            shuffle=False,
            num_workers=workers,
            pin_memory=pin_memory,
            collate_fn=collate_images,
            persistent_workers=False,
        )

    def batches(
        self, split: Split, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        yield from self.loader(split, batch_size)

    # -- forward ----------------------------------------------------------------------------

    def run(
        self, x: torch.Tensor, with_layers: bool
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One forward pass: ``(hidden (B, D), logits (B, C), pooled layers)``, float32."""
        model = self.model
        layers = self.layer_modules if with_layers else {}
        with capture(self.head, layers, self.features_module, self.tokens) as seen:
            with self.autocast():
                logits = self.logits_of(model, x)  # (B, C)
        hidden = check_head(seen, logits, self.head_name)  # (B, D)
        if self.features_module is not None:
            own_model.features_output(seen.features, hidden, self.config.features, self.head_name)
        return hidden.float(), logits.float(), seen.layers

    def prepare(self, pixels: torch.Tensor) -> torch.Tensor:
        """A batch of the loader's pixels (B, 3, H, W) on the device, normalised there."""
        return self.transform.normalize(pixels.to(self.device, non_blocking=True))

    @torch.inference_mode()
    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, logits, _ = self.run(self.prepare(inputs), with_layers=False)
        return hidden.cpu(), logits.cpu()

    def extract_batch(
        self, inputs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``hidden``, ``logits``, the pooled ``layers`` and, with ``odin``, ODIN's logits of
        a batch of the loader's pixels."""
        with torch.no_grad():  # an ordinary tensor, which ODIN differentiates
            x = self.prepare(inputs)
        with torch.inference_mode():
            hidden, logits, extras = self.run(x, with_layers=True)
        if self.config.odin:
            extras["odin"] = self.odin_logits(x)
        return hidden.cpu(), logits.cpu(), {k: v.cpu() for k, v in extras.items()}

    def start_batch(self, inputs: torch.Tensor):
        """:meth:`extract_batch` queued on the GPU, its outputs copied back into pinned host
        memory without waiting; ODIN's gradient pass (and the CPU) run it at once."""
        if self.device.type != "cuda" or self.config.odin:
            return super().start_batch(inputs)
        with torch.inference_mode():
            hidden, logits, extras = self.run(self.prepare(inputs), with_layers=True)
            host = [t.to("cpu", non_blocking=True) for t in (hidden, logits, *extras.values())]
        copied = torch.cuda.Event()
        copied.record()

        def outputs() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
            copied.synchronize()
            return host[0], host[1], dict(zip(extras, host[2:], strict=True))

        return outputs

    def odin_logits(self, x: torch.Tensor) -> torch.Tensor:
        """ODIN's scaled logits at the perturbed input (Liang et al. 2018, Eq. 2), (B, C):
        ``x' = x - eps * sign(-grad_x log S_yhat(x; T)) / std``, ``S = softmax(f(x) / T)``,
        ``yhat = argmax f(x)``; returns ``f(x') / T``. ``x`` is the normalised input."""
        t, eps = self.config.odin_temperature, self.config.odin_epsilon
        x = x.detach().clone().requires_grad_(True)
        with torch.enable_grad(), self.autocast():
            scaled = self.logits_of(self.model, x).float() / t  # (B, C)
        log_s = F.log_softmax(scaled, dim=1)
        top = log_s.gather(1, scaled.argmax(dim=1, keepdim=True)).sum()
        (grad,) = torch.autograd.grad(top, x)  # (B, 3, H, W)
        step = eps * torch.sign(-grad) / self.transform.std().to(x.device)
        with torch.inference_mode(), self.autocast():
            return (self.logits_of(self.model, x.detach() - step).float() / t).float()  # (B, C)

    def classifier(self) -> dict[str, torch.Tensor]:
        layer = self.final_layer()
        bias = layer.bias if layer.bias is not None else torch.zeros(self.num_classes)
        return {
            "weight": layer.weight.detach().float().cpu().clone(),  # (C, D)
            "bias": bias.detach().float().cpu().clone(),  # (C,)
        }
