"""Mahalanobis distance OOD score (Lee et al., NeurIPS 2018), on the last hidden state.

Fit: class means ``mu_c`` and one tied covariance ``Sigma`` of the adaptation features.
Score: ``md(h) = -min_c (h - mu_c)^T Sigma^-1 (h - mu_c)`` (higher = more ID). Probabilities
stay the backbone's softmax. This is the feature-only variant: no input perturbation and no
ensemble over layers, which need the backbone at scoring time.
"""

from __future__ import annotations

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.metrics.scores import probability_scores


@heads.register("mahalanobis")
class Mahalanobis(Head):
    name = "mahalanobis"
    label = "Mahalanobis"
    family = "posthoc"

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:  # noqa: ANN001
        h = h.double()
        classes = torch.arange(z.shape[1])
        missing = [int(c) for c in classes if not (y == c).any()]
        if missing:
            raise EtnError(
                f"Mahalanobis needs adaptation samples of every class; classes {missing} have "
                "none. Use a larger or stratified adaptation split."
            )
        self.means_ = torch.stack([h[y == c].mean(0) for c in classes])  # (C, D)
        centred = h - self.means_[y]
        cov = centred.T @ centred / len(h)  # (D, D)
        self.precision_ = torch.linalg.pinv(cov, hermitian=True)

    def _predict(self, h, z, *, layers, device) -> Prediction:  # noqa: ANN001
        probs = torch.softmax(z.double(), dim=1).numpy()
        h = h.double()
        hp = h @ self.precision_  # (N, D)
        mp = self.means_ @ self.precision_  # (C, D)
        # (h - mu)^T P (h - mu) expanded, so no (N, C, D) tensor is ever built
        dist = (hp * h).sum(1, keepdim=True) - 2 * hp @ self.means_.T + (mp * self.means_).sum(1)
        return Prediction(probs, probability_scores(probs) | {"md": (-dist.min(1).values).numpy()})

    def _state(self) -> dict[str, torch.Tensor]:
        return {"means": self.means_, "precision": self.precision_}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.means_, self.precision_ = tensors["means"], tensors["precision"]
