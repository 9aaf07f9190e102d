"""The causal-LM computations behind ``hf_causal_lm``: answer tokens, left-padded batches, the
final hidden state at the last real token and the answer-letter logits.

For a prompt ``x`` with last real token at position ``t`` the backbone returns

    h = norm(decoder(x))[t]                      # (D,) the input of lm_head
    z = post(W[ids] h + b[ids])                  # (C,) the answer-letter logits

where ``W``, ``b`` are lm_head's weight and bias, ``ids`` the answer-letter token ids and
``post`` the model's own final-logit transform: Gemma-2's soft-capping
``s * tanh(z / s)`` (``final_logit_softcapping = s``), Cohere's ``logit_scale`` factor or
Granite's ``logits_scaling`` divisor. ``z`` equals the full forward's logits at ``t``
restricted to ``ids``, yet the vocabulary-sized logits are never computed; the equality is
checked once per loaded model on a probe prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from etn_cli.backbones.prompts import PromptTemplate
from etn_cli.errors import EtnError

PROBE_QUESTION = "Which of the following choices is the correct one?"


@dataclass(frozen=True)
class AnswerTokens:
    """The answer letters as the tokenizer sees them right after the prompt."""

    variant: str  # "space" (" A", word-initial) or "bare" ("A")
    texts: tuple[str, ...]
    ids: tuple[int, ...]


def probe_prompt(template: PromptTemplate, letters: Sequence[str]) -> str:
    choices = [f"option {k + 1}" for k in range(len(letters))]
    return template.render(PROBE_QUESTION, choices, letters)


def find_answer_tokens(
    tokenizer: Any, prompt: str, letters: Sequence[str], fix: str | None = None
) -> AnswerTokens:
    """The first variant (" A" unless the prompt ends in whitespace, then "A") for which every
    letter appended to ``prompt`` adds exactly one known token that decodes back to it;
    otherwise one line naming the letters that are not, ending with ``fix`` (what to do)."""
    base = tokenizer(prompt)["input_ids"]
    order = ("bare", "space") if prompt[-1:].isspace() else ("space", "bare")
    problems = []
    for variant in order:
        texts = tuple((" " if variant == "space" else "") + letter for letter in letters)
        ids = [appended_token(tokenizer, prompt, base, text) for text in texts]
        if all(i is not None for i in ids) and len(set(ids)) == len(ids):
            return AnswerTokens(variant, texts, tuple(ids))  # type: ignore[arg-type]
        bad = [repr(t) for t, i in zip(texts, ids, strict=True) if i is None]
        problems.append(f"{variant}: {', '.join(bad) or 'letters share a token'}")
    fix = fix or (
        "Use letters the tokenizer has as one token each, or change the end of prompt_template."
    )
    raise EtnError(
        f"Answer letters {list(letters)} are not single tokens after the prompt "
        f"({'; '.join(problems)}). {fix}"
    )


def letter_sets(letters: Sequence[str], count: int) -> list[tuple[str, ...]]:
    """Sets of ``count`` answer letters to try, the pipeline's own first (cut or continued in
    the alphabet), then A, B, C…, a, b, c… and 1, 2, 3…"""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    own = tuple(letters)[:count]
    if len(own) < count and "".join(own) == alphabet[: len(own)]:
        own = tuple(alphabet[:count])
    sets = [own] if len(own) == count else []
    sets += [tuple(alphabet[:count]), tuple(alphabet.lower()[:count])]
    sets += [tuple(str(k) for k in range(1, count + 1))] if count <= 9 else []
    return list(dict.fromkeys(sets))


def single_token_letters(
    tokenizer: Any, template: PromptTemplate, letters: Sequence[str], count: int
) -> tuple[str, ...] | None:
    """The first of :func:`letter_sets` whose ``count`` letters are each one token after the
    probe prompt, or None when this tokenizer has none of them."""
    for candidate in letter_sets(letters, count):
        try:
            find_answer_tokens(tokenizer, probe_prompt(template, candidate), candidate)
        except EtnError:
            continue
        return candidate
    return None


def letters_advice(
    tokenizer: Any, template: PromptTemplate, letters: Sequence[str], count: int
) -> str:
    """The one thing that works for questions of up to ``count`` choices: a set of ``count``
    single-token letters (``letters = [...]`` in [backbone]), else the most letters the
    tokenizer has and leaving out the questions with more choices."""
    found = single_token_letters(tokenizer, template, letters, count)
    if found is not None:
        return f"Set letters = {list(found)} in [backbone]: each is one token here."
    tried = ", ".join(f"{s[0]}-{s[-1]}" for s in letter_sets(letters, count))
    for most in range(count - 1, 1, -1):
        usable = single_token_letters(tokenizer, template, letters, most)
        if usable is not None:
            return (
                f"This tokenizer has no {count} single-token answer letters (tried {tried}) but "
                f"has {most}: set letters = {list(usable)} and leave out the questions with more "
                f"than {most} choices, or use another model."
            )
    return f"No {count} answer letters are one token each here (tried {tried}): use another model."


def appended_token(tokenizer: Any, prompt: str, base: list[int], text: str) -> int | None:
    ids = tokenizer(prompt + text)["input_ids"]
    if len(ids) != len(base) + 1 or ids[: len(base)] != base:
        return None
    token = ids[-1]
    if token == tokenizer.unk_token_id or tokenizer.decode([token]).strip() != text.strip():
        return None
    return token


def pad_left(sequences: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` (B, L), real tokens at the right end."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token per row (B,), for any padding side."""
    width = mask.shape[1]
    return width - 1 - mask.flip(-1).argmax(-1)


