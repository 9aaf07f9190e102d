"""``tiny_mcqa`` and ``tiny_mcqa_ood``: seeded synthetic multiple-choice questions for tests and
demos of the LLM path without any download.

``tiny_mcqa`` asks for the sum of two digits ("What is 3 plus 4?") with the right sum and three
other sums as choices; ``tiny_mcqa_ood`` asks which of four words comes first in the alphabet,
a different task with a different vocabulary. The answer position is uniform over A-D. Each
split has its own seed, so the splits are different draws of the same generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from etn_cli.datasets.base import DatasetSource, Split, datasets
from etn_cli.datasets.mcqa import NUM_CHOICES, QuestionSet
from etn_cli.datasets.mcqa_files import Question
from etn_cli.datasets.settings import refuse_options
from etn_cli.errors import EtnError

GENERATOR_VERSION = 1
SIZES = {"train": 96, "validation": 64, "test": 64}
SEEDS = {"train": 0, "validation": 1, "test": 2}
OOD_SIZE, OOD_SEED = 64, 3
WORDS = (
    "apple", "bread", "cloud", "dance", "eagle", "flame", "grape", "house",
    "island", "jelly", "kite", "lemon", "music", "night", "ocean", "piano",
)  # fmt: skip


def sum_question(rng: np.random.Generator, number: int) -> Question:
    """Ask "What is a plus b?" with the true sum and three distinct wrong sums in random order."""
    a, b = (int(v) for v in rng.integers(0, 10, size=2))
    wrong = rng.choice([s for s in range(19) if s != a + b], size=NUM_CHOICES - 1, replace=False)
    choices = [a + b, *(int(s) for s in wrong)]
    order = rng.permutation(NUM_CHOICES)
    texts = tuple(str(choices[k]) for k in order)
    answer = int(np.flatnonzero(order == 0)[0])
    return Question(f"What is {a} plus {b}?", texts, answer, id=f"sum-{number}")


def alphabet_question(rng: np.random.Generator, number: int) -> Question:
    """Ask "Which word comes first in the alphabet?" of four distinct words."""
    picked = tuple(str(w) for w in rng.choice(WORDS, size=NUM_CHOICES, replace=False))
    answer = picked.index(min(picked))
    return Question("Which word comes first in the alphabet?", picked, answer, id=f"abc-{number}")


class TinySource(DatasetSource):
    """Shared checks of the two synthetic sources."""

    def __init__(self, root: str | None = None, **options: Any) -> None:
        refuse_options(self.name, "tiny_mcqa", options)
        super().__init__(root)

    def load_split(self, split: str) -> Split:
        if split not in self.splits:
            raise EtnError(
                f"Dataset {self.name!r} has no split {split!r}. "
                f"Available splits: {', '.join(self.splits)}. Use one of them."
            )
        questions, seed = self.generate(split)
        fp = {
            "dataset": self.name,
            "split": split,
            "generator_version": GENERATOR_VERSION,
            "seed": seed,
            "rows": len(questions),
        }
        index = np.arange(len(questions), dtype=np.int64)
        return Split(self.name, split, QuestionSet(questions), index, NUM_CHOICES, fp)

    def generate(self, split: str) -> tuple[list[Question], int]:
        raise NotImplementedError


@datasets.register("tiny_mcqa")
class TinyMCQA(TinySource):
    """Synthetic in-distribution questions: sums of two digits."""

    name = "tiny_mcqa"
    splits = ("train", "validation", "test")

    def generate(self, split: str) -> tuple[list[Question], int]:
        rng = np.random.default_rng(SEEDS[split])
        return [sum_question(rng, n) for n in range(SIZES[split])], SEEDS[split]


@datasets.register("tiny_mcqa_ood")
class TinyMCQAOOD(TinySource):
    """Synthetic OOD questions: the alphabetically first of four words."""

    name = "tiny_mcqa_ood"
    splits = ("test",)

    def generate(self, split: str) -> tuple[list[Question], int]:
        rng = np.random.default_rng(OOD_SEED)
        return [alphabet_question(rng, n) for n in range(OOD_SIZE)], OOD_SEED
