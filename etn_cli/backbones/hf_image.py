"""``hf_image``: a Hugging Face image classifier (``AutoModelForImageClassification``) as an
etn backbone, preprocessed by its own ``AutoImageProcessor``.

```toml
[backbone]
name = "hf_image"
model = "google/vit-base-patch16-224"  # a hub id (Hugging Face cache) or a local folder
# download = true   # fetch a hub model missing from the cache (else the cache alone)
# classifier = "classifier"  # the final linear layer, when the default does not find it
```

The model loads from safetensors only and never runs its repository's code (a config with
``auto_map`` is refused). Preprocessing is the processor itself, called per image as the
Hugging Face documentation does (``processor(images=image, return_tensors="pt")``), so the
model sees exactly what a direct call would give it.

Hidden state = the input of the classifier layer, read by a forward pre-hook: ``classifier``
if given, else the model's ``classifier`` module (or the last ``nn.Linear`` inside it, as in
``ResNetForImageClassification``'s ``Sequential(Flatten, Linear)``). The logits
(``model(pixel_values=x).logits``) are checked to be that layer's output, so a model whose
head is not one linear layer (DeiT with a distillation head) is refused with the layer named.
``layers`` are pooled as for every image backbone; token outputs (B, N, D) by ``token_pool``,
``"class"`` (token 0, the class token) or ``"mean"`` (the tokens after the class and register
tokens). Forward pass, ODIN and autocast: :mod:`etn_cli.backbones.image_backbone`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from etn_cli.backbones.base import backbones
from etn_cli.backbones.hf_files import (
    first_line,
    folder_hashes,
    hash_memo,
    is_offline,
    locate_model,
    read_model_config,
)
from etn_cli.backbones.image_backbone import ImageBackbone
from etn_cli.backbones.image_inputs import LibraryTransform
from etn_cli.backbones.precision import resolve_dtype
from etn_cli.backbones.settings import HFImageConfig as Config
from etn_cli.backbones.torchvision_hooks import TokenPooling, find_classifier, named_layers
from etn_cli.errors import EtnError, require_extra

CODE_VERSION = "1"  # bump whenever extraction changes for the same inputs


@backbones.register("hf_image")
class HFImageBackbone(ImageBackbone):
    """A Hugging Face image classifier behind the backbone interface (see the module
    docstring)."""

    name = "hf_image"
    Config = Config
    PATH_OPTIONS = ("model",)  # resolved relative to the pipeline file

    def __init__(self, config: Config, cache_dir: Path, device: str = "cpu") -> None:
        require_extra(("transformers", "torchvision"), "vision", "The hf_image backbone")
        super().__init__(config, cache_dir, device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.location = locate_model(config.model, config.revision, config.download)
        read_model_config(self.location, trust_remote_code=False, kind="image classifier")
        self.processor = load_processor(self.location.folder, self.location.name)
        self.transform = processor_transform(self.processor)
        skeleton = self.create_skeleton()  # names checked while planning
        classifier_of(skeleton, config.classifier)
        named_layers(skeleton, config.layers)
        self._model: nn.Module | None = None
        self._fingerprint: dict[str, Any] | None = None

    def create_skeleton(self) -> nn.Module:
        """The architecture of ``config.json`` on the meta device: no memory, no weights."""
        from transformers import AutoConfig, AutoModelForImageClassification

        config = AutoConfig.from_pretrained(str(self.location.folder), local_files_only=True)
        try:
            with torch.device("meta"):
                return AutoModelForImageClassification.from_config(config)
        except ValueError as err:
            raise EtnError(
                f"{self.location.name} is not an image classification model "
                f"({first_line(err)[:200]}). Use a model that AutoModelForImageClassification "
                "loads, e.g. google/vit-base-patch16-224."
            ) from None

    @property
    def model(self) -> nn.Module:
        """The network on ``self.device`` in eval mode, loaded on first use."""
        if self._model is None:
            with torch.inference_mode(False):  # ordinary tensors: ODIN needs gradients
                model = self.load_model().to(self.device).eval()
            self.head_name, self.head = classifier_of(model, self.config.classifier)
            self.layer_modules = named_layers(model, self.config.layers)
            self.tokens = TokenPooling(self.config.token_pool, prefix_tokens(model))
            self._model = model
            if self.location.repo_id is None:  # the files' hashes, once the model is accepted
                self.hash_memo().save()
        return self._model

    def load_model(self) -> nn.Module:
        from transformers import AutoModelForImageClassification
        from transformers.utils import logging as hf_logging

        if not sys.stderr.isatty():
            hf_logging.disable_progress_bar()
        location = self.location
        options: dict[str, Any] = {
            "dtype": torch.float32,  # half precision is autocast's, as for every image backbone
            "use_safetensors": True,
            "trust_remote_code": False,
            "local_files_only": is_offline() or not self.config.download,
        }
        if location.commit is not None:
            options["revision"] = location.commit
        try:
            return AutoModelForImageClassification.from_pretrained(location.load_from, **options)
        except OSError as err:
            raise EtnError(
                f"Could not load the weights of {location.name}: {first_line(err)[:200]}. etn "
                "reads *.safetensors only; run `hf download <id>` (or set download = true)."
            ) from None

    def logits_of(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(pixel_values=x).logits  # (B, C)

    def hash_memo(self):
        return hash_memo(self.cache_dir / self.name / "file-hashes.json")

    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            import transformers

            location, c = self.location, self.config
            if location.repo_id is not None:  # the commit names the revision's content
                model = {"repo_id": location.repo_id, "commit": location.commit}
            else:
                model = {"files": folder_hashes(location.folder, self.hash_memo())}
            odin = ("odin", "odin_temperature", "odin_epsilon") if c.odin else ()
            fields = ("classifier", "layers", "token_pool") + odin
            self._fingerprint = {
                "name": self.name,
                "model": model,
                **{key: getattr(c, key) for key in fields},
                "dtype": self.dtype,
                "transform": self.transform.describe(),
                "transformers_version": transformers.__version__,
                "code_version": CODE_VERSION,
            }
        return self._fingerprint


def load_processor(folder: Path, name: str) -> Any:
    from transformers import AutoImageProcessor

    if not (folder / "preprocessor_config.json").is_file():
        raise EtnError(
            f"Model {name} has no preprocessor_config.json in {folder}; etn preprocesses images "
            "with the model's own AutoImageProcessor. Save it there "
            "(processor.save_pretrained(folder))."
        )
    try:
        return AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        raise EtnError(
            f"Could not load the image processor of {name} from {folder}: {first_line(err)}."
        ) from None


class ProcessorPixels:
    """One image through a Hugging Face image processor: the model's input (3, H, W)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, image: Any) -> torch.Tensor:
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]


