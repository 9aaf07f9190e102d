"""No malformed input crashes etn (issue 31.5): seeded corruptions of every format a user hands
etn (feature files as .npz, their .npy members and .safetensors; question files as JSONL, CSV
and Parquet; PNG and JPEG images; image lists; a shard folder's manifest.json), each run through
the command that reads it. Every case must be accepted or refused in one line with exit status
2 and nothing written (:mod:`fuzz_inputs`). The default sample is small; ``-m slow`` runs 40
seeded corruptions more per format."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_inputs import HELD, Case, run_case, sample
from llm_fixtures import make_llama

DEFAULT = sample(per_format=2, seed=0)
LARGER = [case for case in sample(per_format=40, seed=1) if case.seed]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("llama"))


def check(case: Case, tmp_path: Path, llama: Path) -> None:
    verdict, detail = run_case(case, tmp_path, llama)
    assert verdict in HELD, f"{case}: {verdict}: {detail}"


@pytest.mark.parametrize("case", DEFAULT, ids=str)
def test_a_corrupted_input_is_accepted_or_refused_in_one_line(case, tmp_path, llama) -> None:
    check(case, tmp_path, llama)


@pytest.mark.slow
@pytest.mark.parametrize("case", LARGER, ids=str)
def test_a_larger_sample_of_corrupted_inputs_holds(case, tmp_path, llama) -> None:
    check(case, tmp_path, llama)


def test_the_sample_covers_every_user_facing_format() -> None:
    formats = {case.fmt for case in DEFAULT}
    assert formats == {
        "npz", "npy", "safetensors", "h5", "parquet", "metrics parquet", "jsonl", "csv", "png",
        "jpeg", "image list", "manifest.json",
    }  # fmt: skip
