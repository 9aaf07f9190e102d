"""The plan describes each head from its record (:mod:`etn_cli.catalogue`) and
:mod:`etn_cli.heads.facts` without importing it. Every registered head, built from the plan's
spec, agrees with what the plan said of it, and keys its units as before."""

from __future__ import annotations

import pytest

from etn_cli.catalogue import METHODS
from etn_cli.heads import heads, settings_of
from etn_cli.planning.units import PlannedHead

FACTS = (
    "family", "needs_classifier", "needs_layers", "needs_id_statistics", "needs_every_class",
    "seed_free", "version", "variant", "display_label",
)  # fmt: skip
# settings that change a variant or a label before fitting
VARIED = {"etn": {"variant": "vector"}, "laplace": {"hessian_structure": "diag"}}


def planned(name: str, settings: dict) -> PlannedHead:
    config = settings_of(name)(**settings)
    return PlannedHead(name, settings, config)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_the_plans_facts_of_each_head_are_the_heads_own(name: str) -> None:
    for settings in ({"seed": 3}, {"seed": 0, **VARIED.get(name, {})}):
        spec = planned(name, settings)
        live = spec.build()
        assert type(live) is heads.get(name) and live.config == spec.config
        for fact in FACTS:
            assert getattr(spec, fact) == getattr(live, fact), (name, fact)
        assert spec.label == live.label


def test_a_varied_setting_shows_in_the_planned_label() -> None:
    assert planned("etn", {"variant": "vector"}).display_label == "ETN (vector)"
    assert planned("laplace", {"hessian_structure": "diag"}).display_label.endswith("diag)")
    assert planned("odin", {}).display_label == "ODIN"  # before fit: the method's name
