"""Mahalanobis distance OOD score (Lee et al., NeurIPS 2018), on the last hidden state.

Fit (ID statistics: the pipeline's ``fit`` split when it has one, else the adaptation split):
class means ``mu_c`` and one tied covariance ``Sigma`` (``/ N``, inverted with ``pinv``).
Score: ``md(h) = -min_c (h - mu_c)^T Sigma^-1 (h - mu_c)`` (higher = more ID). Probabilities
stay the backbone's softmax. This is the feature-only variant: no input perturbation and no
ensemble over layers, which need the backbone at scoring time. Registered also as ``mds``,
OpenOOD's name.
"""

from __future__ import annotations

import numpy as np
import torch

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.scorers.statistics import (
    class_means,
    precision,
    squared_distances,
    tied_covariance,
)
from etn_cli.metrics.scores import probability_scores


@heads.register("mahalanobis")
class Mahalanobis(Head):
    keeps_argmax = True  # the softmax of the backbone's logits

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        self.means_ = class_means(h, y, z.shape[1], "Mahalanobis")  # (C, D)
        self.precision_ = precision(tied_covariance(h, y, self.means_))

    def _predict(self, h, z, *, layers, device) -> Prediction:
        probs = torch.softmax(z.double(), dim=1).cpu().numpy()
        return Prediction(probs, probability_scores(probs) | {"md": self._score(h, z)})

    def _score(self, h, z, **_) -> np.ndarray:
        return (-squared_distances(h, self.means_, self.precision_).min(1).values).cpu().numpy()

    def _state(self) -> dict[str, torch.Tensor]:
        return {"means": self.means_, "precision": self.precision_}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.means_, self.precision_ = tensors["means"], tensors["precision"]
