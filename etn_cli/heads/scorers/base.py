"""The one interface of the post-hoc OOD scorers: fit on ID statistics and the classifier,
then score rows (pytorch-ood's ``fit_features`` / ``predict_features``, OpenOOD's
postprocessors), as a registered :class:`~etn_cli.heads.base.Head` of family ``posthoc``.

A scorer's record (:mod:`etn_cli.catalogue`) names its own score (``own_score`` here: the
report's AUROC and FPR95 rank by it), the score's direction and what it needs: ``id_statistics``
(fitted on the pipeline's ``[data] fit`` split when there is one, otherwise on the adaptation
split) and ``classifier`` (the backbone's final layer ``weight`` (C, D), ``bias`` (C,)).
It implements :meth:`Scorer.fit_scorer` and :meth:`Scorer.score_rows`; a scorer that changes
the logits (ReAct, ASH, DICE, ...) overrides :meth:`Scorer.scorer_logits` instead, its
probabilities are the softmax of those logits, as in OpenOOD, and with ``energy_of_logits``
its score is their energy, computed once per row.

Learned state lives on tensors whose names end in ``_`` and is saved and restored by the base
class, so a scorer file holds only its method.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head, Prediction
from etn_cli.heads.scorers import softmax_terms
from etn_cli.heads.scorers.threads import one_thread
from etn_cli.metrics.scores import probability_scores

SCORE_ROWS = 16384  # rows scored at once: bounds the (rows, D) and (rows, C) temporaries
NOT_STATE = ("n_features_", "n_classes_")


class Scorer(Head):
    energy_of_logits: ClassVar[bool] = False  # the score is logsumexp of ``scorer_logits``

    # --------------------------------------------------------------- for each scorer
    def fit_scorer(self, h, z, y, classifier) -> None:
        """Learn the scorer's state from ``h`` (N, D), ``z`` (N, C), ``y`` (N,) and the
        classifier (``weight``, ``bias``) or None; nothing to learn by default."""

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The own score of each row, shape (N,); for ``energy_of_logits`` scorers the energy
        of the logits they change."""
        if self.energy_of_logits:
            return energy(self.scorer_logits(h, z))
        raise NotImplementedError

    def scorer_logits(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The logits the scorer classifies with: the backbone's unless it changes them."""
        return z

    @property
    def keeps_argmax(self) -> bool:
        """A scorer that classifies with the backbone's own logits keeps its argmax."""
        return type(self).scorer_logits is Scorer.scorer_logits

    # --------------------------------------------------------------- Head plumbing
    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        if classifier is not None:
            classifier = {k: torch.as_tensor(v).float().to(device) for k, v in classifier.items()}
            check_classifier(classifier, h.shape[1], z.shape[1])
        self.fit_scorer(h.to(device), z.to(device), y.to(device), classifier)
        # the layout a checkpoint restores, so a loaded scorer computes bit for bit the same
        self._load_state({k: v.detach().contiguous() for k, v in self._state().items()})

    def _predict(self, h, z, *, layers, device) -> Prediction:
        logits, scores = [], []
        for start in range(0, len(h), SCORE_ROWS):
            hc, zc = h[start : start + SCORE_ROWS], z[start : start + SCORE_ROWS]
            changed = self.scorer_logits(hc, zc)
            score = energy(changed) if self.energy_of_logits else self.score_rows(hc, zc)
            logits.append(changed.double().cpu())
            scores.append(score.double().cpu())
        probs = torch.softmax(torch.cat(logits), dim=1).cpu().numpy()  # (N, C)
        own = {self.own_score: torch.cat(scores).cpu().numpy()}
        return Prediction(probs, probability_scores(probs) | own)

    def _score(self, h, z, *, layers, device) -> np.ndarray:
        parts = [
            self.score_rows(h[s : s + SCORE_ROWS], z[s : s + SCORE_ROWS])
            for s in range(0, len(h), SCORE_ROWS)
        ]
        with one_thread():
            return torch.cat(parts).double().cpu().numpy()

    def _state(self) -> dict[str, torch.Tensor]:
        return {
            name[:-1]: value
            for name, value in vars(self).items()
            if name.endswith("_") and name not in NOT_STATE and isinstance(value, torch.Tensor)
        }

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, value in tensors.items():
            setattr(self, f"{name}_", value)


def check_classifier(classifier: dict[str, torch.Tensor], dim: int, classes: int) -> None:
    weight, bias = classifier["weight"], classifier["bias"]
    if tuple(weight.shape) != (classes, dim) or tuple(bias.shape) != (classes,):
        raise EtnError(
            f"Expected the classifier's weight ({classes}, {dim}) and bias ({classes},) to match "
            f"the features, got {tuple(weight.shape)} and {tuple(bias.shape)}. Use the "
            "classifier.safetensors of the backbone that made these features."
        )


def energy(logits: torch.Tensor) -> torch.Tensor:
    """``logsumexp_i z_i`` (N,) float64: the negative free energy at T = 1 (Liu et al. 2020),
    the score ReAct, ASH, SCALE, DICE and VRA read from the logits they change
    (:func:`etn_cli.heads.scorers.softmax_terms.energy`: no float64 copy of the logits)."""
    return softmax_terms.energy(logits)


def linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The backbone's final layer on (possibly changed) features: ``h W^T + b`` (N, C)."""
    return torch.addmm(bias, h, weight.T)


def check_every_class(y: torch.Tensor, classes: int, what: str) -> None:
    """A class 0..C-1 without rows is an error naming the fix."""
    missing = torch.nonzero(torch.bincount(y, minlength=classes) == 0).flatten().tolist()
    if missing:
        raise EtnError(
            f"{what} needs ID samples of every class; classes {missing[:10]} have none. Use a "
            'larger or stratified split (fit = "train" in [data]).'
        )


def per_class_rows(y: torch.Tensor, classes: int, what: str) -> list[torch.Tensor]:
    """Row indices of each class 0..C-1, every class present."""
    check_every_class(y, classes, what)
    return [torch.nonzero(y == c).flatten() for c in range(classes)]
