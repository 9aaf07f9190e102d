"""``hf_causal_lm``: any Hugging Face causal LM answering multiple-choice questions
(Llama-3.1-8B and Gemma-2-9B in the paper), optionally with a peft LoRA adapter.

The output space is the answer letters (paper, "LLM Datasets", after Yang et al. 2024 and Li et
al. 2025): ``logits`` are the answer-letter rows of lm_head applied to the final hidden state
at the prompt's last real token, followed by the model's own final-logit transform (Gemma-2's
soft-capping). With ``class_space = "vocabulary"`` they are every row of lm_head (the whole
vocabulary, the reading of the paper's ablation) and a label is its letter's token id;
``hidden`` is that final hidden state (after the final norm, the input of lm_head). See
:mod:`etn_cli.backbones.lm_forward` for the formulas. The model and tokenizer load lazily, so
planning a pipeline only reads config, tokenizer and hashes.

Batches are grouped by prompt length (longest first) and left-padded; ``index`` restores the
split order. Adapters are merged into the weights for extraction. ``classifier()`` returns
lm_head's answer-letter rows; for soft-capped models (Gemma-2) the logits are
``s * tanh((h @ W.T + b) / s)``, not the affine map itself.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from etn_cli.backbones.base import Backbone, backbones
from etn_cli.backbones.hf_files import (
    HashMemo,
    ModelLocation,
    adapter_fingerprint,
    check_adapter_folder,
    first_line,
    folder_hashes,
    hash_memo,
    is_offline,
    load_tokenizer,
    locate_model,
    read_model_config,
)
from etn_cli.backbones.lm_forward import (
    AnswerTokens,
    captured_layers,
    check_letter_logits,
    final_hidden,
    find_answer_tokens,
    layer_modules,
    letter_logits,
    letters_advice,
    pad_left,
    postprocess_logits,
    probe_prompt,
)
from etn_cli.backbones.precision import resolve_dtype
from etn_cli.backbones.prompts import resolve_template
from etn_cli.backbones.settings import CausalLMConfig as Config
from etn_cli.backbones.settings import LoraSettings
from etn_cli.datasets.base import Split
from etn_cli.errors import EtnError, require_extra

CODE_VERSION = "1"  # bump when the computation of hidden states or logits changes


@backbones.register("hf_causal_lm")
class CausalLMBackbone(Backbone):
    """A Hugging Face causal LM restricted to the answer letters of multiple-choice QA."""

    name = "hf_causal_lm"
    Config = Config
    PATH_OPTIONS = ("model", "adapter")  # resolved relative to the pipeline file
    FinetuneConfig = LoraSettings  # the [finetune] keys, checked at plan time

    def __init__(self, config: Config, cache_dir: Path, device: str = "cpu") -> None:
        require_extra(("transformers", "tokenizers"), "llm", "The hf_causal_lm backbone")
        super().__init__(config, cache_dir, device)
        self.template = resolve_template(config.prompt_template, config.choice_line)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.adapter_dir = check_adapter_folder(config.adapter) if config.adapter else None
        self.finetuned_dir: Path | None = None
        self._location: ModelLocation | None = None
        self._model_config: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._answer: AnswerTokens | None = None
        self._model: Any = None
        self._fingerprint: dict[str, Any] | None = None

    # ------------------------------------------------------------------ lazy pieces
    @property
    def location(self) -> ModelLocation:
        if self._location is None:
            location = locate_model(self.config.model, self.config.revision)
            self._model_config = read_model_config(location, self.config.trust_remote_code)
            self._location = location
        return self._location

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.location, self.config.trust_remote_code)
        return self._tokenizer

    @property
    def answer_tokens(self) -> AnswerTokens:
        if self._answer is None:
            letters = self.config.letters
            prompt = probe_prompt(self.template, letters)
            try:
                self._answer = find_answer_tokens(self.tokenizer, prompt, letters)
            except EtnError:  # again, ending with the letters that do work here
                fix = letters_advice(self.tokenizer, self.template, letters, len(letters))
                self._answer = find_answer_tokens(self.tokenizer, prompt, letters, fix)
        return self._answer

    def letters_advice(self, count: int) -> str:
        """What to set for questions of up to ``count`` choices (the class check's advice)."""
        return letters_advice(self.tokenizer, self.template, self.config.letters, count)

    @property
    def model(self) -> Any:
        """The model in eval mode with its adapter merged, checked against its own forward."""
        if self._model is None:
            model = self.load_base_model()
            adapter = self.finetuned_dir or self.adapter_dir
            if adapter is not None:
                from etn_cli.backbones.lora import attach_adapter

                model = attach_adapter(model, adapter, self.location.name)
            model.eval()
            prompt = probe_prompt(self.template, self.config.letters)
            check_letter_logits(model, self.tokenizer, prompt, self.answer_tokens.ids)
            self._model = model
            if self.location.repo_id is None:  # the files' hashes, once the model is accepted
                self.hash_memo().save()
        return self._model

    def load_base_model(self) -> Any:
        """A fresh copy of the base model (no adapter) on this backbone's device."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        if not sys.stderr.isatty():  # etn's own bars are silent off a terminal; so is this one
            hf_logging.disable_progress_bar()
        location = self.location
        options: dict[str, Any] = {
            "dtype": getattr(torch, self.dtype),
            "device_map": str(self.device),  # straight onto the device, no copy in host memory
            "use_safetensors": True,
            "trust_remote_code": self.config.trust_remote_code,
            "local_files_only": is_offline(),
        }
        if location.commit is not None:
            options["revision"] = location.commit
        if self.config.attn_implementation is not None:
            options["attn_implementation"] = self.config.attn_implementation
        try:
            model = AutoModelForCausalLM.from_pretrained(location.load_from, **options)
        except OSError as err:
            raise EtnError(
                f"Could not load the weights of {location.name}: {first_line(err)}. etn reads "
                "*.safetensors weights only; download them (`hf download <id>`) or convert them."
            ) from None
        except ValueError as err:  # not a causal LM, or an unsupported option
            raise EtnError(
                f"{location.name} is not loadable as a causal LM: {first_line(err)}"
            ) from None
        return model

    def hash_memo(self) -> HashMemo:
        """The sha256 memo of local model files, saved only once the model has loaded."""
        return hash_memo(self.cache_dir / self.name / "file-hashes.json")

    # ------------------------------------------------------------------ interface
    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            location = self.location
            if location.repo_id is not None:  # the commit names the content of the revision
                model = {"repo_id": location.repo_id, "commit": location.commit}
            else:
                model = {"files": folder_hashes(location.folder, self.hash_memo())}
            adapter = self.finetuned_dir or self.adapter_dir
            answer = self.answer_tokens
            self._fingerprint = {
                "name": self.name,
                "model": model,
                "adapter": adapter_fingerprint(adapter) if adapter else None,
                "dtype": self.dtype,
                "letters": list(self.config.letters),
                "class_space": self.config.class_space,
                "answer_tokens": {"variant": answer.variant, "ids": list(answer.ids)},
                "prompt_template": self.template.fingerprint(),
                "max_length": self.config.max_length,
                "layers": list(self.config.layers),
                "trust_remote_code": self.config.trust_remote_code,
                "attn_implementation": self.config.attn_implementation,
                "code_version": CODE_VERSION,
            }
        return self._fingerprint

    @property
    def vocabulary(self) -> bool:
        return self.config.class_space == "vocabulary"

    @property
    def num_classes(self) -> int:
        if self.vocabulary:
            _ = self.location
            text = self._model_config.get("text_config") or self._model_config
            return int(text["vocab_size"])
        return len(self.config.letters)

    @property
    def planned_num_classes(self) -> int | None:
        return self.num_classes  # the letters, or the vocabulary in the config planning read

    @property
    def hidden_size(self) -> int:
        _ = self.location
        text = self._model_config.get("text_config") or self._model_config
        return int(text["hidden_size"])

    def prompts(self, split: Split, questions: list[Any]) -> list[str]:
        """Every question of ``split`` as prompt text; more choices than letters is an error."""
        letters = self.config.letters
        for number, q in enumerate(questions):
            if len(q.choices) > len(letters):
                raise EtnError(
                    f"Question {number} of {split.dataset}/{split.split} has {len(q.choices)} "
                    f"choices but letters = {list(letters)}; expected at most one choice per "
                    f"letter. {self.letters_advice(len(q.choices))}"
                )
        return [self.template.render(q.question, q.choices, letters, q.context) for q in questions]

    def manifest_extras(self, split: Split) -> dict[str, Any]:
        """The split's first prompt as the model reads it and the answer letters' token ids, so
        a manifest shows exactly what was asked (``etn status --prompt`` prints them)."""
        questions = getattr(split.data, "questions", None)
        if not questions:
            return {}
        answer = self.answer_tokens
        return {
            "example_prompt": self.prompts(split, questions[:1])[0],
            "answer_tokens": dict(zip(self.config.letters, answer.ids, strict=True)),
            "answer_token_variant": answer.variant,
        }

    def encode(self, split: Split) -> tuple[list[list[int]], torch.Tensor]:
        """Token ids of every prompt of ``split`` (cut to ``max_length`` from the left) and
        the answer labels (N,)."""
        questions = getattr(split.data, "questions", None)
        if questions is None:
            raise EtnError(
                f"hf_causal_lm reads multiple-choice questions, but dataset {split.dataset!r} "
                f"yields {type(split.data).__name__}. Use race, obqa, mmlu_* or tiny_mcqa."
            )
        prompts = self.prompts(split, questions)
        encoded = self.tokenizer(prompts)["input_ids"]
        limit = self.config.max_length
        if cut := sum(len(ids) > limit for ids in encoded):
            warnings.warn(
                f"{cut} of {len(encoded)} prompts of {split.dataset}/{split.split} exceed "
                f"max_length = {limit} tokens and lose their beginning; raise max_length to "
                "keep them whole.",
                stacklevel=2,
            )
        answers = [q.answer for q in questions]
        if self.vocabulary:  # the class is the answer letter's token id
            answers = [self.answer_tokens.ids[a] for a in answers]
        labels = torch.tensor(answers, dtype=torch.long)  # (N,)
        return [list(ids[-limit:]) for ids in encoded], labels

    def batches(
        self, split: Split, batch_size: int
    ) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]:
        """Left-padded batches of similar length, longest first (an out-of-memory error shows
        up at once); ``index`` (B,) gives each row's position in the split."""
        encoded, labels = self.encode(split)
        index = torch.as_tensor(split.index, dtype=torch.int64)  # (N,)
        order = sorted(range(len(encoded)), key=lambda i: (-len(encoded[i]), i))
        pad_id = self.tokenizer.pad_token_id
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            yield pad_left([encoded[i] for i in rows], pad_id), labels[rows], index[rows]

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, logits, _ = self.run(inputs, {})
        return hidden, logits

    def extract_batch(
        self, inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        modules = layer_modules(self.model, self.config.layers) if self.config.layers else {}
        return self.run(inputs, modules)

    @torch.inference_mode()
    def run(
        self, inputs: dict[str, torch.Tensor], modules: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``hidden`` (B, D), the ``logits`` of the class space (B, C) and each module's
        output at the last real token (B, D_l); float32 on the CPU."""
        model = self.model
        with captured_layers(modules, inputs["attention_mask"]) as layers:
            hidden = final_hidden(model, inputs)  # (B, D)
        if self.vocabulary:  # every row of lm_head, without copying it
            logits = postprocess_logits(model.get_output_embeddings()(hidden), model.config)
        else:
            logits = letter_logits(model, hidden, self.answer_tokens.ids)  # (B, C)
        return hidden.float().cpu(), logits.float().cpu(), dict(layers)

    def classifier(self) -> dict[str, torch.Tensor]:
        """lm_head's answer-letter rows ``weight`` (C, D) and ``bias`` (C,) (zeros when lm_head
        has none). ``logits == hidden @ weight.T + bias`` except for models with a final-logit
        transform (Gemma-2 soft-capping), where that transform follows."""
        head = self.model.get_output_embeddings()
        ids = range(self.num_classes) if self.vocabulary else self.answer_tokens.ids
        index = torch.as_tensor(list(ids), device=head.weight.device)
        weight = head.weight[index].detach().float().cpu().clone()  # (C, D)
        bias = getattr(head, "bias", None)
        bias = bias[index].detach().float().cpu().clone() if bias is not None else None
        return {"weight": weight, "bias": bias if bias is not None else torch.zeros(len(index))}

    def finetune(self, train: Split, settings: dict[str, Any], out_dir: Path) -> dict[str, Any]:
        """LoRA fine-tuning by cross-entropy over the answer letters (see :mod:`lora`)."""
        from etn_cli.backbones.lora import finetune_lora

        return finetune_lora(self, train, settings, Path(out_dir))

    def use_finetuned(self, out_dir: Path) -> None:
        """Use the adapter ``finetune`` wrote into ``out_dir`` (merged, like ``adapter``)."""
        if self.adapter_dir is not None:
            raise EtnError(
                "[backbone] adapter and the [finetune] stage both supply an adapter; remove one."
            )
        self.finetuned_dir = check_adapter_folder(out_dir)
        self._model = None
        self._fingerprint = None

    def letter_logits_of(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Answer-letter logits (B, C) of ``model`` with gradients (for fine-tuning)."""
        return letter_logits(model, final_hidden(model, inputs), self.answer_tokens.ids)
