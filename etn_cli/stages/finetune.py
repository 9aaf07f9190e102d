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

from etn_cli import progress
from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.plan import FinetuneUnit, Plan, open_source
from etn_cli.provenance import provenance
from etn_cli.stages.result import StageResult
from etn_cli.store.artefacts.headfiles import read_json_object
from etn_cli.store.artefacts.sealed import check_record_seal, discard, repair_line, seal_record
from etn_cli.store.atomic import atomic_dir, atomic_write_text, remove_partials, unit_lock
from etn_cli.store.fingerprint import canonical_json, file_sha256

RECORD = "finetune.json"
KIND = "etn-finetune"


def finetune_is_complete(path: Path) -> bool:
    """True when ``path`` holds a ``finetune.json``, written last inside the private folder."""
    return (Path(path) / RECORD).is_file()


def finetune_damage(path: Path) -> str | None:
    """None when the folder is complete and its files match the sha256 ``finetune.json``
    records (sealed by its own; an older etn's record lists none); "missing" without a folder;
    otherwise what is damaged."""
    path = Path(path)
    if not path.exists():
        return "missing"
    try:
        record = read_json_object(path / RECORD)
        check_record_seal(record, path / RECORD, path)
    except EtnError as err:
        return str(err)
    for name, digest in (record.get("files") or {}).items():
        found = file_sha256(path / name) if (path / name).is_file() else "missing"
        if found != digest:
            return (
                f"{path / name} has sha256 {found[:12]}… but {RECORD} records {str(digest)[:12]}…: "
                "the file changed or is corrupt."
            )
    return None


def finetune(plan: Plan, *, device: str = "cpu", force: bool = False) -> StageResult:
    """Build the ``[finetune]`` unit of ``plan`` unless it is complete (or ``force``)."""
    result = StageResult("finetune")
    unit = plan.finetune
    if unit is None:
        return result
    name = f"{plan.backbone_name} on {unit.dataset}.{unit.split}"
    if finetune_damage(unit.path) is None and not force:
        result.skip(unit.path, name)
        return result
    unit.path.parent.mkdir(parents=True, exist_ok=True)
    with unit_lock(unit.path):
        if (damage := finetune_damage(unit.path)) is None and not force:  # finished meanwhile
            result.skip(unit.path, name, "finished by another run")
            return result
        remove_partials(unit.path)
        if unit.path.exists() and not force:  # derived: trained again, never used damaged
            progress.say(repair_line(damage, f"Fine-tuning {unit.path.name} again."))
            discard(unit.path)
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
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        document["files"] = {str(p.relative_to(folder)): file_sha256(p) for p in files}
        plain = seal_record(json.loads(canonical_json(document)))  # checked at every use
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
    if (damage := finetune_damage(unit.path)) is not None:
        raise DamagedArtefact(unit.path, damage)
    return unit.path
