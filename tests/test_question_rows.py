"""A part of a question split stays a question split: the language model reads its prompts
from ``questions``, so a seeded sample (``fit_rows``) or a held-out calibration part
(``[conformal]``) must not become an opaque ``Subset``."""

from __future__ import annotations

import numpy as np

from etn_cli.datasets.base import datasets, held_out, select_rows, subsample


def test_held_out_and_sampled_questions_keep_their_questions_and_answers() -> None:
    split = datasets.get("tiny_mcqa")().load_split("train")
    held = held_out(len(split), 0.25, 0)
    part = select_rows(split, np.flatnonzero(held))
    assert [q.id for q in part.data.questions] == [
        split.data.questions[i].id for i in np.flatnonzero(held)
    ]
    np.testing.assert_array_equal(part.data.labels, split.data.labels[held])
    np.testing.assert_array_equal(part.index, split.index[held])
    sample = subsample(split, 10, seed=3)
    assert len(sample.data.questions) == 10 == len(sample.index)
    assert [q.answer for q in sample.data.questions] == [
        split.data.questions[i].answer for i in sample.index
    ]
