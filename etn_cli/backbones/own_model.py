"""Your own image classifier as a ``torchvision`` backbone: a checkpoint file and named layers.

```toml
[backbone]
name = "torchvision"
model = "resnet18"                 # the architecture (not needed for a TorchScript file)
checkpoint = "model.safetensors"   # a state dict (safetensors / torch.save) or TorchScript
num_classes = 5
features = "avgpool"               # optional: the module whose output is the hidden state
classifier = "fc"                  # the final linear layer: logits = fc(hidden)
transforms = "IMAGENET1K_V1"       # optional: preprocessing of these torchvision weights
```

* A **state dict** is loaded strictly into torchvision's ``model`` (``torch.load`` with
  ``weights_only=True``, or safetensors; :mod:`etn_cli.backbones.torchvision_weights`).
  Beside it, ``weights = "IMAGENET1K_V2"`` (weights of ``model``) gives their preprocessing,
  as ``transforms`` would: a local copy of a hub file is one setting (:func:`weights_beside`).
* A **TorchScript** file (``torch.jit.save``) carries its own architecture. Forward hooks do
  not exist for scripted modules, so its forward graph is inlined and made to return, next
  to the logits, the input and the output of the ``classifier``'s linear operation (the last
  one in the graph when no name is given); the output is checked to be the logits, as for an
  eager model. TorchScript runs the file's own code, which only a file you trust should do.
* ``features`` names the module whose output, flattened, is the hidden state. It must equal
  the classifier's input (``avgpool`` for a ResNet's ``fc``), so that
  ``logits == hidden @ W.T + b`` holds for the stored classifier; a module that is not is an
  error naming both, not a silently different feature.
"""

from __future__ import annotations

import functools
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from etn_cli.backbones import torchvision_weights as tvw
from etn_cli.backbones.image_inputs import TransformSpec, spec_from_weights
from etn_cli.backbones.torchvision_weights import Weights, cached_sha256
from etn_cli.errors import EtnError


def resolve_source(config: Any) -> Weights:
    """Where the weights come from: ``checkpoint`` (a TorchScript file, or a state dict for
    ``model``), else ``weights`` (a torchvision weights name, a file, or "none")."""
    if config.checkpoint is None:
        return tvw.resolve_weights(config.model, config.weights, config.num_classes, config.seed)
    path = Path(config.checkpoint).expanduser()
    if not path.is_file():
        raise EtnError(
            f"checkpoint = {config.checkpoint!r}: no such file ({path.resolve()}). Give the "
            "path of your model's state dict (.safetensors, .pt) or TorchScript file, relative "
            "to the pipeline file."
        )
    if is_torchscript(path):
        return torchscript_entry(path)
    tvw.check_model_name(config.model)
    weights_beside(config)
    return tvw.local_entry(path, config.num_classes)


def weights_beside(config: Any) -> Any:
    """The torchvision weights named beside a ``checkpoint`` (None for "DEFAULT" / "none"):
    they give the architecture's preprocessing (their ``transforms()``), the checkpoint gives
    every value, so a local copy of ``resnet50-11ad3fa6.pth`` is one setting. Anything else in
    ``weights`` (a file) is refused: one file of your own goes in ``checkpoint``."""
    if config.weights in ("DEFAULT", "none"):
        return None
    found = tvw.hub_weights(config.model, config.weights)
    if found is None:
        raise EtnError(
            f"Give weights or checkpoint, not both (found weights = {config.weights!r} and "
            f"checkpoint = {config.checkpoint!r}). A file of your own goes in checkpoint; beside "
            f"it, weights may only name torchvision weights of {config.model} (their transforms)."
        )
    return found


def base_spec(config: Any, weights: Weights) -> TransformSpec:
    """The preprocessing before the explicit options: the ``transforms`` weights' own, else
    the loaded hub weights', else etn's default (no resize or crop, ImageNet mean and std)."""
    if config.transforms is not None:
        enum = named_weights(config.model, config.transforms)
        return spec_from_weights(enum.transforms(), str(enum))
    if weights.kind == "hub":
        return spec_from_weights(weights.enum.transforms(), str(weights.enum))
    if config.checkpoint is not None and (enum := weights_beside(config)) is not None:
        return spec_from_weights(enum.transforms(), str(enum))
    return TransformSpec()


def named_weights(model: str, name: str) -> Any:
    """A torchvision weights enum member: ``"ResNet50_Weights.IMAGENET1K_V2"``, or a name of
    ``model``'s weights (``"IMAGENET1K_V2"``, ``"DEFAULT"``)."""
    import torchvision.models as models

    try:
        if "." in name:
            return models.get_weight(name)
        tvw.check_model_name(model)
        found = tvw.hub_weights(model, name)
    except (KeyError, ValueError, AttributeError):
        found = None
    if found is None:
        raise EtnError(
            f"transforms = {name!r} names no torchvision weights. Use a full name such as "
            '"ResNet50_Weights.IMAGENET1K_V2", or a weights name of model (e.g. "DEFAULT").'
        )
    return found


