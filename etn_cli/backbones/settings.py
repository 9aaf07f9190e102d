"""Every backbone's ``[backbone]`` options and ``[finetune]`` settings, as frozen dataclasses
that import no torch.

A backbone's ``Config`` (and ``FinetuneConfig``) lives here rather than beside its code so that
a pipeline file's ``[backbone]`` and ``[finetune]`` tables are checked (unknown keys, types,
ranges, these ``__post_init__`` rules) in milliseconds, before any backbone or torch is
imported: a misspelt option is refused at once. Which settings each backbone name takes is the
table in :mod:`etn_cli.backbones`; ``tests/test_registries.py`` keeps the two in step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from etn_cli.backbones.prompts import CHOICE_LINE, resolve_template
from etn_cli.config import config_dict
from etn_cli.errors import EtnError

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]  # :mod:`.precision` resolves it

TRAINING_FIELDS = ("channels", "hidden", "epochs", "lr", "batch_size", "dropout", "seed")


@dataclass(frozen=True)
class DigitsCNNConfig:
    """Architecture and training recipe (the :data:`TRAINING_FIELDS`, which make the weights'
    cache key) and what extract stores besides ``hidden`` and ``logits``:

    * ``layers``: names from ``model.named_modules()`` whose outputs are stored as
      ``layers/<name>``, 4-D outputs global-average-pooled over H, W, 2-D outputs as they are;
    * ``odin``: store ``layers/odin = f(x') / T``, the logits at ODIN's perturbed input
      ``x' = x - eps * sign(-grad_x log S_yhat(x; T))`` divided by ``T``, with ``T`` =
      ``odin_temperature`` and ``eps`` = ``odin_epsilon`` (Liang et al. 2018's defaults).
    """

    channels: int = 16
    hidden: int = 64
    epochs: int = 20
    lr: float = 1e-3
    batch_size: int = 64
    dropout: float = 0.2
    seed: int = 0
    layers: tuple[str, ...] = ()
    odin: bool = False
    odin_temperature: float = 1000.0
    odin_epsilon: float = 0.0014

    def __post_init__(self) -> None:
        sizes = {k: getattr(self, k) for k in ("channels", "hidden", "epochs", "batch_size")}
        bad = {k: v for k, v in sizes.items() if v < 1}
        if bad or self.lr <= 0 or not 0.0 <= self.dropout < 1.0:
            raise EtnError(
                f"digits_cnn config expects positive sizes and lr, 0 <= dropout < 1; found "
                f"{dataclasses.asdict(self)}. Fix these values in the pipeline file."
            )
        if self.odin_temperature <= 0 or self.odin_epsilon < 0:
            raise EtnError(
                f"digits_cnn config expects odin_temperature > 0 and odin_epsilon >= 0, found "
                f"{self.odin_temperature} and {self.odin_epsilon}. Fix them in the pipeline file."
            )
        repeated = sorted({name for name in self.layers if self.layers.count(name) > 1})
        if repeated:
            raise EtnError(
                f"digits_cnn layers lists {repeated} more than once. List each layer once."
            )

    def training(self) -> dict[str, Any]:
        """The fields that determine the trained weights (the cache key's config part)."""
        return {name: getattr(self, name) for name in TRAINING_FIELDS}


@dataclass(frozen=True)
class TorchvisionConfig:
    """Options of the ``torchvision`` backbone; every field except ``download`` changes the
    fingerprint. ``resize`` / ``crop`` / ``mean`` / ``std`` / ``interpolation`` left unset keep
    the weights' (or the default) preprocessing."""

    model: str = "resnet50"
    weights: str = "DEFAULT"
    checkpoint: str | None = None  # your own model: a state dict for ``model``, or TorchScript
    num_classes: int | None = None
    seed: int = 0  # random initialisation with weights = "none"
    download: bool = False
    dtype: DtypeName = "auto"
    transforms: str | None = None  # preprocessing of these torchvision weights
    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    interpolation: Literal["bilinear", "bicubic", "nearest"] | None = None
    dropout: float | None = None  # for builders that take it (VGG: 0.5 unless set)
    classifier: str | None = None  # the final linear layer (default: the last nn.Linear)
    classifier_layer: str | None = None  # the earlier name of ``classifier``
    features: str | None = None  # the module whose output is the hidden state
    layers: tuple[str, ...] = ()
    odin: bool = False
    odin_temperature: float = 1000.0
    odin_epsilon: float = 0.0014

    def __post_init__(self) -> None:
        if self.num_classes is not None and self.num_classes < 2:
            raise EtnError(f"num_classes must be at least 2, got {self.num_classes}.")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise EtnError(f"dropout must lie in [0, 1), got {self.dropout}. Fix it.")
        check_image_extras(self, "torchvision")
        if self.classifier and self.classifier_layer:
            raise EtnError("Give classifier or classifier_layer (its earlier name), not both.")

    @property
    def head_layer(self) -> str | None:
        return self.classifier or self.classifier_layer


def check_image_extras(config: Any, backbone: str) -> None:
    """The ``layers`` and ``odin`` options every image backbone shares."""
    if config.odin_temperature <= 0 or config.odin_epsilon < 0:
        raise EtnError(
            f"{backbone} config expects odin_temperature > 0 and odin_epsilon >= 0, found "
            f"{config.odin_temperature} and {config.odin_epsilon}. Fix them in the pipeline file."
        )
    repeated = sorted({name for name in config.layers if config.layers.count(name) > 1})
    if repeated:
        raise EtnError(f"layers lists {repeated} more than once. List each layer once.")
    if "odin" in config.layers:
        raise EtnError(
            "layers may not contain 'odin': extract stores ODIN's logits under that name. "
            "Remove it (odin = true asks for them)."
        )


@dataclass(frozen=True)
class TimmConfig:
    """Options of the ``timm`` backbone; every field except ``download`` changes the
    fingerprint. Preprocessing is the model's own pretrained config (``img_size`` changes its
    input size); ``token_pool`` says how 3-D token outputs of ``layers`` are pooled."""

    model: str = ""  # a timm.list_models() name, with or without its pretrained tag
    weights: Literal["pretrained", "none"] = "pretrained"  # "none": random init under seed
    checkpoint: str | None = None  # a state dict of model: .safetensors or torch.save
    num_classes: int | None = None  # with weights = "none" or a checkpoint
    img_size: int | tuple[int, ...] | None = None  # the model's input size (H, W), if not its own
    seed: int = 0
    download: bool = False  # fetch pretrained weights missing from the Hugging Face cache
    dtype: DtypeName = "auto"
    classifier: str | None = None  # the final linear layer (default: model.get_classifier())
    layers: tuple[str, ...] = ()
    token_pool: Literal["class", "mean"] = "class"
    odin: bool = False
    odin_temperature: float = 1000.0
    odin_epsilon: float = 0.0014

    def __post_init__(self) -> None:
        if not self.model:
            raise EtnError(
                'timm needs model = "<name>" in [backbone], e.g. model = '
                '"vit_base_patch16_224.augreg2_in21k_ft_in1k" (see timm.list_models()).'
            )
        if self.num_classes is not None and self.num_classes < 2:
            raise EtnError(f"num_classes must be at least 2, got {self.num_classes}.")
        size = (self.img_size,) if isinstance(self.img_size, int) else self.img_size or (1, 1)
        if len(size) not in (1, 2) or min(size) < 1:
            raise EtnError(f"img_size expects N or [H, W] > 0, got {self.img_size}. Fix it.")
        if self.checkpoint and self.weights != "pretrained":
            raise EtnError(
                f"Give weights = 'none' or checkpoint, not both (found checkpoint = "
                f"{self.checkpoint!r}). A file of your own goes in checkpoint."
            )
        check_image_extras(self, "timm")


@dataclass(frozen=True)
class HFImageConfig:
    """Options of the ``hf_image`` backbone (``AutoModelForImageClassification`` with its
    ``AutoImageProcessor``); every field except ``download`` changes the fingerprint."""

    model: str = ""  # a local folder or a hub id ("google/vit-base-patch16-224")
    revision: str | None = None  # hub branch, tag or commit
    download: bool = False  # fetch a hub model missing from the Hugging Face cache
    dtype: DtypeName = "auto"
    classifier: str | None = None  # the final linear layer (default: in model.classifier)
    layers: tuple[str, ...] = ()
    token_pool: Literal["class", "mean"] = "class"
    odin: bool = False
    odin_temperature: float = 1000.0
    odin_epsilon: float = 0.0014

    def __post_init__(self) -> None:
        if not self.model:
            raise EtnError(
                'hf_image needs model = "<hub id or folder>" in [backbone], e.g. '
                'model = "google/vit-base-patch16-224".'
            )
        check_image_extras(self, "hf_image")


@dataclass(frozen=True)
class TorchvisionFinetuneConfig:
    """The ``[finetune]`` settings of a torchvision backbone (all but ``split``)."""

    epochs: int = 200
    batch_size: int = 1024
    lr: float = 2.5e-4
    optimizer: Literal["adam", "sgd"] = "adam"
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0
    schedule: Literal["constant", "cosine"] = "constant"
    augment: bool = False
    seed: int = 0
    workers: int = 0  # data-loading processes: speed only, never the result

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0 or self.workers < 0:
            raise EtnError(
                f"[finetune] expects epochs >= 1, batch_size >= 1, lr > 0 and workers >= 0; "
                f"found {config_dict(self)}. Fix them in the pipeline file."
            )


@dataclass(frozen=True)
class CausalLMConfig:
    """``[backbone]`` options of ``hf_causal_lm``; all of them go into the fingerprint."""

    model: str = ""  # hub id ("meta-llama/Llama-3.1-8B") or local folder
    revision: str | None = None  # hub branch, tag or commit
    adapter: str | None = None  # peft adapter folder (adapter_model.safetensors)
    dtype: DtypeName = "auto"  # bfloat16 on CUDA, float32 elsewhere
    letters: tuple[str, ...] = ("A", "B", "C", "D")
    # The classes: "letters" (the answer letters, paper Sec. 5.1 "Models": "we restrict the
    # output space to only the multiple-choice answer tokens") or "vocabulary" (every token,
    # as the ablation's "C ~ 10^5 for Llama-3.1", Sec. 5.6 "Prior Parameters", reads).
    class_space: Literal["letters", "vocabulary"] = "letters"
    prompt_template: str = "default"  # a name in prompts.TEMPLATES or a format string
    choice_line: str = CHOICE_LINE  # one answer choice: "{letter}. {text}"
    max_length: int = 2048  # longer prompts lose their beginning (with a warning)
    layers: tuple[int | str, ...] = ()  # extra pooled layers for dmm: indices, "all", names
    trust_remote_code: bool = False
    attn_implementation: str | None = None  # "sdpa", "eager", ...; None: transformers' choice

    def __post_init__(self) -> None:
        if not self.model:
            raise EtnError(
                'hf_causal_lm needs model = "<hub id or folder>" in [backbone], e.g. '
                'model = "meta-llama/Llama-3.1-8B".'
            )
        letters = self.letters
        if (
            len(letters) < 2
            or len(set(letters)) != len(letters)
            or not all(letter and letter == letter.strip() for letter in letters)
        ):
            raise EtnError(
                f"letters must be at least two distinct non-empty strings without surrounding "
                f"spaces, got {list(letters)}. Use e.g. letters = ['A', 'B', 'C', 'D']."
            )
        if self.max_length < 16:
            raise EtnError(f"max_length must be at least 16 tokens, got {self.max_length}.")
        resolve_template(self.prompt_template, self.choice_line)
        bad = [s for s in self.layers if isinstance(s, str) and ("/" in s or not s.strip("."))]
        if bad:
            raise EtnError(f"layers entries {bad} cannot name stored arrays; drop the '/'.")


@dataclass(frozen=True)
class LoraSettings:
    """``[finetune]`` keys for ``hf_causal_lm``; the defaults are the paper's."""

    epochs: int = 3
    batch_size: int = 4
    lr: float = 2.5e-4
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.1  # the LoRA dropout the paper's MC-dropout baseline uses
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    weight_decay: float = 0.0
    seed: int = 0
    gradient_checkpointing: bool = False  # trade compute for memory on long prompts

    def __post_init__(self) -> None:
        sizes = (self.epochs, self.batch_size, self.lora_rank)
        if min(sizes) < 1 or self.lr <= 0 or self.lora_alpha <= 0 or not self.target_modules:
            raise EtnError(
                f"[finetune] expects positive epochs, batch_size, lora_rank, lr and lora_alpha "
                f"and at least one target module; found {config_dict(self)}. Fix these values."
            )
        if not 0.0 <= self.lora_dropout < 1.0 or self.weight_decay < 0:
            raise EtnError(
                f"[finetune] expects 0 <= lora_dropout < 1 and weight_decay >= 0; found "
                f"{self.lora_dropout} and {self.weight_decay}."
            )
