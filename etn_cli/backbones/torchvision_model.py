"""``torchvision``: any torchvision classification model as an etn backbone.

```toml
[backbone]
name = "torchvision"
model = "resnet50"            # any classification model of torchvision.models.list_models()
weights = "IMAGENET1K_V2"     # weights name, checkpoint file, etn finetune folder, or "none"
dtype = "auto"                # bfloat16 autocast on CUDA, float32 elsewhere; stored as float32
```

A model of your own: ``checkpoint = "model.safetensors"`` (a state dict for ``model``) or a
TorchScript file, with ``features`` / ``classifier`` naming its layers and ``transforms``
naming torchvision weights whose preprocessing it uses (:mod:`etn_cli.backbones.own_model`).

Hidden state = the input of the final classifier layer (the last ``nn.Linear``, or
``classifier_layer``), read by a forward pre-hook; logits = the model's output, checked to be
that layer's output, so ``logits == hidden @ W.T + b`` with ``classifier()``'s ``W``, ``b``.
Preprocessing: the weights' own ``transforms()`` where they exist, else the documented default
of :mod:`etn_cli.backbones.image_inputs`. The model is loaded lazily: planning a pipeline only
resolves names, checks files and computes the fingerprint.

The forward pass, batches, extras and classifier are those of every image backbone
(:mod:`etn_cli.backbones.image_backbone`). Extract-time extras (``Backbone.extract_batch``),
with the same meaning as for ``digits_cnn``:

* ``layers``: module names (``model.named_modules()``) stored as ``layers/<name>``, 4-D outputs
  averaged over H, W, 2-D outputs as they are (for the Dirichlet meta-model);
* ``odin``: ``layers/odin = f(x') / T`` with ``x' = x - eps * sign(-grad_x log S_yhat(x; T))``
  (Liang et al. 2018, Eq. 2). As in the authors' code, ``eps`` is in pixel units: the step on
  the normalised input is ``eps / std`` per channel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from etn_cli.backbones import own_model
from etn_cli.backbones import torchvision_weights as tvw
from etn_cli.backbones.base import backbones
from etn_cli.backbones.image_backbone import ImageBackbone
from etn_cli.backbones.image_inputs import ImageTransform, override
from etn_cli.backbones.precision import resolve_dtype
from etn_cli.backbones.settings import TorchvisionConfig as Config
from etn_cli.backbones.settings import TorchvisionFinetuneConfig as FinetuneConfig
from etn_cli.backbones.torchvision_hooks import find_classifier, named_layers
from etn_cli.datasets.base import Split
from etn_cli.errors import EtnError, require_extra

CODE_VERSION = "1"  # bump whenever extraction or fine-tuning changes for the same inputs


@backbones.register("torchvision")
class TorchvisionBackbone(ImageBackbone):
    """A torchvision classifier behind the backbone interface (see the module docstring)."""

    name = "torchvision"
    Config = Config
    PATH_OPTIONS = ("weights", "checkpoint")  # resolved relative to the pipeline file
    FinetuneConfig = FinetuneConfig

    def __init__(self, config: Config | None, cache_dir: Path, device: str = "cpu") -> None:
        require_extra(("torchvision",), "vision", "The torchvision backbone")
        super().__init__(config if config is not None else Config(), cache_dir, device)
        c = self.config
        self.dtype = resolve_dtype(c.dtype, self.device)
        self.weights = own_model.resolve_source(c)
        tvw.check_hub_file(self.weights, c.download)
        options = {k: getattr(c, k) for k in ("resize", "crop", "mean", "std", "interpolation")}
        self.transform = ImageTransform(override(own_model.base_spec(c, self.weights), **options))
        if self.weights.kind == "torchscript":
            own_model.check_torchscript_options(c)
        else:
            architecture = tvw.skeleton(c.model, self.builder_options())  # names checked early
            find_classifier(architecture, c.head_layer)
            named_layers(architecture, c.layers)
            own_model.check_features_name(architecture, c.features)
        self.finetuned: str | None = None
        self.scripted: own_model.ScriptedClassifier | None = None
        self.features_module: torch.nn.Module | None = None
        self._model: torch.nn.Module | None = None

    # -- loading ----------------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        """The network on ``self.device`` in eval mode, built on first use."""
        if self._model is None:
            c = self.config
            # ordinary tensors even when first used under inference_mode: ODIN needs gradients
            with torch.inference_mode(False):
                if self.weights.kind == "torchscript":
                    model = own_model.load_torchscript(self.weights.path).to(self.device)
                    self.scripted = own_model.ScriptedClassifier(model, c.head_layer)
                    self.head_name, self.head = self.scripted.head_name, self.scripted.head
                    self.layer_modules: dict[str, torch.nn.Module] = {}
                    self._model = model.eval()
                    return self._model
                model = tvw.build_model(c.model, self.weights, c.download, self.builder_options())
                self._model = model.to(self.device).eval()
            self.head_name, self.head = find_classifier(model, c.head_layer)
            self.layer_modules = named_layers(model, c.layers)
            self.features_module = model.get_submodule(c.features) if c.features else None
            if self.features_module is not None:
                self.probe_features()
        return self._model

    def probe_features(self) -> None:
        """Check ``features`` on one blank image as soon as the model is built, so that a
        module that is not the classifier's input is refused before any split is written. A
        blank image the model cannot take is left to the first batch to report."""
        spec = self.transform.spec
        size = spec.crop or spec.resize or 224
        blank = torch.zeros(1, 3, size, size, device=self.device)
        try:
            with torch.inference_mode():
                self.run(blank, with_layers=False)
        except EtnError:
            raise
        except Exception:
            pass

    def builder_options(self) -> dict[str, Any]:
        return {} if self.config.dropout is None else {"dropout": self.config.dropout}

    def fingerprint(self) -> dict[str, Any]:
        import torchvision

        fields = ("model", "num_classes", "dropout", "layers")
        odin = ("odin", "odin_temperature", "odin_epsilon") if self.config.odin else ()
        features = {"features": self.config.features} if self.config.features else {}
        return {
            "name": self.name,
            **{key: getattr(self.config, key) for key in fields + odin},
            "dtype": self.dtype,
            "classifier_layer": self.config.head_layer,
            **features,
            "weights": self.weights.fingerprint,
            "finetuned": self.finetuned,
            "transform": self.transform.spec.describe(),
            "torchvision_version": torchvision.__version__.split("+")[0],
            "code_version": CODE_VERSION,
        }

    # -- forward ----------------------------------------------------------------------------

    def run(
        self, x: torch.Tensor, with_layers: bool
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One forward pass: ``(hidden (B, D), logits (B, C), pooled layers)``, float32; a
        TorchScript model returns its hidden state itself (no hooks)."""
        self.model  # noqa: B018 - builds the model, which sets self.scripted
        if self.scripted is None:
            return super().run(x, with_layers)
        with self.autocast():
            hidden, logits = self.scripted(x)  # (B, D), (B, C)
        return hidden.float(), logits.float(), {}

    # -- etn finetune -----------------------------------------------------------------------

    def finetune(self, train: Split, settings: dict[str, Any], out_dir: Path) -> dict[str, Any]:
        """Cross-entropy training of the whole model on ``train`` (see ``vision_finetune``);
        writes ``model.safetensors`` into ``out_dir`` and returns the training record."""
        from etn_cli.backbones.vision_finetune import finetune_backbone

        return finetune_backbone(self, train, settings, Path(out_dir))

    def use_finetuned(self, out_dir: Path) -> None:
        """Load ``out_dir/model.safetensors`` (written by :meth:`finetune`) from now on."""
        path = Path(out_dir) / tvw.FINETUNED_FILE
        if not path.is_file():
            raise EtnError(
                f"Expected fine-tuned weights at {path}, found none. Run `etn finetune` on the "
                "pipeline first (or delete the incomplete folder)."
            )
        num_classes = self.weights.num_classes or self.config.num_classes
        self.weights = tvw.local_entry(path, num_classes)
        self.finetuned = Path(out_dir).name
        self._model = None
