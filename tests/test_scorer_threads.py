"""The threads the post-hoc scorers run on: torch's own pool only, never raised above the
user's setting and always given back (issue 40, item 4: no oversubscription in etn's blocks).
Speed under load is measured by ``benchmarks/bench_scorers.py --conditions``, not here."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from etn_cli.heads import heads
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.threads import one_thread
from tests.scorer_data import make_scorer_data

SCORERS = sorted(n for n in heads.names() if issubclass(heads.get(n), Scorer))
HEADS_DIR = Path(__file__).resolve().parents[1] / "etn_cli" / "heads"


@pytest.fixture(scope="module")
def data():
    return make_scorer_data()


@pytest.fixture
def two_threads():
    """torch at two intra-op threads for the test, the caller's setting restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def settings_seen(monkeypatch):
    """Every value given to ``torch.set_num_threads`` while the test runs."""
    seen: list[int] = []
    real = torch.set_num_threads

    def recording(count: int) -> None:
        seen.append(count)
        real(count)

    monkeypatch.setattr(torch, "set_num_threads", recording)
    return seen


def test_one_thread_runs_on_one_and_gives_the_setting_back(two_threads, settings_seen):
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="inside"), one_thread():
        raise ValueError("inside")
    assert torch.get_num_threads() == 2
    assert settings_seen == [1, 2, 1, 2]


def test_one_thread_leaves_a_single_thread_alone(settings_seen):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert settings_seen == [1, before]  # only the test's own calls


@pytest.mark.parametrize("name", SCORERS)
def test_every_scorer_keeps_torchs_threads_and_starts_none(name, data, two_threads, settings_seen):
    started = threading.active_count()
    settings = {"k": 20} if name in ("knn", "nnguide") else {}
    head = heads.get(name)(**settings)
    head.fit(data.h_fit, data.z_fit, data.y_fit, classifier=data.classifier)
    scores = head.score(data.h_test, data.z_test)
    probs = head.predict(data.h_test, data.z_test).probs
    assert np.isfinite(scores).all() and np.allclose(probs.sum(1), 1.0)
    assert torch.get_num_threads() == 2  # given back after fit, score and predict
    assert all(count <= 2 for count in settings_seen), settings_seen  # never raised
    assert threading.active_count() == started  # no thread of etn's own left running


def test_the_heads_start_no_thread_pool_of_their_own():
    """Threads come from torch's pool alone: no Python thread or process pool and no other
    setting of torch's threads than :func:`one_thread`'s in any head's code."""
    pools = re.compile(
        r"ThreadPoolExecutor|ProcessPoolExecutor|threading\.Thread|multiprocessing|"
        r"set_num_threads|threadpool_limits|omp_set_num_threads"
    )
    found = [
        f"{path.relative_to(HEADS_DIR)}:{number}"
        for path in sorted(HEADS_DIR.rglob("*.py"))
        if path.name != "threads.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pools.search(line)
    ]
    assert found == []
