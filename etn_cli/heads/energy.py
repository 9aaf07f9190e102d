"""Energy-based OOD score (Liu et al., NeurIPS 2020): ``E(z) = -T logsumexp(z / T)``.

The score reported is the negative energy ``T logsumexp(z / T)`` (higher = more ID); the
class probabilities stay the backbone's softmax. Nothing is learned. ``temperature = 1`` is
the paper's (and OpenOOD's ``ebo.yml``, pytorch-ood's).
"""

from __future__ import annotations

import torch

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.scorers import softmax_terms
from etn_cli.metrics.scores import probability_scores


@heads.register("energy")
class Energy(Head):
    keeps_argmax = True  # the softmax of the backbone's logits

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        return None

    def _predict(self, h, z, *, layers, device) -> Prediction:
        t = self.config.temperature
        z = z.double()
        probs = torch.softmax(z, dim=1).cpu().numpy()
        energy = (t * torch.logsumexp(z / t, 1)).cpu().numpy()
        scores = probability_scores(probs) | {"energy": energy}
        return Prediction(probs, scores)

    def _score(self, h, z, *, layers, device):
        """The energy alone, in one pass of row blocks
        (:func:`~etn_cli.heads.scorers.softmax_terms.energy`)."""
        return softmax_terms.energy(z, self.config.temperature).cpu().numpy()
