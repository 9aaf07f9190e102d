"""Small seeded features for the post-hoc scorer tests: four Gaussian classes in 12
non-negative (post-ReLU-like) dimensions, a logistic-regression classifier that plays the
backbone's final layer (so ``logits == hidden @ W.T + b``), and OOD rows from elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class ScorerData:
    h_fit: np.ndarray  # (N, D) float32
    z_fit: np.ndarray  # (N, C)
    y_fit: np.ndarray  # (N,)
    h_test: np.ndarray  # ID then OOD rows
    z_test: np.ndarray
    is_id: np.ndarray  # (M,) bool
    weight: np.ndarray  # (C, D)
    bias: np.ndarray  # (C,)

    @property
    def classifier(self) -> dict[str, torch.Tensor]:
        return {"weight": torch.from_numpy(self.weight), "bias": torch.from_numpy(self.bias)}


def make_scorer_data(
    seed: int = 0, n_fit: int = 400, dim: int = 12, classes: int = 4
) -> ScorerData:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    means = np.abs(rng.normal(size=(classes, dim))) * 2.0

    def rows(n: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, classes, n)
        h = np.maximum(means[y] + rng.normal(size=(n, dim)) + shift, 0.0)
        return h.astype(np.float32), y

    h_fit, y_fit = rows(n_fit)
    fitted = LogisticRegression(max_iter=5000, C=0.3).fit(h_fit, y_fit)
    # multinomial weights sum to zero over classes (rank C - 1); a shift common to every row
    # keeps the softmax and makes W full rank, as a trained network's final layer is
    weight = (fitted.coef_ + rng.normal(size=(1, dim)) * 0.5).astype(np.float32)
    bias = (fitted.intercept_ + 0.5).astype(np.float32)
    h_id, _ = rows(60)
    h_ood = np.maximum(rng.normal(size=(40, dim)) * 2.5 + 1.0, 0.0).astype(np.float32)
    h_test = np.concatenate([h_id, h_ood])
    return ScorerData(
        h_fit, h_fit @ weight.T + bias, y_fit, h_test, h_test @ weight.T + bias,
        np.r_[np.ones(60, bool), np.zeros(40, bool)], weight, bias,
    )  # fmt: skip
