"""Stage zero of a backbone that etn builds itself before extracting (the digits CNN's trained
weights), as ``etn finetune`` is for a fine-tuned one.

The unit is keyed by the backbone's recipe (:attr:`~etn_cli.planning.units.BackboneSpec.
cache_folder`, from its settings alone); the unit driver (:mod:`etn_cli.stages.units`) builds
it. Its line stands outside the run's ``[k/N]``: ``etn status`` counts no backbone. A built
backbone's fingerprint names its weights, so a command that extracts builds stage zero while
the plan is made, before the features are keyed (:func:`plan_for_extract`): the plan is made
once, with the keys the run writes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.planning.pipeline import Pipeline
from etn_cli.planning.plan import Plan, make_plan
from etn_cli.planning.units import BackboneSpec
from etn_cli.stages.result import StageResult
from etn_cli.stages.units import Unit, build_unit
from etn_cli.store.artefacts.records import files_damage, intact_record, read_record


def plan_for_extract(pipeline: Pipeline, data_dir: Path) -> Plan:
    """The plan of a command that extracts (``etn extract``, ``etn run``): every name and
    input file checked first, then the backbone's stage zero built unless intact, then the
    features keyed by what it built."""
    return make_plan(pipeline, data_dir, stage_zero=prepare)


def prepare(spec: BackboneSpec, replanned: Callable[[], BackboneSpec]) -> BackboneSpec:
    """Build ``spec``'s stage zero unless it is intact; the spec as planned again from the
    built record (``replanned``) when something was built, else ``spec``."""
    if spec.cache_folder is None:
        return spec
    name = f"{spec.name} backbone"
    unit = BackboneCache(spec.cache_folder, spec.cache_record, name, lambda: spec.build("cpu"))
    return replanned() if build_unit(unit, StageResult("extract")) else spec


def prepared(backbone: Any) -> bool:
    """Build a live ``backbone``'s stage zero unless it is intact, then point the backbone at
    it (its fingerprint and model). True when it was built."""
    unit = BackboneCache(
        backbone.cache_folder(), backbone.cache_record, f"{backbone.name} backbone",
        lambda: backbone,
    )  # fmt: skip
    built = build_unit(unit, StageResult("extract"))
    backbone.use_cache(intact_record(unit.path, unit.record))
    return built


def require_prepared(backbone: Any) -> None:
    """Point a live ``backbone`` at its stage zero, which must be intact: a damaged one is a
    :class:`DamagedArtefact` (``etn run`` rebuilds it), a missing one says how to build it."""
    folder = backbone.cache_folder()
    if folder is None:
        return
    name = f"{backbone.name} backbone"
    unit = BackboneCache(folder, backbone.cache_record, name, lambda: backbone)
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

    def __init__(self, path: Path, record: str, name: str, live: Callable[[], Any]) -> None:
        self.path, self.record, self.name, self.live = path, record, name, live
        self.again = f"Building the {name} again."

    def damage(self) -> str | None:
        what = self.name.removesuffix(" backbone")
        if not self.path.exists():
            return "missing"
        try:
            record = read_record(self.path, self.record)
        except EtnError as err:
            return f"The {what} cache {self.path} is damaged: {err}"
        if not any(p.is_file() for p in Path(self.path).iterdir() if p.name != self.record):
            return f"The {what} cache {self.path} holds nothing but {self.record}."
        return files_damage(self.path, self.record, record)

    def build(self, folder: Path) -> dict[str, Any]:
        return self.live().build_cache(folder)
