"""Selective prediction (AURC, E-AURC, risk at coverage) against direct computations of the
definitions (Geifman & El-Yaniv 2017; Geifman et al. 2019)."""

import itertools
import math

import numpy as np
import pytest

from etn_cli.metrics.evaluation import selective_metrics
from etn_cli.metrics.selective import risk_coverage_curve, selective_values


def _direct(confidence: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """The definitions, one accepted prediction at a time (no ties in ``confidence``)."""
    ranked = correct[np.argsort(-confidence)]
    n = len(ranked)
    risks = [(~ranked[:k]).sum() / k for k in range(1, n + 1)]
    oracle_order = np.sort(correct)[::-1]  # every correct prediction first
    oracle = [(~oracle_order[:k]).sum() / k for k in range(1, n + 1)]
    out = {"aurc": sum(risks) / n, "eaurc": sum(risks) / n - sum(oracle) / n}
    for name, c in (("risk80", 0.8), ("risk90", 0.9), ("risk95", 0.95)):
        out[name] = risks[math.ceil(c * n) - 1]
    return out


def test_aurc_eaurc_and_risk_at_coverage_match_the_definitions():
    rng = np.random.default_rng(0)
    confidence = rng.random(57)
    correct = rng.random(57) < 0.4 + 0.6 * confidence  # confident rows more often right
    found = selective_values(confidence, correct)
    for name, value in _direct(confidence, correct).items():
        assert found[name][0] == pytest.approx(value, abs=1e-12), name


def test_tied_confidences_count_errors_at_their_mean_over_every_order():
    confidence = np.array([0.9, 0.7, 0.7, 0.7, 0.4, 0.4, 0.1])
    correct = np.array([True, False, True, True, False, True, False])
    expected: dict[str, list[float]] = {}
    ties = [list(itertools.permutations([1, 2, 3])), list(itertools.permutations([4, 5]))]
    for first, second in itertools.product(*ties):
        order = [0, *first, *second, 6]
        distinct = -np.arange(7.0)  # this order, without ties
        direct = _direct(distinct, correct[order])
        for name, value in direct.items():
            expected.setdefault(name, []).append(value)
    found = selective_values(confidence, correct)
    for name, values in expected.items():
        assert found[name][0] == pytest.approx(np.mean(values), abs=1e-12), name


def test_integer_weights_give_the_metrics_of_the_repeated_rows():
    rng = np.random.default_rng(1)
    confidence = rng.integers(0, 8, 40) / 8.0  # many ties
    correct = rng.random(40) < 0.7
    weights = rng.multinomial(40, np.full(40, 1 / 40), size=5)  # (5, 40) bootstrap draws
    batched = selective_values(confidence, correct, weights)
    for b in range(5):
        rows = np.repeat(np.arange(40), weights[b])
        alone = selective_values(confidence[rows], correct[rows])
        for name in alone:
            assert batched[name][b] == pytest.approx(alone[name][0], abs=1e-12)


def test_an_oracle_ranking_has_no_excess_area_and_the_large_n_limit_is_geifmans():
    correct = np.r_[np.ones(900, bool), np.zeros(100, bool)]
    perfect = selective_values(np.linspace(1, 0, 1000), correct)
    assert perfect["eaurc"][0] == pytest.approx(0.0, abs=1e-12)
    assert perfect["risk80"][0] == 0.0 and perfect["risk95"][0] == pytest.approx(50 / 950)
    r = 0.1
    assert perfect["aurc"][0] == pytest.approx(r + (1 - r) * math.log(1 - r), abs=1e-3)
    random = selective_values(np.zeros(1000), correct)  # one tie: no ranking at all
    assert random["aurc"][0] == pytest.approx(r) and random["risk90"][0] == pytest.approx(r)


def test_the_curve_averages_to_the_aurc_and_ends_at_the_error_rate():
    rng = np.random.default_rng(2)
    confidence, correct = rng.integers(0, 5, 30).astype(float), rng.random(30) < 0.8
    coverage, risk = risk_coverage_curve(confidence, correct)
    assert coverage[-1] == 1.0 and risk[-1] == pytest.approx((~correct).mean())
    assert risk.mean() == pytest.approx(selective_values(confidence, correct)["aurc"][0])


def test_scores_where_higher_means_ood_are_turned_before_ranking():
    rng = np.random.default_rng(4)
    mp = rng.random(50)
    correct = rng.random(50) < mp
    rows = {(m.metric, m.score): m.value for m in selective_metrics({"mp": mp, "mi": -mp}, correct)}
    assert rows[("aurc", "mp")] == pytest.approx(rows[("aurc", "mi")])
    assert rows[("eaurc", "mp")] < rows[("aurc", "mp")]
