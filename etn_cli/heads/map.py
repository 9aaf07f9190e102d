"""MAP: the backbone's own softmax, unchanged (the paper's MAP_CE without fine-tuning)."""

from __future__ import annotations

import torch

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.scorers.softmax_terms import max_probability
from etn_cli.metrics.scores import probability_scores


@heads.register("map")
class MAP(Head):
    """``p = softmax(z)``; MP is its only score (no Dirichlet, no samples)."""

    keeps_argmax = True  # the softmax of the backbone's logits

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        return None

    def _predict(self, h, z, *, layers, device) -> Prediction:
        probs = torch.softmax(z.double(), dim=1).cpu().numpy()
        return Prediction(probs, probability_scores(probs))

    def _score(self, h, z, *, layers, device):
        """MP alone: ``max_i softmax(z)_i = 1 / sum_i exp(z_i - max z)``, no (N, C) output
        (:func:`~etn_cli.heads.scorers.softmax_terms.max_probability`)."""
        return max_probability(z).cpu().numpy()
