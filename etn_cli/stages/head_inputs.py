"""What every head reads, checked before the first head is fitted.

A head that reads pooled intermediate layers (``dmm``) needs features with ``layers/<name>``;
a head that starts from the backbone's final layer needs a classifier whose shape fits the
features. A missing input stops ``etn train`` before any head is fitted, with one line naming
the heads and what they miss, instead of failing half way through the list.
"""

from __future__ import annotations

from typing import Any

from etn_cli.errors import EtnError
from etn_cli.stages.result import StageResult
from etn_cli.stages.units import Unit, build_units


def check_head_inputs(plan: Any, units: list[Any], adapt: Any) -> None:
    """Refuse, before any work, heads whose inputs the adaptation features cannot supply."""
    want_layers = sorted({u.label for u in units if u.head.needs_layers})
    if want_layers and not adapt.layers:
        raise EtnError(
            f"{', '.join(want_layers)} read pooled intermediate layers, but the adaptation "
            f"features at {adapt.path} have none. Ask extract for them with layers = [...] in "
            "[backbone] (your own features: store layers/<name> arrays), or remove the head."
        )
    if not any(u.head.needs_classifier for u in units):
        return
    from etn_cli.own_features.classifier import classifier_for

    shape = (adapt.num_classes, adapt.hidden_size)
    if plan.classifier_source is not None:  # your own features: given, or fitted, once
        found = [OwnClassifier(plan, shape)]  # checked before its lock: a refusal writes nothing
        build_units(found, StageResult("train"), before=lambda todo: [u.made() for u in todo])
    classifier_for(plan, shape)  # refused here if it misfits


class OwnClassifier(Unit):
    """The classifier of your own features, written once (given, or fitted on the adaptation
    split) into ``classifier.safetensors``; one of another shape than the features' is refused
    before it is stored. Found by its presence: a damaged one is refused where it is read."""

    quiet_skip = True
    counted = False

    def __init__(self, plan: Any, shape: tuple[int, int]) -> None:
        self.plan, self.shape = plan, shape
        self.path, self.name = plan.classifier_path, "classifier (your own features)"
        self._made: tuple[Any, Any, dict[str, Any]] | None = None

    def damage(self) -> str | None:
        return None if self.path.is_file() else "missing"

    def made(self) -> tuple[Any, Any, dict[str, Any]]:
        """``(weight, bias, record)``, checked against the features' shape (made once)."""
        from etn_cli.own_features.classifier import build_classifier, check_shape

        if self._made is None:
            weight, bias, record = build_classifier(self.plan)
            check_shape(weight, self.shape, record.get("file", "the fitted classifier"))
            self._made = weight, bias, record
        return self._made

    def write(self, force: bool) -> None:
        from etn_cli.store.artefacts.classifier import save_classifier

        weight, bias, record = self.made()
        save_classifier(self.path, weight, bias, {"classifier_source": record})
