"""ODIN (Liang et al., ICLR 2018): temperature scaling plus input perturbation.

The score is the maximum softmax probability at temperature ``T`` of the logits at a perturbed
input ``x' = x - eps * sign(-grad_x log S_yhat(x; T))``, ``S(x; T) = softmax(f(x) / T)``.
The perturbation needs the backbone, so ``etn extract`` computes it when the pipeline's
``[backbone]`` table says ``odin = true`` and stores ``layers/odin = f(x') / T``. This head uses
that array when the features have it (``p = softmax(layers["odin"])``, label "ODIN"); otherwise
it falls back to temperature scaling alone, ``p = softmax(z / T)`` (label "ODIN (temperature
only)"). Which of the two was fitted is saved with the head. Nothing is learned.

With ``T = 1000`` the probabilities are nearly uniform: MP ranks samples for OOD detection,
but calibration metrics of this head (ECE, NLL, Brier) describe the softened distribution.
"""

from __future__ import annotations

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.settings import ODINConfig
from etn_cli.metrics.scores import probability_scores

ODIN_LAYER = "odin"


@heads.register("odin")
class ODIN(Head):
    def __init__(self, **settings) -> None:
        super().__init__(**settings)
        self.perturbed_: bool | None = None  # known after fit: did the features carry x'?

    @property
    def display_label(self) -> str:
        """ "ODIN" with perturbed logits, "ODIN (temperature only)" without; before fit the
        features are unknown and the label is the method's name."""
        return "ODIN (temperature only)" if self.perturbed_ is False else "ODIN"

    @property
    def backbone_passes(self) -> int:
        """Perturbed ODIN runs the backbone twice (x, then x') plus one backward pass."""
        return 2 if self.perturbed_ else 1

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        self.perturbed_ = ODIN_LAYER in layers
        if self.perturbed_:
            self._odin_logits(layers, z.shape[1])
            if self.config.temperature != ODINConfig.temperature:  # layers/odin has its own T
                raise EtnError(
                    f"odin's temperature = {self.config.temperature} would be ignored: these "
                    "features carry layers/odin, already divided by the T they were extracted "
                    "with. Drop the head's temperature (set the extract's T instead)."
                )

    def _odin_logits(self, layers: dict[str, torch.Tensor], n_classes: int) -> torch.Tensor:
        if ODIN_LAYER not in layers:
            raise EtnError(
                "This ODIN head was fitted on features with perturbed logits (layers/odin), but "
                "these features have none. Extract them with odin = true in [backbone]."
            )
        scaled = layers[ODIN_LAYER]  # (N, C), already divided by T
        if scaled.shape[1] != n_classes:
            raise EtnError(
                f"layers/odin has {scaled.shape[1]} columns, expected one per class "
                f"({n_classes}). Re-extract the features with odin = true."
            )
        return scaled

    def _predict(self, h, z, *, layers, device) -> Prediction:
        if self.perturbed_:
            scaled = self._odin_logits(layers, z.shape[1])
        else:
            scaled = z.double() / self.config.temperature
        probs = torch.softmax(scaled.double(), dim=1).cpu().numpy()  # (N, C)
        return Prediction(probs, probability_scores(probs))

    def _state(self) -> dict[str, torch.Tensor]:
        return {"perturbed": torch.tensor([bool(self.perturbed_)])}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.perturbed_ = bool(tensors["perturbed"].item())
