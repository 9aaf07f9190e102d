"""``timm``: any timm classification model as an etn backbone.

```toml
[backbone]
name = "timm"
model = "vit_base_patch16_224.augreg2_in21k_ft_in1k"  # any timm.list_models() name (and tag)
weights = "pretrained"   # from the Hugging Face cache; "none": random init (num_classes, seed)
# checkpoint = "model.safetensors"  # or a state dict of your own for model
# download = true        # fetch pretrained weights missing from the cache (else offline)
# img_size = [224, 320]  # input size (H, W) for preprocessing and, where it takes one, the model
```

Weights: the model's pretrained tag names a Hugging Face repository (``timm/<model>.<tag>``);
its ``model.safetensors`` is read from the Hugging Face cache (``HF_HOME``), downloaded only
with ``download = true``, and loaded strictly into ``timm.create_model(model)``, as is a
``checkpoint`` (safetensors, or ``torch.load(weights_only=True)``: never a pickle).

Preprocessing: the model's own pretrained config through timm's documented path,
``timm.data.resolve_data_config(model=model)`` and ``create_transform`` (input size,
interpolation, crop percentage and mode, mean, std), as timm's prefetching loader runs it:
resize and crop per image to uint8, scaling and normalisation per batch on the device.

Hidden state = the input of timm's classifier ``model.get_classifier()`` (or ``classifier``),
read by a forward pre-hook without editing the model: for timm models that is
``model.forward_head(model.forward_features(x), pre_logits=True)``. The logits are checked to
be that layer's output (``logits == hidden @ W.T + b``). ``layers`` are pooled as for every
image backbone, token outputs (B, N, D) by ``token_pool``: ``"class"`` (token 0) or ``"mean"``
(the patch tokens after ``model.num_prefix_tokens``). The forward pass, ODIN and autocast are
:mod:`etn_cli.backbones.image_backbone`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from etn_cli.backbones import torchvision_weights as tvw
from etn_cli.backbones.base import backbones
from etn_cli.backbones.image_backbone import ImageBackbone
from etn_cli.backbones.image_inputs import LibraryTransform
from etn_cli.backbones.precision import resolve_dtype
from etn_cli.backbones.settings import TimmConfig as Config
from etn_cli.backbones.torchvision_hooks import TokenPooling, find_classifier, named_layers
from etn_cli.errors import EtnError, did_you_mean, require_extra

CODE_VERSION = "1"  # bump whenever extraction changes for the same inputs
HUB_FILE = "model.safetensors"


@backbones.register("timm")
class TimmBackbone(ImageBackbone):
    """A timm classifier behind the backbone interface (see the module docstring)."""

    name = "timm"
    Config = Config
    PATH_OPTIONS = ("checkpoint",)  # resolved relative to the pipeline file

    def __init__(self, config: Config, cache_dir: Path, device: str = "cpu") -> None:
        require_extra(("timm", "torchvision"), "vision", "The timm backbone")
        super().__init__(config, cache_dir, device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        check_model_name(config.model)
        self.source = weights_source(config)
        self._model: nn.Module | None = None
        skeleton = self.skeleton()  # names and preprocessing, without weights
        self.transform = timm_transform(skeleton, config.img_size)
        classifier_name(skeleton, config.classifier)
        named_layers(skeleton, config.layers)

    def skeleton(self) -> nn.Module:
        """The architecture on the meta device (no memory), or on the CPU for models whose
        initialisation reads tensor values (timm 1.0.9's ViT)."""
        try:
            return self.create(device="meta")
        except (RuntimeError, NotImplementedError):
            return self.create()

    def create(self, device: str = "cpu") -> nn.Module:
        """``timm.create_model`` without pretrained weights, under the configured seed."""
        import timm

        c = self.config
        options: dict[str, Any] = {} if c.num_classes is None else {"num_classes": c.num_classes}
        if c.img_size is not None:
            options["img_size"] = c.img_size
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(c.seed)
            try:
                return timm.create_model(c.model, pretrained=False, **options).eval()
            except TypeError as err:
                if "img_size" not in str(err):
                    raise EtnError(
                        f"timm's {c.model} rejects the option(s) {sorted(options)} ({err}). "
                        "Remove them from the pipeline's [backbone] table."
                    ) from None
            # a model of any input size (a CNN): img_size is the preprocessing's alone
            torch.manual_seed(c.seed)
            options.pop("img_size")
            return timm.create_model(c.model, pretrained=False, **options).eval()

    @property
    def model(self) -> nn.Module:
        """The network on ``self.device`` in eval mode, built and loaded on first use."""
        if self._model is None:
            with torch.inference_mode(False):  # ordinary tensors: ODIN needs gradients
                model = self.create()
                path = self.source.get("path")
                if path is not None:
                    path, state = Path(path), tvw.read_state_dict(Path(path))
                    if self.config.num_classes is None:  # the checkpoint's classes, then
                        fit_classes(model, state)
                    tvw.load_strict(model, state, path)
                self._model = model.to(self.device).eval()
            self.head_name, self.head = classifier_name(model, self.config.classifier)
            self.layer_modules = named_layers(model, self.config.layers)
            prefix = int(getattr(model, "num_prefix_tokens", 0))
            self.tokens = TokenPooling(self.config.token_pool, prefix)
        return self._model

    def fingerprint(self) -> dict[str, Any]:
        import timm

        fields = ("model", "num_classes", "img_size", "classifier", "layers", "token_pool")
        odin = ("odin", "odin_temperature", "odin_epsilon") if self.config.odin else ()
        return {
            "name": self.name,
            **{key: getattr(self.config, key) for key in fields + odin},
            "weights": {k: v for k, v in self.source.items() if k != "path"},
            "dtype": self.dtype,
            "transform": self.transform.describe(),
            "timm_version": timm.__version__,
            "code_version": CODE_VERSION,
        }


def check_model_name(model: str) -> None:
    import timm

    if not timm.is_model(model):
        names = timm.list_models()
        hint = did_you_mean(model.split(".")[0], names, n=3, cutoff=0.5)
        raise EtnError(
            f"Unknown timm model {model!r}.{hint} See timm.list_models() (and "
            "timm.list_pretrained() for the names with weights tags)."
        )


def weights_source(config: Config) -> dict[str, Any]:
    """Where the weights come from, with what names their content: ``{"weights": "none",
    "seed"}``, a checkpoint's sha256, or the hub repository and commit of the cache file."""
    if config.checkpoint is not None:
        path = Path(config.checkpoint).expanduser()
        if not path.is_file():
            raise EtnError(
                f"checkpoint = {config.checkpoint!r}: no such file ({path.resolve()}). Give the "
                f"path of a state dict of {config.model} (.safetensors or torch.save), relative "
                "to the pipeline file."
            )
        return {"weights": "file", "file": path.name, "sha256": tvw.cached_sha256(str(path)),
                "path": str(path)}  # fmt: skip
    if config.weights == "none":
        return {"weights": "none", "seed": config.seed}
    return hub_weights(config.model, config.download)


def hub_weights(model: str, download: bool) -> dict[str, Any]:
    """The model's pretrained ``model.safetensors`` in the Hugging Face cache (fetched only
    with ``download``): its repository, commit and path."""
    import timm
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    cfg = timm.models.get_pretrained_cfg(model)
    repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not repo:
        raise EtnError(
            f"timm's {model} has no Hugging Face weights (see timm.list_pretrained('{model}*')). "
            'Pick a name with a pretrained tag, or give checkpoint = "<state dict file>".'
        )
    repo, _, revision = repo.partition("@")
    filename = getattr(cfg, "hf_hub_filename", None) or HUB_FILE
    try:
        found = hf_hub_download(
            repo, filename, revision=revision or None, local_files_only=not download
        )
    except LocalEntryNotFoundError:
        raise EtnError(
            f"The weights of timm's {model} ({repo}/{filename}) are not in the Hugging Face "
            f"cache. Run `hf download {repo} {filename}` (same HF_HOME), or set download = true "
            "in the pipeline's [backbone] table."
        ) from None
    except EntryNotFoundError:
        raise EtnError(
            f"{repo} has no {filename}; etn loads timm weights from safetensors only. Download "
            'the weights yourself and give checkpoint = "<file>".'
        ) from None
    path = Path(found)
    return {"weights": "pretrained", "repo_id": repo, "file": filename,
            "commit": path.parent.name, "path": str(path)}  # fmt: skip


def classifier_name(model: nn.Module, name: str | None) -> tuple[str, nn.Linear]:
    """``name``, else the module ``model.get_classifier()`` returns, as a linear layer."""
    if name is None:
        head = model.get_classifier()
        found = [n for n, m in model.named_modules() if m is head and n]
        if not found or not isinstance(head, nn.Linear):
            raise EtnError(
                f"timm's {type(model).__name__} classifier is {type(head).__name__}, not one "
                'nn.Linear layer whose input is the hidden state. Set classifier = "..." to '
                "the final linear layer (see model.named_modules())."
            )
        name = found[0]
    return find_classifier(model, name)


def fit_classes(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """A checkpoint with another number of classes resets the model's classifier to it."""
    found = [n for n, m in model.named_modules() if m is model.get_classifier()]
    weight = state.get(f"{found[0]}.weight") if found else None
    if weight is not None and weight.ndim == 2 and weight.shape[0] != model.num_classes:
        model.reset_classifier(int(weight.shape[0]))


def timm_transform(model: nn.Module, img_size: int | tuple[int, ...] | None) -> LibraryTransform:
    """timm's evaluation transform of ``model``'s pretrained config, split as timm's
    prefetcher splits it: uint8 pixels per image, normalisation per batch."""
    from timm.data import create_transform, resolve_data_config

    args = {}
    if img_size is not None:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        args["input_size"] = (3, *(size * 2)[:2])
    data = resolve_data_config(args, model=model)
    steps = create_transform(**data, is_training=False, use_prefetcher=True)
    _, height, width = data["input_size"]
    record = {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}
    return LibraryTransform(steps, record, data["mean"], data["std"], size=(width, height))
