"""``mcqa_jsonl``: your own multiple-choice questions, one file per split.

A split is named by its file under ``[data] root``::

    [data]
    id = "mcqa_jsonl"
    root = "questions"                    # relative to the pipeline file
    adapt = "adapt.jsonl"
    test = "test.csv"
    ood = ["mcqa_jsonl:other.parquet"]

One question per JSONL line, CSV row (with a header) or Parquet row: ``question``, the choices
as a ``choices`` list or as one column per choice (``A``, ``B``, ``C``, ... as many as the
question has), ``answer`` (a letter or a 0-based index), optional ``context`` and ``id``; the
native RACE, OpenBookQA and MMLU fields are read too (:mod:`etn_cli.datasets.mcqa_files`). A
question may have any number of choices from two up to the backbone's ``letters``; the prompt
lists the ones it has. An OOD file may leave ``answer`` out of every record (label -1).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.datasets.base import DatasetSource, PathSplits, Split, datasets
from etn_cli.datasets.mcqa import QuestionSet
from etn_cli.datasets.mcqa_files import (
    Question,
    csv_with_header,
    parse_record,
    read_records,
)
from etn_cli.datasets.settings import refuse_options
from etn_cli.errors import EtnError
from etn_cli.store.fingerprint import file_sha256

READER_VERSION = 1
SUFFIXES = (".jsonl", ".csv", ".parquet")
ANSWER_KEYS = ("answer", "answerKey", "answers")


def records(path: Path) -> list[tuple[dict[str, Any], str]]:
    """The file's records; a CSV file's first row names its columns."""
    return list(csv_with_header(path) if path.suffix == ".csv" else read_records(path))


@functools.cache
def read_question_file(path: Path, stamp: int) -> tuple[list[Question], bool]:
    """``(questions, labelled)``: every question of ``path`` (``stamp``: its mtime, so an edit
    is read again). Either every record has an answer or none has (label -1)."""
    found = records(path)
    answered = [isinstance(r, dict) and any(r.get(k) is not None for k in ANSWER_KEYS)
                for r, _ in found]  # fmt: skip
    if any(answered) and not all(answered):
        where = found[answered.index(False)][1]
        raise EtnError(
            f"{where}: no 'answer', while other questions of {path.name} have one; expected an "
            "answer in every record (or in none, for an unlabelled OOD file)."
        )
    labelled = all(answered)
    questions = []
    for raw, where in found:
        parsed = parse_record(raw if labelled else {**raw, "answer": 0}, where)
        questions += parsed if labelled else [dataclasses.replace(q, answer=-1) for q in parsed]
    if not questions:
        raise EtnError(f"{path} holds no questions; expected one question per line or row.")
    return questions, labelled


@datasets.register("mcqa_jsonl")
class MCQAFile(PathSplits, DatasetSource):
    """Your own multiple-choice questions: a split is a ``.jsonl``, ``.csv`` (with a header)
    or ``.parquet`` file under the root (see the module docstring)."""

    name = "mcqa_jsonl"
    splits = ()  # any file under the root; :meth:`available` lists the top level

    def __init__(self, root: str | None = None, **options: Any) -> None:
        refuse_options(self.name, "mcqa_jsonl", options)
        super().__init__(root)

    def available(self) -> tuple[str, ...]:
        root = self.root_path()
        found = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES) if root.is_dir() else []
        return tuple(p.relative_to(root).as_posix() for p in found)

    def has_split(self, split: str) -> bool:
        target = self.inside_root(split)
        return target is not None and target.is_file() and target.suffix in SUFFIXES

    def path(self, split: str) -> Path:
        if not self.has_split(split):
            shown = ", ".join(self.available()) or "no such files"
            raise EtnError(
                f"Dataset 'mcqa_jsonl' has no split {split!r}: expected a {'/'.join(SUFFIXES)} "
                f"file at {self.root_path() / split}. Under [data] root there are: {shown}."
            )
        return (self.root_path() / split).resolve()

    def questions(self, split: str) -> tuple[list[Question], bool]:
        path = self.path(split)
        return read_question_file(path, path.stat().st_mtime_ns)

    def split_fingerprint(self, split: str) -> dict[str, Any]:
        questions, labelled = self.questions(split)
        counts = [len(q.choices) for q in questions]
        return {
            "dataset": self.name,
            "split": split,
            "file": split,
            "sha256": file_sha256(self.path(split)),
            "questions": len(questions),
            "labelled": labelled,
            "min_choices": min(counts),
            "max_choices": max(counts),
            "reader_version": READER_VERSION,
        }

    def load_split(self, split: str) -> Split:
        questions, _ = self.questions(split)
        index = np.arange(len(questions), dtype=np.int64)
        most = max(len(q.choices) for q in questions)
        fp = self.split_fingerprint(split)
        return Split(self.name, split, QuestionSet(questions), index, most, fp)
