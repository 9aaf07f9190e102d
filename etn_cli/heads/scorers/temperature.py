"""Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017) as a
post-hoc scorer: the backbone's softmax with the one temperature ``T > 0`` that minimises the
negative log-likelihood of the adaptation split (never the ``fit`` split: T is a calibration
fitted on held-out labels). The score is MP of ``softmax(z / T)``, higher = more ID; the argmax,
hence accuracy, is the backbone's.

This is the backbone's softmax with ``calibrate = "temperature"``: the fit is
:func:`etn_cli.heads.calibration.fit_scores_temperature` on the logits (Newton's method on
``1 / T``; its fallback where the NLL has no finite optimum, e.g. a perfectly classified
adaptation split, is Laplace's rule, with a warning), its record is the head's
``calibration_``, and :meth:`~etn_cli.heads.base.Head.predict` applies it to the
probabilities as it does for every calibrated head.
"""

from __future__ import annotations

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import heads
from etn_cli.heads.calibration import fit_scores_temperature
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.softmax_terms import max_probability


@heads.register("temperature")
class TemperatureScaling(Scorer):
    def fit_scorer(self, h, z, y, classifier) -> None:
        if torch.unique(y).numel() < 2:
            raise EtnError(
                "Temperature scaling needs labelled adaptation samples of 2+ classes, found one. "
                "Use a larger adaptation split."
            )
        self.calibration_ = fit_scores_temperature(z, y)

    @property
    def temperature_(self) -> float:
        """The fitted temperature, from the fit's record."""
        return self.calibration_["temperature"]

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``max_i softmax(z / T)_i`` (N,), float64 throughout
        (:func:`~etn_cli.heads.scorers.softmax_terms.max_probability`): at a small T, float32
        exponentials would round apart rows that float64 keeps distinct."""
        return max_probability(z, self.temperature_, torch.float64)

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        if "temperature" in tensors and self.calibration_ is None:  # saved before issue 29
            t = float(tensors["temperature"])
            self.calibration_ = {"method": "temperature", "temperature": t, "rule": "nll"}
