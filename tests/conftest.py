"""Shared fakes for the tests: tiny, seeded synthetic backbone features."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest


@dataclass
class Features:
    """What ``etn extract`` caches for one split, plus the backbone's final layer."""

    hidden: np.ndarray  # (N, D) float32
    logits: np.ndarray  # (N, C) float32
    labels: np.ndarray  # (N,) int64
    weight: np.ndarray  # (C, D) float32
    bias: np.ndarray  # (C,) float32
    means: np.ndarray  # (C, D) class means of ``hidden``
    layers: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (N, D_l) float32

    @property
    def classifier(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight, "bias": self.bias}


def make_features(
    n: int = 200, d: int = 16, c: int = 4, *, seed: int = 0, split: int = 0, spread: float = 3.0
) -> Features:
    """Gaussian classes with class-dependent means; ``logits = h @ W.T + b`` plus noise, with
    ``W`` pointing at the class means so that the logits mostly agree with the labels.

    ``seed`` fixes the "backbone" (class means, W, b); ``split`` draws another sample from the
    same distribution (a held-out test set). ``layers`` holds two pooled "intermediate layers"
    (random projections of ``hidden``, one through a ReLU, plus noise), drawn from their own
    streams so that every other array is the same as without them.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=spread / 4, size=(c, d))  # (C, D), about spread apart
    weight = means + 0.3 * rng.normal(size=(c, d))  # (C, D)
    bias = -0.5 * (weight**2).sum(1)  # (C,)
    rng = np.random.default_rng([seed, split])
    labels = rng.permutation(np.arange(n) % c)  # (N,)
    hidden = means[labels] + rng.normal(size=(n, d))  # (N, D)
    logits = hidden @ weight.T + bias + 0.3 * rng.normal(size=(n, c))  # (N, C)
    projections = np.random.default_rng([seed, 7])  # part of the "backbone"
    p1, p2 = projections.normal(size=(d, 8)) / np.sqrt(d), projections.normal(size=(d, 12))
    noise = np.random.default_rng([seed, split, 7])
    layers = {
        "block1": np.maximum(hidden @ p1, 0) + 0.1 * noise.normal(size=(n, 8)),
        "block2": hidden @ p2 / np.sqrt(d) + 0.1 * noise.normal(size=(n, 12)),
    }
    return Features(
        hidden.astype(np.float32),
        logits.astype(np.float32),
        labels.astype(np.int64),
        weight.astype(np.float32),
        bias.astype(np.float32),
        means,
        {name: a.astype(np.float32) for name, a in layers.items()},
    )


@pytest.fixture(scope="session")
def features_factory():
    """``make_features`` as a fixture, so test modules need not import this file."""
    return make_features
