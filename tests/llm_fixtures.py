"""Tiny local stand-ins for Hugging Face causal LMs: a Llama and a Gemma-2 with random weights
(safetensors), word-level tokenizers built with the ``tokenizers`` library, LoRA adapters made
with peft, and small MCQA files. Everything is written to a folder given by the test."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from etn_cli.backbones.lm_forward import probe_prompt
from etn_cli.backbones.lora import peft_quietly
from etn_cli.backbones.prompts import TEMPLATES, PromptTemplate
from etn_cli.datasets import datasets

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
LETTERS = ("A", "B", "C", "D")
# answer letters the tokenizer has as single tokens: up to ten choices (CommonsenseQA has 5)
SPARE_LETTERS = tuple("ABCDEFGHIJ")
HIDDEN = 32


def corpus(letters: tuple[str, ...] = SPARE_LETTERS) -> list[str]:
    """Every prompt of tiny_mcqa / tiny_mcqa_ood under each named template, the probe prompt
    and each of ``letters`` (and A-D) in both spellings, so the word-level vocabulary covers
    them: the stand-in takes questions of up to ``len(letters)`` choices."""
    texts = [" ".join(LETTERS), " " + " ".join(LETTERS), "A.B.C.D."]
    texts += [" ".join(letters), " " + " ".join(letters), ".".join(letters)]
    for name, text in TEMPLATES.items():
        template = PromptTemplate(name, text)
        texts.append(probe_prompt(template, LETTERS))
        texts.append(probe_prompt(template, letters))
        for dataset, splits in (("tiny_mcqa", ("train", "test")), ("tiny_mcqa_ood", ("test",))):
            for split in splits:
                for q in datasets.get(dataset)().load_split(split).data.questions:
                    texts.append(template.render(q.question, q.choices, LETTERS, q.context))
    return texts


def pre_tokenizer(style: str) -> pre_tokenizers.PreTokenizer:
    """GPT-2-like byte-level pieces (Llama-3 style, " A" -> "ĠA") or SentencePiece-like
    pieces with "▁" marking a preceding space (Gemma style, " A" -> "▁A")."""
    if style == "bytelevel":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    split = pre_tokenizers.Split(Regex(r"\s*[^\s\w]|\s*\w+|\s+"), behavior="isolated")
    return pre_tokenizers.Sequence([split, pre_tokenizers.Metaspace(prepend_scheme="never")])


def build_tokenizer(
    folder: Path, style: str = "bytelevel", letters: tuple[str, ...] = SPARE_LETTERS
) -> int:
    """A word-level tokenizer over :func:`corpus`, saved as a PreTrainedTokenizerFast; returns
    the vocabulary size."""
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizer(style)
    pieces = {piece for text in corpus(letters) for piece, _ in pre.pre_tokenize_str(text)}
    vocab = {token: i for i, token in enumerate(SPECIALS + sorted(pieces - set(SPECIALS)))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre
    if style == "bytelevel":
        tokenizer.decoder = decoders.ByteLevel()
    else:
        tokenizer.decoder = decoders.Metaspace(prepend_scheme="never")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>" if style == "metaspace" else None,  # Llama-3 has no pad token
    )
    fast.save_pretrained(str(folder))
    return len(vocab)


def make_llama(
    folder: Path, *, seed: int = 0, hidden: int = HIDDEN, letters: tuple[str, ...] = SPARE_LETTERS
) -> Path:
    """A 2-layer Llama with random weights and untied lm_head, plus its tokenizer, which has
    each of ``letters`` as one token (answer letters for up to that many choices)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = build_tokenizer(folder, "bytelevel", letters)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,  # letter logits of a few units, so their softmax is not flat
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return save_model(LlamaForCausalLM, config, folder, seed)


def make_gemma2(folder: Path, *, seed: int = 0, softcap: float = 3.0) -> Path:
    """A 2-layer Gemma-2 with final-logit soft-capping, a sliding window and tied embeddings."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    vocab = build_tokenizer(folder, "metaspace")
    config = Gemma2Config(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=8,
        final_logit_softcapping=softcap,
        max_position_embeddings=512,
        initializer_range=0.3,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return save_model(Gemma2ForCausalLM, config, folder, seed)


def save_model(cls: type, config: object, folder: Path, seed: int) -> Path:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config).eval()
    model.save_pretrained(str(folder))
    assert (folder / "model.safetensors").is_file()
    return folder


def make_adapter(model_folder: Path, out: Path, *, seed: int = 0, rank: int = 4) -> Path:
    """A peft LoRA adapter on the attention projections with random (nonzero) A and B."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(model_folder), dtype=torch.float32)
        config = LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            init_lora_weights=False,
        )
        with peft_quietly():
            get_peft_model(model, config).save_pretrained(str(out))
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
