"""Where a torchvision model's weights come from, and loading them safely.

``weights`` in the backbone's options is one of:

* a weights name of the model (``"IMAGENET1K_V2"``, ``"DEFAULT"``, or the full
  ``"ResNet50_Weights.IMAGENET1K_V2"``), read from the torch hub cache
  (``<torch hub dir>/checkpoints/<file>``, e.g. ``~/.cache/torch/hub/checkpoints``), downloaded
  only with ``download = true``;
* a local checkpoint: ``*.safetensors``, or a state dict that ``torch.load(weights_only=True)``
  reads (a pickled model needing ``weights_only=False`` is refused), or the folder written by
  ``etn finetune`` (its ``model.safetensors``);
* ``"none"``: random initialisation under ``torch.manual_seed(seed)``, for tests and benchmarks.

torchvision's own builders load hub files with ``weights_only=False``; etn builds the model
through them (so builder-specific details such as DenseNet's key renaming stay right) while
``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` forces the safe unpickler, and checks the file's sha256
against the prefix torchvision puts in its name.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from etn_cli.errors import EtnError, did_you_mean
from etn_cli.store.fingerprint import file_sha256

NONE = "none"
FINETUNED_FILE = "model.safetensors"
HASH_IN_NAME = re.compile(r"-([a-f0-9]{6,})\.")


@dataclass(frozen=True)
class Weights:
    """A resolved ``weights`` option: what to load, and its fingerprint."""

    kind: str  # "hub", "file" or "none"
    fingerprint: dict[str, Any]
    path: Path | None = None
    enum: Any = None  # the torchvision WeightsEnum member for "hub"
    num_classes: int | None = None  # fixed by hub weights, else from the config or the file
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def classification_models() -> list[str]:
    import torchvision.models as models

    return models.list_models(module=models)


def check_model_name(model: str) -> None:
    names = classification_models()
    if model not in names:
        hint = did_you_mean(model, names, n=3, cutoff=0.5)
        raise EtnError(
            f"Unknown torchvision classification model {model!r}.{hint} See "
            "torchvision.models.list_models(module=torchvision.models) for every name."
        )


def resolve_weights(model: str, weights: str, num_classes: int | None, seed: int) -> Weights:
    """Turn the ``weights`` option into a :class:`Weights`; cheap except hashing a local file."""
    check_model_name(model)
    if weights == NONE:
        return Weights("none", {"weights": NONE, "seed": seed}, num_classes=num_classes, seed=seed)
    enum = hub_weights(model, weights)
    if enum is not None:
        return hub_entry(model, enum, num_classes)
    path = Path(weights).expanduser()
    if path.is_dir():
        path = path / FINETUNED_FILE
    if path.is_file():
        return local_entry(path, num_classes)
    import torchvision.models as models

    names = ", ".join(models.get_model_weights(model).__members__)
    raise EtnError(
        f"weights = {weights!r} for {model} is neither one of its weights names ({names}), nor "
        f"an existing checkpoint file or etn finetune folder, nor 'none'. Fix the value."
    )


def hub_weights(model: str, weights: str) -> Any:
    """The WeightsEnum member named ``weights`` (``X`` or ``Model_Weights.X``), else None."""
    import torchvision.models as models

    enum_class = models.get_model_weights(model)
    short = weights.split(".", 1)[1] if weights.startswith(enum_class.__name__ + ".") else weights
    return enum_class[short] if short in enum_class.__members__ else None


def hub_path(enum: Any) -> Path:
    """Where ``torch.hub.load_state_dict_from_url`` keeps the file of ``enum``."""
    name = os.path.basename(enum.url.split("?", 1)[0])
    return Path(torch.hub.get_dir()) / "checkpoints" / name


def hub_entry(model: str, enum: Any, num_classes: int | None) -> Weights:
    categories = len(enum.meta["categories"])
    if num_classes is not None and num_classes != categories:
        raise EtnError(
            f"num_classes = {num_classes} differs from the {categories} classes of {enum}. "
            "Remove num_classes, or train your own head with weights = 'none' and etn finetune."
        )
    fp = {"weights": str(enum), "url": enum.url}
    return Weights("hub", fp, hub_path(enum), enum, categories, meta=dict(enum.meta))


def local_entry(path: Path, num_classes: int | None) -> Weights:
    fp = {"weights": "file", "file": path.name, "sha256": cached_sha256(str(path.resolve()))}
    return Weights("file", fp, path, num_classes=num_classes)


def cached_sha256(path: str) -> str:
    stat = os.stat(path)
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(Path(path))


def check_hub_file(weights: Weights, download: bool) -> None:
    """Raise a one-line EtnError when a hub file is absent and downloading was not asked for."""
    if weights.kind == "hub" and not download and not weights.path.is_file():
        raise EtnError(
            f"Expected the {weights.enum} weights at {weights.path}, found no such file. "
            f"Download {weights.enum.url} there (or set TORCH_HOME), or set download = true "
            "in the pipeline's [backbone] table."
        )


@contextlib.contextmanager
def forced_weights_only() -> Iterator[None]:
    """Make every ``torch.load`` inside use the safe unpickler, whatever its caller asks."""
    previous = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = previous


def build_model(
    model: str, weights: Weights, download: bool, options: dict[str, Any] | None = None
) -> nn.Module:
    """The model with its weights loaded, on the CPU, in eval mode; ``options`` go to the
    torchvision builder (e.g. ``dropout`` of VGG)."""
    options = options or {}
    if weights.kind == "hub":
        check_hub_file(weights, download)
        if weights.path.is_file():
            check_hub_hash(weights)
        try:
            with forced_weights_only():
                net = call_builder(model, weights=weights.enum, **options)
        except (RuntimeError, ValueError, OSError, EOFError, pickle.UnpicklingError) as err:
            raise EtnError(
                f"Could not load {weights.enum} from {weights.path} ({type(err).__name__}: "
                f"{str(err).splitlines()[0]}). Delete the file and download it again."
            ) from None
        return net.eval()
    state = read_state_dict(weights.path) if weights.kind == "file" else None
    num_classes = weights.num_classes or infer_num_classes(model, state) or 1000
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(weights.seed)
        net = call_builder(model, weights=None, num_classes=num_classes, **options)
    if state is not None:
        load_strict(net, state, weights.path)
    return net.eval()


def call_builder(model: str, **kwargs: Any) -> nn.Module:
    """``torchvision.models.get_model``, with an option the builder lacks named clearly."""
    import torchvision.models as models

    try:
        return models.get_model(model, **kwargs)
    except TypeError as err:
        extra = sorted(set(kwargs) - {"weights", "num_classes"})
        raise EtnError(
            f"torchvision's {model} rejects the option(s) {extra} ({err}). Remove them from "
            "the pipeline's [backbone] table."
        ) from None


def check_hub_hash(weights: Weights) -> None:
    match = HASH_IN_NAME.search(weights.path.name)
    if match and not cached_sha256(str(weights.path)).startswith(match.group(1)):
        raise EtnError(
            f"The sha256 of {weights.path} does not start with {match.group(1)} as its name "
            "promises: the file is incomplete or corrupt. Delete it and download it again."
        )


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from safetensors or ``torch.load(weights_only=True)``, never a pickle."""
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise EtnError(f"{path} is not a readable safetensors file ({err}).") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        raise EtnError(
            f"{path} cannot be read with torch.load(weights_only=True) "
            f"({str(err).splitlines()[0][:80]}...): it is not a plain state dict, and etn never "
            "unpickles arbitrary objects. Re-save it as torch.save(model.state_dict(), path) "
            "or as safetensors."
        ) from None
    return unwrap_state_dict(state, path)


