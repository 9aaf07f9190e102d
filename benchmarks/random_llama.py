"""Stand-ins for Llama-3.1-8B and RACE that need no download, for benchmarks of the
``hf_causal_lm`` backbone: a Llama with random weights saved as safetensors next to a
word-level tokenizer (every word one token), and multiple-choice questions whose prompts all
have the same number of tokens.

The tokenizer splits text like Llama-3's (GPT-2 byte-level pieces, " A" -> "ĠA"), knows the
pieces of the ``default`` prompt template and the answer letters, and fills the rest of the
vocabulary with lowercase filler words ("Ġaaa", "Ġaab", ...) from which the questions are drawn.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from etn_cli.backbones.lm_forward import probe_prompt
from etn_cli.backbones.prompts import PromptTemplate
from etn_cli.datasets.mcqa_files import Question

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3; bos 1, eos 2 as in the config
LETTERS = ("A", "B", "C", "D")
QUESTION_WORDS, CHOICE_WORDS = 12, 6  # the rest of the prompt is the article (RACE-like)


@dataclass(frozen=True)
class LlamaShape:
    """The shape of a Llama; the defaults are Llama-3.1-8B's (its config.json)."""

    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0

    def config(self) -> object:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters={  # Llama-3.1's long-context RoPE scaling
                "rope_type": "llama3",
                "rope_theta": self.rope_theta,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            bos_token_id=1,
            eos_token_id=2,
            tie_word_embeddings=False,
        )


def save_random_llama(
    folder: Path, shape: LlamaShape, template: PromptTemplate, dtype: str, device: str
) -> list[str]:
    """Write a Llama of ``shape`` with random weights (initialised on ``device``, stored in
    ``dtype``) and its tokenizer into ``folder``; return the filler words."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    words = build_tokenizer(folder, shape.vocab, template)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM._from_config(shape.config(), dtype=getattr(torch, dtype))
    model.save_pretrained(str(folder))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return words


def filler_words() -> Iterator[str]:
    """Words aaa, aab, ..., zzz, aaaa, ...: letters only, so each stays one pre-token."""
    for length in itertools.count(3):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            yield "".join(letters)


def build_tokenizer(folder: Path, vocab_size: int, template: PromptTemplate) -> list[str]:
    """A word-level tokenizer of exactly ``vocab_size`` tokens saved into ``folder`` as a
    PreTrainedTokenizerFast (no pad token, like Llama-3's); return its filler words."""
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    sample = question(np.random.default_rng(0), np.array(["aaa"]), 1)
    texts = [
        probe_prompt(template, LETTERS),
        template.render(sample.question, sample.choices, LETTERS, sample.context),
        " ".join(LETTERS),
        " " + " ".join(LETTERS),
    ]
    pieces = {piece for text in texts for piece, _ in pre.pre_tokenize_str(text)}
    vocab = SPECIALS + sorted(pieces - set(SPECIALS))
    if len(vocab) >= vocab_size:
        raise SystemExit(f"--vocab must exceed the {len(vocab)} tokens of the prompt template.")
    known = set(vocab)
    words = []
    for word in filler_words():
        if len(vocab) == vocab_size:
            break
        if "Ġ" + word not in known:
            vocab.append("Ġ" + word)
            words.append(word)
    ids = {token: i for i, token in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordLevel(ids, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", ids["<s>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(folder))
    return words


def question(rng: np.random.Generator, words: np.ndarray, article_words: int) -> Question:
    """A question of :data:`QUESTION_WORDS` filler words with an article of ``article_words``
    and four choices of :data:`CHOICE_WORDS`; every word is one token."""

    def text(count: int) -> str:
        return " ".join(rng.choice(words, size=count))

    choices = tuple(text(CHOICE_WORDS) for _ in LETTERS)
    answer = int(rng.integers(len(LETTERS)))
    return Question(text(QUESTION_WORDS) + "?", choices, answer, context=text(article_words))


def fixed_length_questions(
    tokenizer: object, template: PromptTemplate, words: list[str], count: int, tokens: int
) -> list[Question]:
    """``count`` seeded questions whose prompts under ``template`` are ``tokens`` tokens long
    (BOS included): the article takes whatever the question and choices leave."""
    rng, pool = np.random.default_rng(0), np.array(words)

    def length(q: Question) -> int:
        prompt = template.render(q.question, q.choices, LETTERS, q.context)
        return len(tokenizer(prompt)["input_ids"])  # type: ignore[operator]

    shortest = length(question(rng, pool, 1))
    if tokens < shortest:
        raise SystemExit(f"--prompt-tokens must be at least {shortest} (question and choices).")
    questions = [question(rng, pool, tokens - shortest + 1) for _ in range(count)]
    prompts = [template.render(q.question, q.choices, LETTERS, q.context) for q in questions]
    lengths = {len(ids) for ids in tokenizer(prompts)["input_ids"]}  # type: ignore[operator]
    assert lengths == {tokens}, f"prompt lengths {sorted(lengths)}, expected {tokens}"
    return questions