def final_hidden(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The decoder's normed output at each row's last real token (B, D), in the model dtype.

    Position ids count real tokens only, so a left-padded prompt sees the same positions as
    when it runs alone (batched == unbatched)."""
    device = model.get_output_embeddings().weight.device
    ids = batch["input_ids"].to(device)  # (B, L)
    mask = batch["attention_mask"].to(device)  # (B, L)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
    out = model.get_decoder()(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
    )
    rows = torch.arange(len(ids), device=device)
    return out.last_hidden_state[rows, last_positions(mask)]  # (B, D)


def letter_logits(model: Any, hidden: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """lm_head's answer-letter rows applied to ``hidden`` (B, D), then the model's own
    final-logit transform (see module docstring) -> (B, C)."""
    head = model.get_output_embeddings()
    index = torch.as_tensor(list(ids), device=head.weight.device)
    bias = head.bias[index] if getattr(head, "bias", None) is not None else None
    return postprocess_logits(F.linear(hidden, head.weight[index], bias), model.config)


def postprocess_logits(z: torch.Tensor, config: Any) -> torch.Tensor:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "logit_scale", None) is not None:  # Cohere
        z = z * text.logit_scale
    if getattr(text, "logits_scaling", None) is not None:  # Granite
        z = z / text.logits_scaling
    cap = getattr(text, "final_logit_softcapping", None)
    if cap:  # Gemma-2: z = s * tanh(z / s)
        z = cap * torch.tanh(z / cap)
    return z


def check_letter_logits(model: Any, tokenizer: Any, prompt: str, ids: Sequence[int]) -> None:
    """Compare :func:`letter_logits` with the model's full forward on ``prompt``; a mismatch
    means the architecture transforms its logits in a way etn does not reproduce."""
    batch = pad_left([tokenizer(prompt)["input_ids"]], 0)  # one prompt: nothing is padded
    device = model.get_output_embeddings().weight.device
    with torch.inference_mode():
        ours = letter_logits(model, final_hidden(model, batch), ids).float()  # (1, C)
        full = model(**{k: v.to(device) for k, v in batch.items()}, use_cache=False).logits
        theirs = full[:, -1, list(ids)].float()  # (1, C)
    scale = 1.0 + theirs.abs().max().item()
    tolerance = (1e-4 if full.dtype == torch.float32 else 3e-2) * scale
    if (ours - theirs).abs().max().item() > tolerance:
        raise EtnError(
            f"The answer-letter logits of {type(model).__name__} differ from its own forward "
            f"pass ({ours.tolist()} vs {theirs.tolist()}); its lm_head output is transformed in "
            "a way etn does not reproduce. Please report the architecture."
        )


@contextmanager
def captured_layers(
    modules: dict[str, Any], mask: torch.Tensor
) -> Iterator[dict[str, torch.Tensor]]:
    """Record each named module's output at the last real token of each row (B, D_l) during
    the forward passes inside the block; only those rows are kept, never (B, L, D_l)."""
    outputs: dict[str, torch.Tensor] = {}
    last = last_positions(mask)  # (B,)

    def hook(name: str):
        def record(_module: Any, _inputs: Any, output: Any) -> None:
            states = output[0] if isinstance(output, tuple) else output  # (B, L, D_l)
            rows = torch.arange(len(states), device=states.device)
            outputs[name] = states[rows, last.to(states.device)].float().cpu()

        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in modules.items()]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def layer_modules(model: Any, spec: Sequence[int | str]) -> dict[str, Any]:
    """Decoder layers by index (``3``, ``-1``), every layer (``"all"``) or submodule name of
    the decoder (``"layers.3.mlp"``), keyed by the name stored as ``layers/<name>``."""
    decoder = model.get_decoder()
    blocks = getattr(decoder, "layers", None)
    if blocks is None:
        raise EtnError(f"{type(decoder).__name__} has no .layers; name submodules instead.")
    found: dict[str, Any] = {}
    for item in spec:
        if item == "all":
            found.update({f"layer{i}": block for i, block in enumerate(blocks)})
        elif isinstance(item, int):
            if not -len(blocks) <= item < len(blocks):
                raise EtnError(
                    f"layers entry {item} is out of range: the model has {len(blocks)} decoder "
                    f"layers (0..{len(blocks) - 1}, or negative from the end). Fix layers."
                )
            found[f"layer{item % len(blocks)}"] = blocks[item]
        else:
            try:
                found[item] = decoder.get_submodule(item)
            except AttributeError:
                raise EtnError(
                    f"layers entry {item!r} names no submodule of {type(decoder).__name__}; "
                    "use layer indices, 'all', or names such as 'layers.0.mlp'."
                ) from None
    return found
