"""One ``torch.nn.Module`` for a backbone and a trained head (docs/api.md).

:class:`EvidentialModel` runs the backbone once per batch, reads the same two things
``etn extract`` stores (the last hidden state ``h`` (B, D) and the logits ``z`` (B, C), plus
pooled layers a head such as ``dmm`` needs) and hands them to the head, which returns the
probabilities and the uncertainty scores of the paper (MP, UM, MI, DE; Sec. "Uncertainty
Metrics"). The readers reuse the backbones' own code: the forward pre-hook on the final linear
layer of :mod:`etn_cli.backbones.torchvision_hooks` for image classifiers, and the prompt
templates, answer tokens and last-token hidden state of :mod:`etn_cli.backbones.lm_forward`
for causal LMs, so the wrapper's features equal the cached ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from etn_cli.backbones.image_inputs import collate_images
from etn_cli.backbones.prompts import PromptTemplate, resolve_template
from etn_cli.backbones.torchvision_hooks import capture, check_head, find_classifier, named_layers
from etn_cli.errors import EtnError
from etn_cli.heads.base import Head


def check_head_fits(head: Head, hidden_size: int, num_classes: int, backbone: str) -> None:
    """The head must have been fitted on features of this backbone's shape."""
    if head.n_classes_ is None:
        raise EtnError(f"Head {head.name!r} is not fitted. Call fit(...) or use load_head(...).")
    if (head.n_features_, head.n_classes_) != (hidden_size, num_classes):
        raise EtnError(
            f"Head {head.name!r} was fitted on hidden size {head.n_features_} and "
            f"{head.n_classes_} classes, but {backbone} gives hidden size {hidden_size} and "
            f"{num_classes} classes. Use a head trained on this backbone's features."
        )


@dataclass
class EvidentialOutput:
    """What :class:`EvidentialModel` says about a batch of B inputs, as numpy arrays.

    ``scores`` holds every score the head defines; ``mp``, ``um``, ``mi`` and ``de`` read it
    and are None for a score the head does not define (a softmax head has no ``um``).
    """

    probs: np.ndarray  # (B, C)
    predictions: np.ndarray  # (B,)
    scores: dict[str, np.ndarray]  # name -> (B,)
    alpha: np.ndarray | None  # (B, C) Dirichlet concentration of evidential heads
    logits: np.ndarray  # (B, C) the backbone's logits
    hidden: np.ndarray  # (B, D) the backbone's last hidden state
    letters: list[str] | None = None  # predicted answer letters (causal LMs)

    @property
    def mp(self) -> np.ndarray | None:
        return self.scores.get("mp")

    @property
    def um(self) -> np.ndarray | None:
        return self.scores.get("um")

    @property
    def mi(self) -> np.ndarray | None:
        return self.scores.get("mi")

    @property
    def de(self) -> np.ndarray | None:
        return self.scores.get("de")


