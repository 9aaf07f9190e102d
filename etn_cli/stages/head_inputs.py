"""What every head reads, checked before the first head is fitted.

A head that reads pooled intermediate layers (``dmm``) needs features with ``layers/<name>``;
a head that starts from the backbone's final layer needs a classifier whose shape fits the
features. A missing input stops ``etn train`` before any head is fitted, with one line naming
the heads and what they miss, instead of failing half way through the list.
"""

from __future__ import annotations

from typing import Any

from etn_cli.errors import EtnError


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

    classifier_for(plan, (adapt.num_classes, adapt.hidden_size))  # refused here if it misfits
