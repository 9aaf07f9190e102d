"""The modules of a model by name, as a backbone's ``layers`` option names them; torch-free,
so that planning refuses a misspelt name from a list of names alone (the digits CNN's)."""

from __future__ import annotations

from typing import Any

from etn_cli.errors import EtnError, did_you_mean


def named_layers(model: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The modules of ``model`` called ``names``; an unknown name raises, listing valid ones."""
    modules = dict(model.named_modules())
    modules.pop("", None)  # the model itself: its output is the logits, already stored
    unknown = [name for name in names if name not in modules]
    if unknown:
        hint = did_you_mean(unknown[0], modules, n=3)
        shown = ", ".join(list(modules)[:60]) + (", ..." if len(modules) > 60 else "")
        raise EtnError(
            f"Unknown layer(s) {unknown} in the backbone's layers option.{hint} Valid names: "
            f"{shown}. Fix layers = [...] in the pipeline's [backbone] table."
        )
    return {name: modules[name] for name in names}
