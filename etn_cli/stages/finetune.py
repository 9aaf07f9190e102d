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

from etn_cli.errors import EtnError
from etn_cli.plan import FinetuneUnit, Plan, open_source
from etn_cli.provenance import provenance
from etn_cli.stages.result import StageResult
from etn_cli.store.atomic import atomic_dir, atomic_write_text, remove_partials, unit_lock
from etn_cli.store.fingerprint import canonical_json

RECORD = "finetune.json"
KIND = "etn-finetune"


def finetune_is_complete(path: Path) -> bool:
    """True when ``path`` holds a ``finetune.json``, written last inside the private folder."""
    return (Path(path) / RECORD).is_file()


def finetune(plan: Plan, *, device: str = "cpu", force: bool = False) -> StageResult:
    """Build the ``[finetune]`` unit of ``plan`` unless it is complete (or ``force``)."""
    result = StageResult("finetune")
    unit = plan.finetune
    if unit is None:
        return result
    name = f"{plan.backbone_name} on {unit.dataset}.{unit.split}"
    if finetune_is_complete(unit.path) and not force:
        result.skip(unit.path, name)
        return result
    unit.path.parent.mkdir(parents=True, exist_ok=True)
    with unit_lock(unit.path):
        if finetune_is_complete(unit.path) and not force:  # finished while we waited
            result.skip(unit.path, name, "finished by another run")
            return result
        remove_partials(unit.path)
        with result.build(unit.path, name, "--force" if force else "no finetune.json"):
            train_and_save(plan, unit, device, replace=force)
    return result


def train_and_save(plan: Plan, unit: FinetuneUnit, device: str, replace: bool) -> None:
    template = plan.backbone
    backbone = type(template)(template.config, template.cache_dir, device)
    train = open_source(plan.pipeline, unit.dataset).load_split(unit.split)
    started = time.perf_counter()
    with atomic_dir(unit.path, replace=replace) as folder:
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
        plain = json.loads(canonical_json(document))
        atomic_write_text(folder / RECORD, json.dumps(plain, indent=2) + "\n")


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
    return unit.path
