"""Reading multiple-choice questions from JSONL, Parquet and MMLU's original CSV files.

One record is one question in etn's schema::

    {"question": "...", "choices": ["...", "...", "...", "..."], "answer": "B",
     "context": "optional passage", "id": "optional"}

``answer`` is a letter (A, B, ...) or a 0-based index (also as text, as a CSV cell holds it).
The native field names of the sources are read too: RACE (``article``, ``options``,
``answer``, ``example_id``; an original per-article record with ``questions`` / ``options`` /
``answers`` lists becomes one question each), OpenBookQA (``question_stem``, ``choices =
{"text": [...], "label": [...]}``, ``answerKey``; the original release's ``question =
{"stem", "choices": [{"text", "label"}]}``) and MMLU (``question``, ``choices``, integer
``answer``; the original header-less CSV rows
``question, A, B, C, D, answer``).
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etn_cli.errors import EtnError

LETTERS = tuple(string.ascii_uppercase)
SUFFIXES = (".jsonl", ".parquet", ".csv")
FIX = "Fix the record or see docs/own-data.md ('Multiple-choice questions')."


@dataclass(frozen=True)
class Question:
    """One multiple-choice question; ``answer`` is the 0-based index of the correct choice."""

    question: str
    choices: tuple[str, ...]
    answer: int
    context: str = ""
    id: str = ""


def read_questions(path: Path, num_choices: int) -> list[Question]:
    """Every question in one file, checked to have ``num_choices`` choices."""
    questions = []
    for raw, where in read_records(path):
        for question in parse_record(raw, where):
            if len(question.choices) != num_choices:
                raise EtnError(
                    f"{where}: expected {num_choices} answer choices, found "
                    f"{len(question.choices)}. {FIX}"
                )
            questions.append(question)
    return questions


def read_records(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """``(record, where)`` pairs of a ``.jsonl``, ``.parquet`` or MMLU ``.csv`` file."""
    if path.suffix == ".jsonl":
        yield from _jsonl(path)
    elif path.suffix == ".parquet":
        yield from _parquet(path)
    elif path.suffix == ".csv":
        yield from _mmlu_csv(path)
    else:
        raise EtnError(f"Expected a {', '.join(SUFFIXES)} file, got {path}. Convert it.")


def _jsonl(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    with text_lines(path) as lines:
        for number, line in lines:
            if not line.strip():
                continue
            try:
                yield json.loads(line), f"{path}:{number}"
            except json.JSONDecodeError as err:
                raise EtnError(
                    f"{path}:{number} is not valid JSON ({err.msg}); expected one JSON object "
                    "per line. Fix or regenerate the file."
                ) from None
            except RecursionError:
                raise EtnError(
                    f"{path}:{number} nests its JSON deeper than Python reads; expected one "
                    "question record per line. Fix or regenerate the file."
                ) from None


@contextlib.contextmanager
def text_lines(path: Path, newline: str | None = None) -> Iterator[Iterator[tuple[int, str]]]:
    """``(number, line)`` of a UTF-8 text file; a byte that is not UTF-8, or a CSV cell the
    ``csv`` module refuses, is one line naming the file and the line."""
    numbered: list[int] = [0]

    def lines(handle: Any) -> Iterator[tuple[int, str]]:
        for numbered[0], line in enumerate(handle, start=1):
            yield numbered[0], line

    try:
        with open(path, encoding="utf-8", newline=newline) as handle:
            yield lines(handle)
    except UnicodeDecodeError as err:
        raise EtnError(
            f"{path}:{numbered[0] + 1} is not UTF-8 text (byte {err.object[err.start]:#04x}); "
            "expected a UTF-8 file. Convert it, e.g. iconv -f latin1 -t utf-8."
        ) from None
    except csv.Error as err:
        raise EtnError(
            f"{path}:{numbered[0]} is not a CSV row etn can read ({err}). Fix the file."
        ) from None


def _parquet(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    from etn_cli.store.reading.parquet import read_parquet_checked

    rows = read_parquet_checked(path, "Re-download or regenerate it.").to_dicts()
    for number, row in enumerate(rows):
        yield row, f"{path} row {number}"


def csv_with_header(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """A CSV file whose first row names the columns (``question``, ``A``, ``B``, ...)."""
    with text_lines(path, newline="") as lines:
        reader = csv.DictReader(line for _, line in lines)
        for number, row in enumerate(reader, start=2):
            yield {k: (v if v != "" else None) for k, v in row.items() if k}, f"{path}:{number}"


def _mmlu_csv(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """MMLU's original release: no header, six columns per row."""
    with text_lines(path, newline="") as lines:
        for number, row in enumerate(csv.reader(line for _, line in lines), start=1):
            if len(row) != 6:
                raise EtnError(
                    f"{path}:{number} has {len(row)} columns; expected MMLU's six "
                    "(question, A, B, C, D, answer). Use the original MMLU CSV files."
                )
            yield {"question": row[0], "choices": row[1:5], "answer": row[5]}, f"{path}:{number}"