def unwrap_state_dict(state: Any, path: Path) -> dict[str, torch.Tensor]:
    """Accept a bare state dict or one under ``state_dict`` / ``model``; drop a DataParallel
    ``module.`` prefix."""
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EtnError(
            f"{path} holds a {type(state).__name__}, not a state dict of tensors. Save "
            "model.state_dict() (or {'state_dict': model.state_dict()})."
        )
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def skeleton(model: str, options: dict[str, Any] | None = None) -> nn.Module:
    """The architecture without memory or initialisation (on the meta device): cheap enough to
    check module names while planning."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return call_builder(model, weights=None, **(options or {}))


def infer_num_classes(model: str, state: dict[str, torch.Tensor] | None) -> int | None:
    """Classes of a checkpoint: rows of the last 2-D ``*.weight`` whose module is the head."""
    if not state:
        return None
    from etn_cli.backbones.torchvision_hooks import find_classifier

    name, _ = find_classifier(skeleton(model), None)
    weight = state.get(f"{name}.weight")
    return int(weight.shape[0]) if weight is not None and weight.ndim == 2 else None


def load_strict(net: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:300]
        raise EtnError(
            f"Checkpoint {path} does not fit the model ({detail}). Check model and num_classes "
            "in the pipeline's [backbone] table."
        ) from None
