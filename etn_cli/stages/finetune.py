"""Stage 0 (``etn finetune``): train the in-distribution backbone before extracting features.

The paper first trains its ID models (Supp. "Training Details"): VGG16-BN by cross-entropy on
95% of CIFAR-10's training set, the LLMs by LoRA on RACE / OBQA. Here the pipeline's
``[finetune]`` table names the split and the backbone's settings; the backbone's ``finetune``
writes its weights or adapter (safetensors) into a private folder, this stage adds
``finetune.json`` (what was trained, how, by which code) and renames the folder to
``<data>/backbones/<backbone>-finetune-<key>/`` only when everything is written. A complete
folder is never redone unless ``--force``; extract then loads it with ``use_finetuned``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.planning.plan import FinetuneUnit, Plan, open_source
from etn_cli.provenance import provenance
from etn_cli.stages.input_checks import check_planned_inputs
from etn_cli.stages.result import StageResult
from etn_cli.stages.units import Unit, build_unit
from etn_cli.store.artefacts.records import record_damage
from etn_cli.store.fingerprint import canonical_json

RECORD = FinetuneUnit.RECORD
KIND = "etn-finetune"


def finetune_is_complete(path: Path) -> bool:
    """True when ``path`` holds a ``finetune.json``, written last inside the private folder."""
    return (Path(path) / RECORD).is_file()


def finetune_damage(path: Path) -> str | None:
    """None when the folder is complete and its files match the sha256 ``finetune.json``
    records (sealed by its own; an older etn's record lists none); "missing" without a folder;
    otherwise what is damaged."""
    return record_damage(Path(path), RECORD)


def finetune(plan: Plan, *, device: str = "cpu", force: bool = False) -> StageResult:
    """Build the ``[finetune]`` unit of ``plan`` unless it is complete (or ``force``)."""
    result = StageResult("finetune")
    if plan.finetune is not None:
        if force or not finetune_is_complete(plan.finetune.path):
            check_planned_inputs(plan)  # every split's files before hours of training
        build_unit(FinetunedBackbone(plan, plan.finetune, device), result, force=force)
    return result


class FinetunedBackbone(Unit):
    """The backbone trained on the ``[finetune]`` split: its weights or adapter, sealed by
    ``finetune.json`` (what was trained, how, by which code, and every file's sha256)."""

    why = "no finetune.json"
    again = "Fine-tuning {name} again."  # derived: trained again, never used damaged
    record = RECORD

    def __init__(self, plan: Plan, unit: FinetuneUnit, device: str) -> None:
        self.plan, self.unit, self.device = plan, unit, device
        self.path, self.name = unit.path, f"{plan.backbone_name} on {unit.dataset}.{unit.split}"

    def damage(self) -> str | None:
        return finetune_damage(self.path)

    def build(self, folder: Path) -> dict[str, Any]:
        return train_and_save(self.plan, self.unit, self.device, folder)


def train_and_save(plan: Plan, unit: FinetuneUnit, device: str, folder: Path) -> dict[str, Any]:
    """Train the backbone into ``folder``; return the record of what was done."""
    backbone = plan.backbone.build(device)
    train = open_source(plan.pipeline, unit.dataset).load_split(unit.split)
    started = time.perf_counter()
    record = backbone.finetune(train, dict(unit.settings), folder)
    check_record(record, backbone.name)
    document = {
        "kind": KIND,
        "key": unit.key,
        "backbone": plan.backbone_name,
        "dataset": unit.dataset,
        "split": unit.split,
        "rows": len(train),
        "settings": unit.settings,
        "fingerprint": unit.fingerprint,
        "record": record,
        "seconds": time.perf_counter() - started,
        "device": device,
        "provenance": provenance(),
    }
    return json.loads(canonical_json(document))  # checked at every use, as it reads back


def check_record(record: Any, backbone: str) -> None:
    """A backbone's record must be JSON-able; a bug otherwise, named clearly."""
    try:
        canonical_json(record)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"{backbone}.finetune returned a record that is not JSON-able: {err}"
        ) from err


def require_finetuned(unit: FinetuneUnit) -> Path:
    """The unit's folder, or a one-line error saying how to build it."""
    if not finetune_is_complete(unit.path):
        raise EtnError(
            f"Expected the fine-tuned backbone at {unit.path}, found none. Run `etn finetune` "
            "on this pipeline first (`etn run` does it for you)."
        )
    if (damage := finetune_damage(unit.path)) is not None:
        raise DamagedArtefact(unit.path, damage)
    return unit.path