def parse_record(raw: Any, where: str) -> list[Question]:
    """Turn one record in etn's schema or a native one (see module docstring) into questions."""
    if not isinstance(raw, dict):
        raise EtnError(f"{where}: expected a JSON object, got {type(raw).__name__}. {FIX}")
    if isinstance(raw.get("questions"), list):
        return _race_article(raw, where)
    stem, choices, labels = _question_and_choices(raw, where)
    key = next((k for k in ("answer", "answerKey") if raw.get(k) is not None), None)
    if key is None:
        raise EtnError(f"{where}: no 'answer' (or 'answerKey') field. {FIX}")
    return [
        Question(
            question=stem,
            choices=choices,
            answer=answer_index(raw[key], labels, len(choices), where),
            context=_text(raw.get("context") or raw.get("article") or "", "context", where),
            id=str(raw.get("id", raw.get("example_id", ""))),
        )
    ]


def _question_and_choices(
    raw: dict[str, Any], where: str
) -> tuple[str, tuple[str, ...], list[str] | None]:
    question = raw.get("question", raw.get("question_stem"))
    choices = raw.get("choices", raw.get("options"))
    if isinstance(question, dict):  # the original OpenBookQA release
        question, choices = question.get("stem"), question.get("choices")
    if choices is None:  # one column per choice: A, B, C, ... (as many as the record has)
        columns = list(itertools.takewhile(lambda letter: raw.get(letter) is not None, LETTERS))
        choices = [raw[letter] for letter in columns] if len(columns) >= 2 else None
    texts, labels = _choices(choices, where)
    return _text(question, "question", where), texts, labels


def _choices(value: Any, where: str) -> tuple[tuple[str, ...], list[str] | None]:
    """Choice texts and, where the record labels them, their labels."""
    if isinstance(value, dict) and "text" in value:  # {"text": [...], "label": [...]}
        texts, labels = value["text"], value.get("label")
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        texts, labels = [v.get("text") for v in value], [v.get("label") for v in value]
    else:
        texts, labels = value, None
    if not isinstance(texts, list) or len(texts) < 2:
        raise EtnError(
            f"{where}: expected 'choices' (or 'options') as a list of answer texts, got "
            f"{value!r:.80}. {FIX}"
        )
    if labels is not None and (not isinstance(labels, list) or len(labels) != len(texts)):
        raise EtnError(f"{where}: choice labels {labels!r} do not match the texts. {FIX}")
    return tuple(_text(t, "choice", where) for t in texts), labels


def answer_index(value: Any, labels: list[str] | None, count: int, where: str) -> int:
    """The 0-based index of the answer given as a letter, a choice label or an index; an
    index may be written as text (a CSV cell: ``"0"``) unless that text is a choice label."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count:
        return value
    if isinstance(value, str):
        key = value.strip()
        names = [str(label) for label in labels] if labels else list(LETTERS[:count])
        if key in names:
            return names.index(key)
        if key.isascii() and key.isdigit() and int(key) < count:
            return int(key)
    raise EtnError(
        f"{where}: answer {value!r} is not one of the letters {', '.join(LETTERS[:count])} or "
        f"an index 0..{count - 1}. {FIX}"
    )


def _race_article(raw: dict[str, Any], where: str) -> list[Question]:
    """An original RACE file: one article with parallel question, option and answer lists."""
    questions, options, answers = raw["questions"], raw.get("options"), raw.get("answers")
    if not (isinstance(options, list) and isinstance(answers, list)) or not (
        len(questions) == len(options) == len(answers)
    ):
        raise EtnError(
            f"{where}: a RACE article needs 'questions', 'options' and 'answers' lists of the "
            f"same length. {FIX}"
        )
    article = _text(raw.get("article", ""), "article", where)
    ident = str(raw.get("id", ""))
    parsed = []
    for k, (stem, choices, answer) in enumerate(zip(questions, options, answers, strict=True)):
        texts, _ = _choices(choices, f"{where} question {k}")
        index = answer_index(answer, None, len(texts), f"{where} question {k}")
        stem = _text(stem, "question", f"{where} question {k}")
        parsed.append(Question(stem, texts, index, article, f"{ident}#{k}" if ident else ""))
    return parsed


def _text(value: Any, field: str, where: str) -> str:
    if not isinstance(value, str):
        raise EtnError(f"{where}: expected {field} text, got {value!r:.80}. {FIX}")
    return value
