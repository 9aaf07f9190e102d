"""Reading a torchvision model's internals with hooks, never by editing the model.

The hidden state is the input of the final classifier layer (a forward pre-hook on it), and
``layers`` are the outputs of named modules (forward hooks), pooled to one vector per sample
for the Dirichlet meta-model: 4-D (B, C, H, W) outputs are averaged over H and W, 2-D (B, D)
outputs are kept, and 3-D (B, N, D) token outputs of transformers (timm, Hugging Face) become
their class token or the mean of their patch tokens (:class:`TokenPooling`). A module that
returns a tuple (Hugging Face layers) gives its first element. The hooks live only for one
forward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from etn_cli.backbones.layer_names import named_layers as named_layers  # torch-free
from etn_cli.errors import EtnError


def find_classifier(model: nn.Module, name: str | None) -> tuple[str, nn.Linear]:
    """The final classifier layer: ``name`` if given, else the last ``nn.Linear`` registered
    (``fc`` of ResNets, ``classifier.6`` of VGG, ``heads.head`` of ViT, ...)."""
    modules = dict(model.named_modules())
    if name is None:
        linear = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
        if not linear:
            raise EtnError(
                f"{type(model).__name__} has no nn.Linear layer to read hidden states from. "
                'Pick a model with a linear classifier, or set classifier_layer = "...".'
            )
        name = linear[-1]
    if not isinstance(modules.get(name), nn.Linear):
        found = type(modules[name]).__name__ if name in modules else "nothing"
        raise EtnError(
            f"classifier_layer = {name!r} names {found} in {type(model).__name__}; expected an "
            "nn.Linear module (see model.named_modules())."
        )
    return name, modules[name]


@dataclass(frozen=True)
class TokenPooling:
    """How a (B, N, D) token output becomes (B, D): ``"class"`` takes token 0 (the class
    token, what a ViT's classifier reads), ``"mean"`` averages the patch tokens, the tokens
    after the model's ``prefix`` class and register tokens."""

    mode: str  # "class" or "mean"
    prefix: int  # class and register tokens in front of the patch tokens

    def __call__(self, output: torch.Tensor, name: str) -> torch.Tensor:
        if self.mode == "mean":
            return output[:, self.prefix :].float().mean(dim=1)  # (B, D)
        if self.prefix < 1:
            raise EtnError(
                f"Layer {name!r} outputs tokens (B, N, D) but the model has no class token; "
                'set token_pool = "mean" in [backbone] to average them.'
            )
        return output[:, 0].float()  # (B, D)


def pool(output: torch.Tensor, name: str, tokens: TokenPooling | None = None) -> torch.Tensor:
    """One vector per sample: 4-D (B, C, H, W) outputs averaged over H, W; 2-D kept; 3-D token
    outputs pooled by ``tokens`` (refused without)."""
    if output.ndim == 4:
        return output.float().mean(dim=(2, 3))  # (B, C)
    if output.ndim == 2:
        return output.float()  # (B, D)
    if output.ndim == 3 and tokens is not None:
        return tokens(output, name)  # (B, D)
    raise EtnError(
        f"Layer {name!r} outputs shape {tuple(output.shape)}; only 2-D (B, D) and 4-D "
        "(B, C, H, W) outputs can be stored. Pick another layer."
    )


@dataclass
class Captured:
    """What one forward pass showed: the head's input and output, and pooled layer outputs."""

    head_input: torch.Tensor | None = None  # (B, D)
    head_output: torch.Tensor | None = None  # (B, C)
    head_calls: int = 0
    layers: dict[str, torch.Tensor] = field(default_factory=dict)
    features: Any = None  # the raw output of a ``features`` module, when one is named


@contextlib.contextmanager
def capture(
    head: nn.Module,
    layers: dict[str, nn.Module],
    features: nn.Module | None = None,
    tokens: TokenPooling | None = None,
) -> Iterator[Captured]:
    """Hooks on ``head``, ``layers`` (and the ``features`` module) for the duration of the
    block; removed afterwards. ``tokens`` pools 3-D layer outputs."""
    seen = Captured()

    def features_output(module: nn.Module, args: Any, output: Any) -> None:
        seen.features = output

    def head_input(module: nn.Module, args: tuple[Any, ...]) -> None:
        seen.head_input = args[0]
        seen.head_calls += 1

    def head_output(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        seen.head_output = output

    def layer_hook(name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, (tuple, list)) and output:
                output = output[0]  # (hidden states, attentions, ...) of Hugging Face layers
            if not isinstance(output, torch.Tensor):
                raise EtnError(
                    f"Layer {name!r} returns a {type(output).__name__}, not a tensor. "
                    "Pick a layer whose output is one tensor."
                )
            # pool now: a later in-place operation cannot alter the stored values
            seen.layers[name] = pool(output, name, tokens)

        return hook

    handles = [head.register_forward_pre_hook(head_input), head.register_forward_hook(head_output)]
    handles += [m.register_forward_hook(layer_hook(n)) for n, m in layers.items()]
    if features is not None:
        handles.append(features.register_forward_hook(features_output))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def check_head(seen: Captured, logits: torch.Tensor, head_name: str) -> torch.Tensor:
    """The hidden state (B, D), after checking that the model's output is the head's output,
    so that ``logits == hidden @ W.T + b`` holds for what extract stores."""
    if seen.head_calls != 1 or seen.head_input is None:
        raise EtnError(
            f"Layer {head_name!r} ran {seen.head_calls} times in one forward pass; expected "
            "once. Set classifier_layer to the model's final linear layer."
        )
    same = seen.head_output is logits or (
        seen.head_output is not None
        and seen.head_output.shape == logits.shape
        and torch.equal(seen.head_output, logits)
    )
    if not same:
        raise EtnError(
            f"The model's output is not the output of layer {head_name!r}; the hidden state "
            "would not explain the logits. Set classifier_layer to the layer that makes them."
        )
    return seen.head_input  # (B, D)
