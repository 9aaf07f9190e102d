"""What every head reads, checked before the first head is fitted.

A head that reads pooled intermediate layers (``dmm``) needs features with ``layers/<name>``;
a head that starts from the backbone's final layer needs a classifier whose shape fits the
features. A missing input stops ``etn train`` before any head is fitted, with one line naming
the heads and what they miss, instead of failing half way through the list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from etn_cli.errors import EtnError
from etn_cli.stages.units import Unit


def check_head_inputs(plan: Any, units: list[Any], adapt: Any, own: Any = None) -> None:
    """Refuse, before any work, heads whose inputs the adaptation features cannot supply;
    ``own`` is your own features' classifier when it is about to be built (checked here, before
    its lock: a refusal writes nothing)."""
    want_layers = sorted({u.label for u in units if u.head.needs_layers})
    if want_layers and not adapt.layers:
        raise EtnError(
            f"{', '.join(want_layers)} read pooled intermediate layers, but the adaptation "
            f"features at {adapt.path} have none. Ask extract for them with layers = [...] in "
            "[backbone] (your own features: store layers/<name> arrays), or remove the head."
        )
    if own is not None:
        own.made()
    elif any(u.head.needs_classifier for u in units):
        from etn_cli.own_features.classifier import classifier_for

        classifier_for(plan, (adapt.num_classes, adapt.hidden_size))  # refused if it misfits


def own_classifier(plan: Any, reader: Callable[[str], Any]) -> OwnClassifier | None:
    """The unit of your own features' classifier, when a head of ``plan`` starts from it."""
    if plan.classifier_source is None or not plan.stores_classifier:
        return None
    return OwnClassifier(plan, reader)


class OwnClassifier(Unit):
    """The classifier of your own features, written once (given, or fitted on the adaptation
    split) into ``classifier.safetensors``, the first unit of ``etn train``; one of another shape
    than the features' is refused before it is stored. Found by its presence: a damaged one is
    refused where it is read."""

    def __init__(self, plan: Any, reader: Callable[[str], Any]) -> None:
        self.plan, self.reader = plan, reader  # reader("adapt"): the adaptation features
        self.path, self.name = plan.classifier_path, "classifier (your own features)"
        self._made: tuple[Any, Any, dict[str, Any]] | None = None

    def damage(self) -> str | None:
        return None if self.path.is_file() else "missing"

    def made(self) -> tuple[Any, Any, dict[str, Any]]:
        """``(weight, bias, record)``, checked against the features' shape (made once)."""
        from etn_cli.own_features.classifier import build_classifier, check_shape

        if self._made is None:
            adapt = self.reader("adapt")
            shape = (adapt.num_classes, adapt.hidden_size)
            weight, bias, record = build_classifier(self.plan)
            check_shape(weight, shape, record.get("file", "the fitted classifier"))
            self._made = weight, bias, record
        return self._made

    def write(self, force: bool) -> None:
        from etn_cli.store.artefacts.classifier import save_classifier

        weight, bias, record = self.made()
        save_classifier(self.path, weight, bias, {"classifier_source": record})
