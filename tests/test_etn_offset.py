"""ETN with a fitted logit offset (``etn_offset``): the offset minimises the trained network's
adaptation loss, the search's objective is that loss less a constant in the offset, the head no
longer depends on the backbone's additive logit offset (as the softmax does not), and the scalar
variant keeps the predicted class."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from etn_cli.heads.etn_offset import OFFSET_TOLERANCE, OffsetETN

SETTINGS = {"epochs": 30, "mc_samples": 5, "seed": 1}


@pytest.fixture(scope="module")
def data(features_factory):
    return features_factory(n=120, d=10, c=4, seed=3)


@pytest.fixture(scope="module")
def fitted(data) -> OffsetETN:
    return OffsetETN(**SETTINGS).fit(data.hidden, data.logits, data.labels)


def test_the_offset_minimises_the_trained_networks_loss_over_a_fine_grid(data, fitted):
    h, z, y = (torch.as_tensor(a) for a in (data.hidden, data.logits, data.labels))
    grid = np.linspace(fitted.offset_ - 3, fitted.offset_ + 3, 61)
    losses = [fitted._mean_loss(h, z + float(c), y) for c in grid]
    assert fitted._mean_loss(h, z + fitted.offset_, y) <= min(losses) + 1e-6
    assert abs(grid[int(np.argmin(losses))] - fitted.offset_) <= 0.05 + OFFSET_TOLERANCE
    assert fitted._mean_loss(h, z + fitted.offset_, y) < fitted._mean_loss(h, z - 100.0, y)


@pytest.mark.parametrize("variant", ["scalar", "vector"])
def test_the_search_objective_is_the_mean_loss_less_a_constant(data, variant):
    head = OffsetETN(**SETTINGS, variant=variant).fit(data.hidden, data.logits, data.labels)
    h, z, y = (torch.as_tensor(a) for a in (data.hidden, data.logits, data.labels))
    objective = head._offset_objective(h, z, y)
    gaps = [objective(c) - head._mean_loss(h, z + c, y) for c in (-3.0, -0.5, 0.0, 2.0)]
    assert np.ptp(gaps) < 1e-4  # the KL term, which does not depend on the offset
    assert np.ptp([objective(c) for c in (-3.0, 0.0, 2.0)]) > 1e-2


def test_shifting_every_logit_by_a_constant_changes_nothing_but_the_offset(data, fitted):
    shifted = OffsetETN(**SETTINGS).fit(data.hidden, data.logits + 4.0, data.labels)
    assert shifted.offset_ == pytest.approx(fitted.offset_ - 4.0, abs=2 * OFFSET_TOLERANCE)
    a = fitted.predict(data.hidden, data.logits)
    b = shifted.predict(data.hidden, data.logits + 4.0)
    np.testing.assert_array_equal(a.predictions, b.predictions)
    for score in ("mp", "um", "mi", "de"):
        rho = np.corrcoef(
            np.argsort(np.argsort(a.scores[score])), np.argsort(np.argsort(b.scores[score]))
        )[0, 1]
        assert rho > 0.999, score


def test_the_scalar_offset_variant_keeps_the_backbones_predicted_class(data, fitted):
    prediction = fitted.predict(data.hidden, data.logits)
    np.testing.assert_array_equal(prediction.predictions, data.logits.argmax(axis=1))


def test_the_offset_survives_a_save_and_load(data, fitted, tmp_path):
    fitted.save(tmp_path)
    loaded = OffsetETN.load(tmp_path)
    assert loaded.offset_ == fitted.offset_
    a, b = fitted.predict(data.hidden, data.logits), loaded.predict(data.hidden, data.logits)
    np.testing.assert_array_equal(a.probs, b.probs)


def test_an_untrained_network_gets_no_offset_but_the_centring_and_a_warning(data):
    with pytest.warns(UserWarning, match="no offset is fitted"):
        head = OffsetETN(epochs=1, mc_samples=5, lr=1e-6).fit(data.hidden, data.logits, data.labels)
    assert head.offset_ == pytest.approx(-float(data.logits.mean()), rel=1e-6)
