"""Prompt templates for multiple-choice QA: the one place where a question becomes LLM input.

A template is a Python format string with the fields ``{question}``, ``{choices}`` (one line
per answer choice, ``choice_line`` = ``"{letter}. {text}"`` by default), ``{context}`` (the
passage, e.g. a RACE article; empty when there is none) and ``{context_block}``
(``"Article: <context>\\n\\n"``, or empty). A question with fewer choices than letters lists the
first letters only.

The prompt must end where the answer letter follows: the backbone reads the next-token logits
of the answer letters at the prompt's last token (paper, "LLM Datasets": the output space is
restricted to the answer tokens A-D, following Yang et al. 2024 and Li et al. 2025).

``[backbone] prompt_template`` in a pipeline file is either a name from :data:`TEMPLATES` or a
format string of its own, and ``choice_line`` formats each choice; the full texts go into the
feature fingerprint, so changing either re-extracts.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from etn_cli.errors import EtnError

TEMPLATES = {
    "default": "{context_block}Question: {question}\n{choices}\nAnswer:",
    "instruction": (
        "The following is a multiple-choice question. Answer with the letter of the correct "
        "choice.\n\n{context_block}Question: {question}\n{choices}\nAnswer:"
    ),
}
CONTEXT_BLOCK = "Article: {context}\n\n"
CHOICE_LINE = "{letter}. {text}"
FIELDS = ("question", "choices", "context", "context_block")
REQUIRED = ("question", "choices")


@dataclass(frozen=True)
class PromptTemplate:
    """A named format string; :meth:`render` turns one question into the prompt text."""

    name: str
    text: str
    choice_line: str = CHOICE_LINE

    def render(
        self, question: str, choices: Sequence[str], letters: Sequence[str], context: str = ""
    ) -> str:
        if len(choices) > len(letters):
            raise EtnError(
                f"A question has {len(choices)} choices but the letters are {list(letters)}; "
                "expected at most one choice per letter. Add letters in [backbone]."
            )
        lines = "\n".join(
            self.choice_line.format(letter=letter, text=text)
            for letter, text in zip(letters, choices, strict=False)
        )
        block = CONTEXT_BLOCK.format(context=context) if context else ""
        return self.text.format(
            question=question, choices=lines, context=context, context_block=block
        )

    def fingerprint(self) -> dict[str, str]:
        """Everything that shapes the prompt text; goes into the backbone's fingerprint."""
        return {
            "name": self.name,
            "text": self.text,
            "choice_line": self.choice_line,
            "context_block": CONTEXT_BLOCK,
        }


def resolve_template(value: str, choice_line: str = CHOICE_LINE) -> PromptTemplate:
    """A template by name (``default``, ``instruction``) or a format string with the fields of
    :data:`FIELDS`, and the format of one choice line; anything else is an :class:`EtnError`
    naming the choices."""
    check_choice_line(choice_line)
    if value in TEMPLATES:
        return PromptTemplate(value, TEMPLATES[value], choice_line)
    if "{" not in value:
        raise EtnError(
            f"Unknown prompt template {value!r}. Use one of {', '.join(TEMPLATES)} or a format "
            "string with {question} and {choices}, e.g. "
            '"Question: {question}\\n{choices}\\nAnswer:".'
        )
    try:
        used = {field for _, field, _, _ in string.Formatter().parse(value) if field is not None}
    except ValueError as err:
        raise EtnError(
            f"Prompt template {value!r} is not a valid format string ({err}). "
            "Write literal braces as {{ and }}."
        ) from None
    unknown = sorted(used - set(FIELDS))
    missing = [field for field in REQUIRED if field not in used]
    if unknown or missing:
        raise EtnError(
            f"Prompt template {value!r} uses fields {sorted(used)}; expected "
            f"{{question}} and {{choices}}, optionally {{context}} or {{context_block}} "
            f"(unknown: {unknown}, missing: {missing}). Fix prompt_template in [backbone]."
        )
    return PromptTemplate("custom", value, choice_line)


def check_choice_line(value: str) -> None:
    """``choice_line`` must be a format string with ``{letter}`` and ``{text}`` only."""
    try:
        used = {field for _, field, _, _ in string.Formatter().parse(value) if field is not None}
    except ValueError:
        used = set()
    if used != {"letter", "text"}:
        raise EtnError(
            f"choice_line = {value!r} must be a format string with the fields {{letter}} and "
            '{text} (and no others), e.g. "{letter}. {text}" or "({letter}) {text}".'
        )
