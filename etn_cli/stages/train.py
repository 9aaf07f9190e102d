"""Stage 2: fit every head of the pipeline, per seed, on the cached adaptation features (or,
for heads that estimate ID statistics, on the pipeline's ``fit`` split when it has one).

Each head is a unit (:mod:`etn_cli.stages.units`): its files (``head.json``,
``weights.safetensors``) are written into a private folder, sealed by ``train.json`` with their
checksums and renamed into place when complete; ``--force`` builds a new folder and swaps it
in. Before any head is fitted, the pipeline's splits are checked to fit together.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch

from etn_cli import progress
from etn_cli.config import config_dict
from etn_cli.own_features.classifier import classifier_for, classifier_record
from etn_cli.own_features.folders import remember_plan_folders
from etn_cli.planning.plan import FeatureUnit, HeadUnit, Plan
from etn_cli.provenance import provenance
from etn_cli.stages.head_inputs import check_head_inputs, own_classifier
from etn_cli.stages.result import StageResult
from etn_cli.stages.units import Unit, build_units
from etn_cli.store.artefacts.damage import head_damage
from etn_cli.store.artefacts.headfiles import CHECKED_FILES, RECORD
from etn_cli.store.reading.consistency import check_splits, check_varies
from etn_cli.store.reading.reader import Features, read_split
from etn_cli.store.storage import explained_storage_errors


def check_plan_features(plan: Plan) -> None:
    """The adaptation, test, OOD and calibration splits fit together (one backbone, labels in
    range, ...)."""
    calibration = plan.calibration.path if plan.calibration is not None else None
    check_splits(plan.adapt.path, plan.test.path, {u.name: u.path for u in plan.ood}, calibration)


def train(
    plan: Plan, *, device: str = "cpu", force: bool = False, fail_fast: bool = True
) -> StageResult:
    """Fit every missing head unit; finished heads are left untouched unless ``force``. A head
    refusing its data stops the stage (``fail_fast``) or is recorded as failed while the other
    heads are fitted."""
    result = StageResult("train", isolate=not fail_fast)
    for line in plan.skipped:  # heads left out for want of an input ([features] pipelines)
        progress.say(f"train: {line}")
    features_of = {u.role: u for u in (plan.adapt, plan.fit) if u is not None}
    reader = cache(lambda role: _fit_features(features_of[role]))

    own = own_classifier(plan, reader)  # your own features': the first unit, when used

    def before(todo: list[Unit]) -> None:  # every input checked before any fit
        check_plan_features(plan)
        heads = [u.unit for u in todo if isinstance(u, TrainedHead)]
        check_head_inputs(plan, heads, reader("adapt"), own if own in todo else None)
        remember_plan_folders(plan)

    units = [TrainedHead(plan, unit, reader, device) for unit in plan.heads]
    units = [own, *units] if own is not None else units
    with explained_storage_errors():
        return build_units(units, result, force=force, before=before)


class TrainedHead(Unit):
    """A head fitted on its split, in a folder sealed by its ``train.json``."""

    why = "no finished head with this key"
    again = "Retraining {name}."  # derived: retrained, never used damaged
    record = RECORD
    sealed_files = CHECKED_FILES

    def __init__(self, plan: Plan, unit: HeadUnit, reader: Callable, device: str) -> None:
        self.plan, self.unit, self.reader, self.device = plan, unit, reader, device
        self.path, self.name = unit.path, unit_name(unit)

    def damage(self) -> str | None:
        return head_damage(self.path)

    def build(self, folder: Path) -> dict[str, Any]:
        features = self.reader(self.plan.fit_unit(self.unit.head).role)
        return fit_and_save(self.plan, self.unit, features, self.device, folder)


def unit_name(unit: HeadUnit) -> str:
    """How a head unit is named in progress lines: ``ETN seed 0``."""
    return f"{unit.label} seed {unit.seed}"


def _fit_features(unit: FeatureUnit) -> Features:
    features = read_split(unit.path)
    what = "adaptation set" if unit.role == "adapt" else f"fit split {unit.name}"
    check_varies(features.logits, what, unit.path)
    return features


def fit_and_save(
    plan: Plan, unit: HeadUnit, adapt: Features, device: str, folder: Path
) -> dict[str, Any]:
    """Fit ``unit``'s head on ``adapt`` (the features of ``plan.fit_unit(head)``), save it into
    ``folder`` and return its ``train.json`` record, which names the split it was fitted on
    (``fit_split``)."""
    head = unit.head.build()  # the live head, from the plan's spec
    classifier = None
    if head.needs_classifier:
        weight, bias = classifier_for(plan)  # the backbone's, given, or fitted (own features)
        classifier = {"weight": torch.as_tensor(weight), "bias": torch.as_tensor(bias)}
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:  # each said in one line, below
        warnings.simplefilter("always")
        head.fit(
            adapt.hidden,
            adapt.logits,
            adapt.labels,
            classifier=classifier,
            layers=adapt.layers,
            device=device,
        )
    seconds = time.perf_counter() - started
    for warning in caught:  # a fallback or an ignored setting, without Python's source line
        progress.say(f"warning: {unit_name(unit)}: {warning.message}")
    record = {
        "head": unit.head.name,
        "label": unit.label,
        "key": unit.key,
        "config": config_dict(head.config),
        "calibration": head.calibration_,  # the fitted temperature, when calibrated
        "selection": head.selection_,  # trained heads: the rule and the epoch it kept
        "adapt_features": str(plan.fit_unit(unit.head).path),
        "adapt_key": adapt.key,
        "adapt_rows": len(adapt.labels),
        "fit_split": fit_split_label(plan, unit.head, len(adapt.labels)),
        "train_seconds": seconds,
        "device": device,
        "pipeline": plan.pipeline.name,
        "provenance": provenance(),
    }
    if head.needs_classifier:
        record["classifier"] = classifier_record(plan.classifier_path)
    head.save(folder)
    return record


def fit_split_label(plan: Plan, head: object, rows: int) -> str:
    """Which split a head was fitted on, as the report's footnote names it:
    ``digits:train (760 rows)`` or ``digits:adapt (190 rows)``."""
    unit = plan.fit_unit(head)
    name = unit.name if unit.role == "fit" else f"{plan.id_dataset}:{unit.split or 'adapt'}"
    return f"{name} ({rows:,} rows)"