class EvidentialModel(nn.Module):
    """A backbone and a trained head as one module: ``model(inputs)`` runs the backbone once,
    reads its last hidden state and logits, and returns the head's :class:`EvidentialOutput`.

    Build it with :meth:`from_torchvision`, :meth:`from_causal_lm` or :meth:`from_pipeline`.
    It starts in eval mode and runs under ``torch.inference_mode``; the backbone stays on its
    device (``.to(...)`` moves it), the head runs on the CPU. Its ``state_dict`` is the
    backbone's; the head keeps its own files (``head.save(folder)``, :func:`etn_cli.load_head`).
    """

    def __init__(self, features: nn.Module, head: Head) -> None:
        super().__init__()
        check_head_fits(head, features.hidden_size, features.num_classes, features.describe)
        if head.needs_layers and not features.layer_names:
            raise EtnError(
                f"Head {head.name!r} reads pooled intermediate layers; pass layers=(...) with "
                "the layers it was fitted on (the pipeline's [backbone] layers)."
            )
        self.features = features
        self.head = head
        self.eval()

    @classmethod
    def from_torchvision(
        cls,
        model: nn.Module,
        head: Head,
        transform: Any = None,
        *,
        classifier_layer: str | None = None,
        layers: Sequence[str] = (),
    ) -> EvidentialModel:
        """Any classifier module whose output is its final ``nn.Linear``'s output (every
        torchvision classification model; ``classifier_layer`` names another). Inputs are a
        preprocessed batch tensor, or images (PIL or tensors) when ``transform`` is given, e.g.
        ``weights.transforms()``. ``layers`` names modules whose pooled outputs the head reads
        (``dmm``), captured in the same pass."""
        return cls(ImageClassifierFeatures(model, transform, classifier_layer, layers), head)

    @classmethod
    def from_causal_lm(
        cls,
        model: Any,
        tokenizer: Any,
        head: Head,
        letters: Sequence[str] = ("A", "B", "C", "D"),
        template: str = "default",
        *,
        choice_line: str = "{letter}. {text}",
        max_length: int = 2048,
        layers: Sequence[int | str] = (),
    ) -> EvidentialModel:
        """A Hugging Face causal LM answering multiple-choice questions with ``letters``.
        Inputs are question dicts (``question``, ``choices``, optional ``context``), rendered
        with ``template`` (a name of :data:`etn_cli.backbones.prompts.TEMPLATES` or a format
        string) and ``choice_line``, or prompt strings ending where the answer letter follows;
        one input or a list. The tokenizer is used as it is and never changed."""
        template_ = resolve_template(template, choice_line)
        features = MultipleChoiceFeatures(model, tokenizer, letters, template_, max_length, layers)
        return cls(features, head)

    @classmethod
    def from_pipeline(
        cls,
        pipeline: str | Path,
        head: str = "etn",
        seed: int = 0,
        data_dir: str | Path | None = None,
        *,
        device: str = "cpu",
    ) -> EvidentialModel:
        """The pipeline's backbone (with its ``etn finetune`` weights or adapter, its
        preprocessing or prompt template) and its trained head ``head`` for ``seed``;
        ``pipeline`` is a file or a shipped pipeline's name (``"digits"``)."""
        from etn_cli.stages.extract import load_backbone
        from etn_cli.stages.trained_heads import pipeline_head, plan_of, read_head

        plan = plan_of(pipeline, data_dir)
        trained = read_head(pipeline_head(plan, head, seed).path)
        if plan.backbone is None:
            raise EtnError(
                f"{pipeline} reads your own features ([features]), so etn has no backbone to "
                "run. Wrap your model with EvidentialModel.from_torchvision or from_causal_lm."
            )
        return cls.from_backbone(load_backbone(plan, device), trained)

    @classmethod
    def from_backbone(cls, backbone: Any, head: Head) -> EvidentialModel:
        """An etn backbone (see :mod:`etn_cli.backbones`) and a head, with the backbone's own
        preprocessing, prompt template, answer letters and stored layers."""
        c = backbone.config
        if backbone.name == "hf_causal_lm":
            return cls.from_causal_lm(
                backbone.model,
                backbone.tokenizer,
                head,
                c.letters,
                c.prompt_template,
                choice_line=c.choice_line,
                max_length=c.max_length,
                layers=c.layers,
            )
        if not isinstance(getattr(backbone, "model", None), nn.Module):
            raise EtnError(f"Backbone {backbone.name!r} exposes no torch module to wrap.")
        from etn_cli.backbones.image_backbone import ImageBackbone

        if isinstance(backbone, ImageBackbone):  # its own forward: hooks, TorchScript, autocast
            from etn_cli.backbones.torchvision_module import BackboneFeatures

            return cls(BackboneFeatures(backbone), head)
        features = ImageClassifierFeatures(
            backbone.model,
            getattr(backbone, "transform", None),
            getattr(c, "classifier_layer", None),
            getattr(c, "layers", ()),
            getattr(backbone, "autocast", contextlib.nullcontext),  # the dtype extract runs in
        )
        return cls(features, head)

    @torch.inference_mode()
    def forward(self, inputs: Any) -> EvidentialOutput:
        hidden, logits, layers = self.features(inputs)  # (B, D), (B, C), name -> (B, D_l)
        prediction = self.head.predict(hidden, logits, layers=layers or None)
        letters = getattr(self.features, "letters", None)
        return EvidentialOutput(
            probs=prediction.probs,
            predictions=prediction.predictions,
            scores=prediction.scores,
            alpha=prediction.alpha,
            logits=logits.numpy(),
            hidden=hidden.numpy(),
            letters=[letters[k] for k in prediction.predictions] if letters else None,
        )