def is_torchscript(path: Path) -> bool:
    """A ``torch.jit.save`` archive: a zip holding the module's ``code/`` (``torch.save``
    archives hold only data)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any("/code/" in name for name in archive.namelist())


def torchscript_entry(path: Path) -> Weights:
    fp = {"weights": "torchscript", "file": path.name, "sha256": cached_sha256(str(path))}
    return Weights("torchscript", fp, path)


def load_torchscript(path: Path) -> torch.jit.ScriptModule:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, not removed
        try:
            return torch.jit.load(str(path), map_location="cpu").eval()
        except RuntimeError as err:
            raise EtnError(
                f"{path} is not a loadable TorchScript file ({str(err).splitlines()[0][:100]}). "
                "Save it with torch.jit.save(torch.jit.script(model), path), or give a state "
                'dict with model = "<torchvision architecture>".'
            ) from None


def attribute_path(value: Any) -> str:
    """``fc.weight`` for a graph value read by ``prim::GetAttr`` nodes from the module."""
    names = []
    node = value.node()
    while node.kind() == "prim::GetAttr":
        names.append(node.s("name"))
        node = next(iter(node.inputs())).node()
    return ".".join(reversed(names))


class ScriptedClassifier:
    """``(hidden (B, D), logits (B, C))`` of a TorchScript classifier in one forward pass:
    its inlined forward graph returns ``(output, classifier input, classifier output)``."""

    def __init__(self, module: torch.jit.ScriptModule, classifier: str | None) -> None:
        self.module = module
        graph = module.forward.graph.copy()
        torch._C._jit_pass_inline(graph)
        linears = [n for n in graph.nodes() if n.kind() == "aten::linear"]
        named = {attribute_path(list(n.inputs())[1]).removesuffix(".weight"): n for n in linears}
        if not named or (classifier is not None and classifier not in named):
            raise EtnError(
                f"The TorchScript model has no linear layer {classifier!r} in its forward "
                f"pass; its linear layers are: {', '.join(named) or 'none'}. Set classifier = "
                "one of them."
            )
        self.head_name = classifier if classifier is not None else list(named)[-1]
        node = named[self.head_name]
        returned = [next(iter(graph.outputs())), next(iter(node.inputs())), node.output()]
        packed = graph.create("prim::TupleConstruct", returned)
        packed.output().setType(torch._C.TupleType([v.type() for v in returned]))
        graph.appendNode(packed)
        graph.eraseOutput(0)
        graph.registerOutput(packed.output())
        self.function = torch._C._create_function_from_graph("etn_hidden_and_logits", graph)
        self.head = functools.reduce(getattr, self.head_name.split("."), module)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, hidden, output = self.function(self.module._c, x)
        if not isinstance(logits, torch.Tensor) or not torch.equal(output, logits):
            raise EtnError(
                f"The TorchScript model's output is not the output of its layer "
                f"{self.head_name!r}; the hidden state would not explain the logits. Set "
                "classifier to the layer that makes them."
            )
        return hidden, logits  # (B, D), (B, C)


def linear_shape(head: Any) -> tuple[int, int]:
    """``(in_features, out_features)`` of an ``nn.Linear`` or a scripted one."""
    weight = head.weight
    return int(weight.shape[1]), int(weight.shape[0])


def features_output(output: Any, head_input: torch.Tensor, features: str, head: str) -> None:
    """The ``features`` module's flattened output must be the classifier's input."""
    flat = output.flatten(1) if isinstance(output, torch.Tensor) else None
    if flat is None or flat.shape != head_input.shape or not torch.equal(flat, head_input):
        shape = None if flat is None else tuple(flat.shape)
        raise EtnError(
            f"features = {features!r} outputs {shape} flattened, which is not the input of the "
            f"classifier {head!r} {tuple(head_input.shape)}; the stored hidden state must "
            "explain the logits. Name the module right before the classifier, or leave "
            "features out (the classifier's input is then the hidden state)."
        )


def check_features_name(model: nn.Module, features: str | None) -> None:
    if features is not None and features not in dict(model.named_modules()):
        raise EtnError(
            f"features = {features!r} names no module of {type(model).__name__}. Use a name "
            "from model.named_modules(), e.g. avgpool for a ResNet."
        )


def check_torchscript_options(config: Any) -> None:
    """Options that need forward hooks, which scripted modules do not have, are refused."""
    needs_hooks = [k for k in ("features", "layers") if getattr(config, k)]
    if needs_hooks:
        raise EtnError(
            f"{' and '.join(needs_hooks)} need forward hooks, which a TorchScript model does not "
            "support; its hidden state is always its classifier's input. Remove them, or give "
            'a state dict with model = "<torchvision architecture>".'
        )
