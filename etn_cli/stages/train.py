"""Stage 2: fit every head of the pipeline, per seed, on the cached adaptation features."""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path

import torch

from etn_cli.config import config_dict
from etn_cli.plan import HeadUnit, Plan
from etn_cli.provenance import provenance
from etn_cli.stages.result import StageResult
from etn_cli.store.atomic import atomic_dir, unit_lock
from etn_cli.store.shards import Features, load_classifier, read_split


def head_is_complete(path: Path) -> bool:
    return (path / "train.json").is_file()


def train(plan: Plan, *, device: str = "cpu", force: bool = False) -> StageResult:
    """Fit every missing head unit; finished heads are left untouched unless ``force``."""
    result = StageResult("train")
    reader = cache(lambda: read_split(plan.adapt.path))
    for unit in plan.heads:
        if head_is_complete(unit.path) and not force:
            result.skipped.append(str(unit.path))
            continue
        unit.path.parent.mkdir(parents=True, exist_ok=True)
        with unit_lock(unit.path):
            if head_is_complete(unit.path) and not force:
                result.skipped.append(str(unit.path))
                continue
            fit_and_save(plan, unit, reader(), device, replace=force)
            result.done.append(str(unit.path))
    return result


def fit_and_save(plan: Plan, unit: HeadUnit, adapt: Features, device: str, replace: bool) -> None:
    classifier = None
    if unit.head.needs_classifier:
        weight, bias = load_classifier(plan.classifier_path)
        classifier = {"weight": torch.as_tensor(weight), "bias": torch.as_tensor(bias)}
    started = time.perf_counter()
    unit.head.fit(
        adapt.hidden,
        adapt.logits,
        adapt.labels,
        classifier=classifier,
        layers=adapt.layers,
        device=device,
    )
    seconds = time.perf_counter() - started
    record = {
        "head": unit.head.name,
        "label": unit.label,
        "key": unit.key,
        "config": config_dict(unit.head.config),
        "adapt_features": str(plan.adapt.path),
        "adapt_key": adapt.key,
        "adapt_rows": len(adapt.labels),
        "train_seconds": seconds,
        "device": device,
        "pipeline": plan.pipeline.name,
        "provenance": provenance(),
    }
    with atomic_dir(unit.path, replace=replace) as tmp:
        unit.head.save(tmp)
        (tmp / "train.json").write_text(json.dumps(record, indent=2))