class ImageClassifierFeatures(nn.Module):
    """``hidden`` = the input of the model's final linear layer, read by the forward pre-hook
    the torchvision backbone uses (:mod:`etn_cli.backbones.torchvision_hooks`), ``logits`` =
    the model's output, checked to be that layer's output; pooled ``layers`` in the same pass."""

    def __init__(
        self,
        model: nn.Module,
        transform: Any,
        classifier_layer: str | None,
        layers: Sequence[str],
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        super().__init__()
        self.model, self.transform, self.autocast = model, transform, autocast
        self.classifier_name, linear = find_classifier(model, classifier_layer)
        self.layer_names = tuple(layers)
        named_layers(model, self.layer_names)  # unknown names raise now, not at the first batch
        self.hidden_size, self.num_classes = linear.in_features, linear.out_features
        self.describe = f"{type(model).__name__} (layer {self.classifier_name!r})"

    def batch(self, inputs: Any) -> torch.Tensor:
        if isinstance(inputs, torch.Tensor):
            x = inputs  # (B, ...) already preprocessed
        elif self.transform is None:
            raise EtnError(
                f"Got {type(inputs).__name__} inputs but no transform. Pass a preprocessed batch "
                "tensor, or build the model with transform=... (e.g. weights.transforms())."
            )
        else:
            images = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            x, _, _ = collate_images([(self.transform(im), 0, i) for i, im in enumerate(images)])
        parameter = next(self.model.parameters(), None)
        if parameter is None:
            return x
        if x.is_floating_point() and parameter.is_floating_point():  # the digits CNN: float64
            return x.to(parameter.device, torch.promote_types(x.dtype, parameter.dtype))
        return x.to(parameter.device)

    def forward(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        x = self.batch(inputs)
        classifier = self.model.get_submodule(self.classifier_name)
        layers = named_layers(self.model, self.layer_names)
        with capture(classifier, layers) as seen, self.autocast():
            logits = self.model(x)  # (B, C)
        hidden = check_head(seen, logits, self.classifier_name)  # (B, D)
        layers = {name: t.float().cpu() for name, t in seen.layers.items()}
        return hidden.float().cpu(), logits.float().cpu(), layers


class MultipleChoiceFeatures(nn.Module):
    """A causal LM as ``hf_causal_lm`` reads it (:mod:`etn_cli.backbones.lm_forward`):
    ``hidden`` = the final normed hidden state at the prompt's last token, ``logits`` = the
    answer letters' rows of lm_head applied to it (then the model's own logit transform)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        letters: Sequence[str],
        template: PromptTemplate,
        max_length: int,
        layers: Sequence[int | str],
    ) -> None:
        from etn_cli.backbones.lm_forward import (
            check_letter_logits,
            find_answer_tokens,
            layer_modules,
            probe_prompt,
        )

        super().__init__()
        self.model, self.tokenizer, self.max_length = model.eval(), tokenizer, max_length
        self.letters = tuple(letters)
        if len(self.letters) < 2 or len(set(self.letters)) != len(self.letters):
            raise EtnError(f"letters must be two or more distinct strings, got {letters!r}.")
        self.template = template
        # as etn's own loader does, pad with EOS when there is no pad token, without setting
        # one on the caller's tokenizer (left padding is done by pad_left, not the tokenizer)
        self.pad_id = tokenizer.pad_token_id
        if self.pad_id is None:
            if tokenizer.eos_token_id is None:
                raise EtnError("The tokenizer has neither a pad nor an EOS token; set pad_token.")
            self.pad_id = tokenizer.eos_token_id
        probe = probe_prompt(self.template, self.letters)
        self.answer = find_answer_tokens(tokenizer, probe, self.letters)
        check_letter_logits(model, tokenizer, probe, self.answer.ids)
        self.layer_names = tuple(layers)
        layer_modules(model, self.layer_names)  # unknown entries raise now
        self.hidden_size = int(model.get_output_embeddings().weight.shape[1])
        self.num_classes = len(self.letters)
        self.describe = f"{type(model).__name__} with letters {list(self.letters)}"

    def prompt(self, item: Any) -> str:
        """One question (dict or :class:`~etn_cli.datasets.mcqa_files.Question`) as prompt
        text; a string is taken as a finished prompt."""
        if isinstance(item, str):
            return item
        if isinstance(item, Mapping):
            question, choices = item.get("question"), item.get("choices")
            context = item.get("context") or ""
        else:
            question, choices = getattr(item, "question", None), getattr(item, "choices", None)
            context = getattr(item, "context", "")
        if not isinstance(question, str) or not isinstance(choices, (list, tuple)):
            raise EtnError(
                f"Expected a prompt string or a question with 'question' text and a 'choices' "
                f"list, got {item!r:.80}."
            )
        if len(choices) > len(self.letters):
            raise EtnError(
                f"Question {question!r:.60} has {len(choices)} choices but the letters are "
                f"{list(self.letters)}; expected at most one choice per letter. Pass letters=...."
            )
        return self.template.render(question, [str(c) for c in choices], self.letters, context)

    def encode(self, inputs: Any) -> dict[str, torch.Tensor]:
        """Left-padded ``input_ids`` and ``attention_mask`` (B, L), each prompt cut to its
        last ``max_length`` tokens."""
        from etn_cli.backbones.lm_forward import pad_left

        items = [inputs] if isinstance(inputs, (str, Mapping)) else list(inputs)
        if not items:
            raise EtnError("Expected at least one question or prompt, got none.")
        encoded = self.tokenizer([self.prompt(item) for item in items])["input_ids"]
        return pad_left([ids[-self.max_length :] for ids in encoded], self.pad_id)

    def forward(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        from etn_cli.backbones.lm_forward import (
            captured_layers,
            final_hidden,
            layer_modules,
            letter_logits,
        )

        pretokenized = isinstance(inputs, Mapping) and "input_ids" in inputs
        batch = inputs if pretokenized else self.encode(inputs)
        modules = layer_modules(self.model, self.layer_names) if self.layer_names else {}
        with captured_layers(modules, batch["attention_mask"]) as layers:
            hidden = final_hidden(self.model, batch)  # (B, D)
        logits = letter_logits(self.model, hidden, self.answer.ids)  # (B, C)
        return hidden.float().cpu(), logits.float().cpu(), dict(layers)