def processor_transform(processor: Any) -> LibraryTransform:
    """The processor as etn's image transform; ``std`` (ODIN's step) from its settings."""
    settings = json.loads(processor.to_json_string())
    normalize = settings.get("do_normalize", True)
    mean = settings.get("image_mean") if normalize else None
    std = settings.get("image_std") if normalize else None
    record = {"processor": type(processor).__name__, **settings}
    return LibraryTransform(
        ProcessorPixels(processor),
        record,
        mean or (0.0, 0.0, 0.0),
        std or (1.0, 1.0, 1.0),
        size=fixed_size(settings),
        normalized=True,
    )


def fixed_size(settings: dict[str, Any]) -> tuple[int, int] | None:
    """The (width, height) every image comes to, when the settings say it plainly."""
    size = settings.get("crop_size") if settings.get("do_center_crop") else settings.get("size")
    if isinstance(size, dict) and "height" in size and "width" in size:
        return int(size["width"]), int(size["height"])
    return None  # e.g. {"shortest_edge": N}: probed per input size


def classifier_of(model: nn.Module, name: str | None) -> tuple[str, nn.Linear]:
    """``name``, else the model's ``classifier`` (or the last linear layer inside it)."""
    if name is not None:
        return find_classifier(model, name)
    head = getattr(model, "classifier", None)
    if not isinstance(head, nn.Module):
        raise EtnError(
            f"{type(model).__name__} has no module named 'classifier'. Set classifier = "
            '"..." in [backbone] to its final linear layer (see model.named_modules()).'
        )
    if isinstance(head, nn.Linear):
        return find_classifier(model, "classifier")
    inner, _ = find_classifier(head, None)
    return find_classifier(model, f"classifier.{inner}")


def prefix_tokens(model: nn.Module) -> int:
    """Class and register tokens in front of the patch tokens (0 without a class token)."""
    has_class = any(name.endswith("cls_token") for name, _ in model.named_parameters())
    registers = int(getattr(model.config, "num_register_tokens", 0) or 0)
    return (1 + registers) if has_class else 0
