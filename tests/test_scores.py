"""Uncertainty scores checked against scipy, Monte Carlo and hand computation (DESIGN §3)."""

import numpy as np
import pytest
from scipy import stats

from etn_cli.errors import EtnError
from etn_cli.metrics.scores import (
    HIGHER_MEANS_ID,
    dirichlet_scores,
    id_score,
    probability_scores,
    sample_scores,
)


@pytest.mark.parametrize("num_classes", [2, 5, 100])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_differential_entropy_matches_scipy_dirichlet_entropy(num_classes, scale):
    rng = np.random.default_rng(num_classes)
    alpha = rng.gamma(2.0, size=(4, num_classes)) * scale + 1e-6  # (4, C)
    expected = [stats.dirichlet(row).entropy() for row in alpha]
    np.testing.assert_allclose(dirichlet_scores(alpha)["de"], expected, rtol=1e-7, atol=1e-6)


@pytest.mark.parametrize("alpha", [[0.5, 0.8, 2.0], [3.0, 1.0], [10.0, 0.2, 0.3, 1.5]])
def test_mutual_information_matches_a_monte_carlo_estimate(alpha):
    rng = np.random.default_rng(0)
    draws = rng.dirichlet(alpha, size=200_000)  # (S, C)
    mean = draws.mean(axis=0)
    entropy_of_mean = -(mean * np.log(mean)).sum()
    mean_entropy = -(draws * np.log(np.clip(draws, 1e-300, None))).sum(axis=1).mean()
    mi = dirichlet_scores(np.array([alpha]))["mi"][0]
    assert mi == pytest.approx(entropy_of_mean - mean_entropy, abs=1e-2)


def test_max_probability_and_uncertainty_mass_match_hand_computation():
    scores = dirichlet_scores(np.array([[1.0, 3.0], [2.0, 2.0]]))
    np.testing.assert_allclose(scores["mp"], [0.75, 0.5])
    np.testing.assert_allclose(scores["um"], [4.0, 4.0])


def test_dirichlet_scores_are_float64_for_float32_input():
    scores = dirichlet_scores(np.array([[1.0, 3.0]], dtype=np.float32))
    assert all(values.dtype == np.float64 and values.shape == (1,) for values in scores.values())


def test_non_finite_alpha_is_reported_with_its_rows():
    alpha = np.ones((8, 3))
    alpha[4:7, 1] = np.nan
    with pytest.raises(EtnError, match=r"3 non-finite values \(rows 4\.\.6\)"):
        dirichlet_scores(alpha)


def test_non_positive_alpha_is_rejected():
    with pytest.raises(EtnError, match="non-positive"):
        dirichlet_scores(np.array([[1.0, 0.0]]))


def test_probability_scores_give_the_max_probability():
    probs = np.array([[0.2, 0.8], [0.6, 0.4]])
    np.testing.assert_allclose(probability_scores(probs)["mp"], [0.8, 0.6])


def test_sample_mutual_information_is_zero_when_all_samples_agree():
    probs = np.array([[0.2, 0.3, 0.5], [0.9, 0.05, 0.05]])
    scores = sample_scores(np.stack([probs] * 7))
    np.testing.assert_allclose(scores["mi"], 0.0, atol=1e-12)
    np.testing.assert_allclose(scores["mp"], [0.5, 0.9])


def test_sample_mutual_information_matches_hand_computation_when_samples_disagree():
    samples = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # (S=2, N=1, C=2)
    scores = sample_scores(samples)
    assert scores["mi"][0] == pytest.approx(np.log(2.0))
    assert scores["mp"][0] == pytest.approx(0.5)


def test_id_score_flips_mutual_information_and_differential_entropy_only():
    values = np.array([1.0, -2.0])
    for name, higher_means_id in HIGHER_MEANS_ID.items():
        expected = values if higher_means_id else -values
        np.testing.assert_array_equal(id_score(name, values), expected)
    assert not HIGHER_MEANS_ID["mi"] and not HIGHER_MEANS_ID["de"]


def test_unknown_score_name_lists_the_known_ones():
    with pytest.raises(EtnError, match="Known scores: ") as raised:
        id_score("entropi", np.zeros(2))
    known = str(raised.value).split("Known scores: ")[1].rstrip(".").split(", ")
    assert {"de", "energy", "kernel", "md", "mi", "mp", "um"} <= set(known) and known == sorted(
        known
    )
