"""Static scaling reaches its own loss optimum (issue 17.2): with the paper's epochs and learning
rate, Adam's steps in ``log a`` stop far short of a scale in the hundreds; the head starts from
the 1-D search's optimum instead. Checked against an independent dense grid over ``log a``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from etn_cli.heads.edl import dirichlet_kl_to_target, evidence
from etn_cli.heads.static import Static

NU = 1e4


def _mean_loss(z: torch.Tensor, y: torch.Tensor, a: float, b: float) -> float:
    alpha = evidence(a * z.double(), torch.tensor(b, dtype=torch.float64))
    return float(dirichlet_kl_to_target(alpha, y, NU).mean())


def _head_loss(head: Static, z: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(dirichlet_kl_to_target(head.module_(z), y, NU).mean())


@pytest.fixture(scope="module")
def adaptation(features_factory):
    data = features_factory(n=190, d=16, c=7, seed=3)
    z = torch.from_numpy(data.logits) / 20  # small logits: the optimal scale is large
    y = torch.from_numpy(data.labels)
    grid = np.arange(-6.0, 17.0, 0.005)  # log a, every 0.5%
    losses = [_mean_loss(z, y, float(np.exp(s)), 1.0) for s in grid]
    best = int(np.argmin(losses))
    return z, y, float(np.exp(grid[best])), losses[best]


def test_the_dense_grids_optimal_scale_is_far_from_where_adam_can_walk(adaptation):
    _, _, scale, _ = adaptation
    assert scale > 50  # 50 steps of about 1e-3 in log a reach 1.05


@pytest.mark.parametrize("lr", [1e-3, 1e-2])
def test_static_scaling_ends_within_one_percent_of_the_line_search_optimum(adaptation, lr):
    z, y, _, optimum = adaptation
    head = Static(lr=lr).fit(z, z, y)  # the paper's 50 epochs at full batch
    assert _head_loss(head, z, y) <= 1.01 * optimum
    assert head.a_start_ == pytest.approx(adaptation[2], rel=0.01)


def test_static_scaling_from_a_fixed_start_stops_far_from_it(adaptation):
    z, y, _, optimum = adaptation
    head = Static(lr=1e-3, init="fixed").fit(z, z, y)
    assert _head_loss(head, z, y) > 1.5 * optimum  # what the search start fixes
