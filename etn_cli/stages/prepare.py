"""Stage zero of a backbone that etn builds itself before extracting (the digits CNN's trained
weights), as ``etn finetune`` is for a fine-tuned one.

The backbone names the folder (:meth:`~etn_cli.backbones.base.Backbone.cache_folder`, keyed
by its settings) and builds into it (``build_cache``); the unit driver (:mod:`etn_cli.stages.units`)
does the rest. Its line stands outside the run's ``[k/N]``: ``etn status`` counts no backbone.
A built backbone's fingerprint names its weights, so the plan, made while it was not built, is
made again with it (:func:`etn_cli.planning.plan.replan`): the feature keys follow the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.planning.plan import Plan, replan
from etn_cli.stages.result import StageResult
from etn_cli.stages.units import Unit, build_unit
from etn_cli.store.artefacts.records import files_damage, intact_record, read_record


def prepare(plan: Plan) -> bool:
    """Build the plan's backbone's stage zero unless it is intact; the plan is made again
    when that changes its keys. True when something was built."""
    backbone = plan.backbone
    if backbone is None or backbone.cache_folder() is None:
        return False
    before = backbone.fingerprint()
    built = prepared(backbone)
    if backbone.fingerprint() != before:
        replan(plan)
    return built


def prepared(backbone: Any) -> bool:
    """Build ``backbone``'s stage zero unless it is intact, then point the backbone at it
    (its fingerprint and model). True when it was built."""
    unit = BackboneCache(backbone)
    built = build_unit(unit, StageResult("extract"))
    backbone.use_cache(intact_record(unit.path, unit.record))
    return built


def require_prepared(backbone: Any) -> None:
    """Point ``backbone`` at its stage zero, which must be intact: a damaged one is a
    :class:`DamagedArtefact` (``etn run`` rebuilds it), a missing one says how to build it."""
    folder = backbone.cache_folder()
    if folder is None:
        return
    unit = BackboneCache(backbone)
    if (damage := unit.damage()) == "missing":
        raise EtnError(
            f"Expected the {backbone.name} backbone built in {folder}, found none. Run `etn "
            "extract` or `etn run` on the pipeline (they build it once)."
        )
    if damage is not None:
        raise DamagedArtefact(folder, damage)
    backbone.use_cache(intact_record(folder, unit.record))


class BackboneCache(Unit):
    """What a backbone builds once before extraction, sealed by its record (``meta.json``)."""

    stage = "extract"
    counted = False  # a line of the run outside its [k/N]
    quiet_skip = True
    why = "no cached weights with this key; trained once, on first use"

    def __init__(self, backbone: Any) -> None:
        self.backbone = backbone
        self.path, self.name = backbone.cache_folder(), f"{backbone.name} backbone"
        self.record = backbone.cache_record
        self.again = f"Building the {backbone.name} backbone again."

    def damage(self) -> str | None:
        if not self.path.exists():
            return "missing"
        try:
            record = read_record(self.path, self.record)
        except EtnError as err:
            return f"The {self.backbone.name} cache {self.path} is damaged: {err}"
        if not any(p.is_file() for p in Path(self.path).iterdir() if p.name != self.record):
            return f"The {self.backbone.name} cache {self.path} holds nothing but {self.record}."
        return files_damage(self.path, self.record, record)

    def build(self, folder: Path) -> dict[str, Any]:
        return self.backbone.build_cache(folder)
