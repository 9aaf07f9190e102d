"""Deep ensemble of last layers (Lakshminarayanan et al., NeurIPS 2017), on cached features.

M linear heads ``z_m = W_m h + b_m``, each initialised from the backbone's classifier and
fine-tuned by cross-entropy on the adaptation set; as in the paper's baseline (Supp.
"Baselines": three models, same data, different random data order) the members differ only in
the order of their minibatches. The prediction averages the members' logits::

    p = softmax((1/M) sum_m z_m)

MP is ``max_i p_i``; MI comes from the members' softmaxes as samples (``sample_scores``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.lastlayer import classifier_tensors
from etn_cli.heads.training import fit_module
from etn_cli.metrics.scores import probability_scores, sample_scores


def member_seed(seed: int, member: int) -> int:
    """An independent data-order seed per member, derived from the head's seed."""
    return int(np.random.SeedSequence([seed, member]).generate_state(1)[0])


@heads.register("ensemble")
class Ensemble(Head):
    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        weight, bias = classifier_tensors(classifier, h.shape[1], z.shape[1])
        weights, biases, self.selection_ = [], [], []
        for m in range(cfg.members):
            layer = nn.Linear(h.shape[1], z.shape[1])
            with torch.no_grad():
                layer.weight.copy_(weight)
                layer.bias.copy_(bias)

            def loss(h_: torch.Tensor, y_: torch.Tensor, layer: nn.Linear = layer) -> torch.Tensor:
                return F.cross_entropy(layer(h_), y_, reduction="none")

            training = fit_module(
                layer, loss, (h, y), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                seed=member_seed(cfg.seed, m), device=device, weight_decay=cfg.weight_decay,
                desc=f"ensemble member {m + 1}/{cfg.members}", select=cfg.select,
                class_scores=lambda h_, y_, layer=layer: layer(h_),
            )  # fmt: skip
            self.selection_.append(training.record())
            weights.append(layer.weight.detach())
            biases.append(layer.bias.detach())
        self.weight_ = torch.stack(weights)  # (M, C, D)
        self.bias_ = torch.stack(biases)  # (M, C)

    @torch.no_grad()
    def member_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Each member's logits (M, N, C), in float64."""
        return (
            torch.einsum("nd,mcd->mnc", h.double(), self.weight_.double())
            + self.bias_.double()[:, None]
        )

    def _predict(self, h, z, *, layers, device) -> Prediction:
        rows = max(1, 2**22 // (len(self.weight_) * self.n_classes_))
        parts = [self._chunk(h[i : i + rows]) for i in range(0, len(h), rows)]
        probs = np.concatenate([p for p, _ in parts])  # (N, C)
        mi = np.concatenate([mi for _, mi in parts])  # (N,)
        return Prediction(probs, probability_scores(probs) | {"mi": mi})

    def _chunk(self, h: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        logits = self.member_logits(h)  # (M, n, C)
        probs = torch.softmax(logits.mean(0), dim=-1).cpu().numpy()  # (n, C)
        return probs, sample_scores(torch.softmax(logits, dim=-1).cpu().numpy())["mi"]

    def _state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight_, "bias": self.bias_}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.weight_, self.bias_ = tensors["weight"], tensors["bias"]
        expected = (self.config.members, self.n_classes_, self.n_features_)
        if tuple(self.weight_.shape) != expected:
            raise RuntimeError(f"weight has shape {tuple(self.weight_.shape)}, not {expected}")
