"""Stage 3: score every trained head on the ID test set and each OOD set, and write one
long-format Parquet file of metrics per head (DESIGN §3, paper "Uncertainty Metrics").

Each file is written whole to a temporary name, fsynced and renamed, so a killed run never
leaves a truncated Parquet file, and its sha256 goes beside it (``<file>.sha256``), so a damaged
file is found before any reader parses it and rebuilt by the next run; a head folder is checked
against the checksums in its ``train.json`` before it is scored."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from etn_cli.heads.base import Head, Prediction
from etn_cli.heads.calibration import fallback as temperature_fallback
from etn_cli.metrics.evaluation import (
    MetricValue,
    classification_metrics,
    confidence_metrics,
    ood_metrics,
    selective_metrics,
)
from etn_cli.metrics.reliability import reliability_bins
from etn_cli.own_features.classifier import classifier_record, describe
from etn_cli.own_features.folders import remember_plan_folders
from etn_cli.planning.plan import METRICS_VERSION, MetricsUnit, Plan, head_label
from etn_cli.provenance import code_version, etn_version, now
from etn_cli.stages.conformal_sets import (
    calibrate,
    id_results,
    measured_rows,
    ood_results,
    test_name,
)
from etn_cli.stages.evaluate_rows import row_columns
from etn_cli.stages.failure_records import recorded_failure
from etn_cli.stages.result import StageResult
from etn_cli.stages.train import check_plan_features, unit_name
from etn_cli.stages.units import Unit, build_units
from etn_cli.store.artefacts.damage import metrics_damage
from etn_cli.store.artefacts.headfiles import RECORD, check_head_folder
from etn_cli.store.artefacts.predictions import predictions_path, rows_frame
from etn_cli.store.artefacts.sealed import sidecar, write_sealed
from etn_cli.store.atomic import remove_tmp
from etn_cli.store.reading.consistency import check_varies
from etn_cli.store.reading.reader import read_split
from etn_cli.store.storage import explained_storage_errors

TIMING_REPEATS = 3  # timed predictions of the ID test set per head and seed


def evaluate(
    plan: Plan,
    *,
    device: str = "cpu",
    force: bool = False,
    fail_fast: bool = True,
) -> StageResult:
    """Write the metrics file of every head whose file is missing (or all, with ``force``). A
    head refusing the test or OOD data stops the stage (``fail_fast``) or is recorded as failed
    while the others are scored; a head whose training failed (its failure record, written by
    ``train`` in this run or an earlier command) is skipped, saying so."""
    read = cache(read_split)
    result = StageResult("evaluate", isolate=not fail_fast)
    heads: dict[str, Head] = {}

    def before(todo: list[MetricsFile]) -> None:
        check_plan_features(plan)
        remember_plan_folders(plan)  # a folder first read here is recorded as train records it
        for unit in todo:  # every checkpoint, before any write
            heads[unit.unit.key] = load_head(unit.unit)
        for split in (plan.test, *plan.ood):  # damaged shards are found before any lock
            read(split.path)
        check_varies(read(plan.test.path).logits, "ID test set", plan.test.path)  # every head's

    def score(unit: MetricsUnit) -> tuple[pl.DataFrame, pl.DataFrame]:
        return score_head(plan, unit, heads[unit.key], read, device)

    units = []
    for unit in plan.metrics:
        if (failed := recorded_failure(unit.head.path)) is not None:
            result.block(unit.path, unit_name(unit.head), "its head failed to train", failed)
        else:
            units.append(MetricsFile(unit, score))
    with explained_storage_errors():
        return build_units(units, result, force=force, before=before)


class MetricsFile(Unit):
    """A head's metrics file and, beside it, its per-row predictions: two sealed Parquet files
    (each with its ``.sha256``), built under both their locks."""

    why = "no intact metrics file with this key"

    def __init__(self, unit: MetricsUnit, score: Callable[[MetricsUnit], tuple]) -> None:
        self.unit, self.score = unit, score
        self.path, self.name = unit.path, unit_name(unit.head)
        self.rows_path = predictions_path(unit.path)

    def damage(self) -> str | None:
        return metrics_damage(self.path)

    def locks(self) -> list[Path]:
        return [self.path, self.rows_path]

    def clear(self) -> None:
        for part in self.locks():  # a killed run's half-written files
            remove_tmp(part)
            remove_tmp(sidecar(part))

    def write(self, force: bool) -> None:
        frame, rows = self.score(self.unit)
        write_sealed(self.rows_path, parquet_bytes(rows))  # first: see prediction_rows
        write_sealed(self.path, parquet_bytes(frame))


def load_head(unit: MetricsUnit) -> Head:
    """The unit's trained head, after checking its files against ``train.json``."""
    check_head_folder(unit.head.path)
    return Head.load(unit.head.path)


def score_head(
    plan: Plan, unit: MetricsUnit, head: Head, read: Any, device: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The head's metrics frame and its per-row predictions frame."""
    test = read(plan.test.path)
    id_pred, seconds = timed_predict(head, test, device)
    # repeats tell a real cost difference from timing noise (the report shows their spread)
    seconds = [seconds] + [timed_predict(head, test, device)[1] for _ in range(TIMING_REPEATS - 1)]
    correct = id_pred.predictions == test.labels
    rows = [
        ("id", plan.id_dataset, m)
        for m in classification_metrics(id_pred.probs, test.labels, id_pred.predictions)
        + confidence_metrics(id_pred.scores, correct)
        + selective_metrics(shown_scores(id_pred), correct)
        + reliability_bins(id_pred.probs.max(axis=1), correct)
    ]
    sets = calibrate(plan, head, read, device) if plan.pipeline.conformal else None
    id_sets: dict = {}
    if sets is not None:
        measured = measured_rows(plan, len(test.labels))
        found, id_sets = id_results(
            sets, id_pred.probs, test.index, test.labels, test_name(plan), measured
        )
        rows += [("id", plan.id_dataset, m) for m in found]
    parts = [("id", plan.id_dataset, row_columns(id_pred, test.index, test.labels, id_sets))]
    for ood in plan.ood:
        features = read(ood.path)
        ood_pred, _ = timed_predict(head, features, device)
        rows += [("ood", ood.name, m) for m in ood_metrics(id_pred.scores, ood_pred.scores)]
        ood_sets: dict = {}
        if sets is not None:
            found, ood_sets = ood_results(sets, ood_pred.probs, features.index, ood.name)
            rows += [("ood", ood.name, m) for m in found]
        parts.append(("ood", ood.name, row_columns(ood_pred, features.index, None, ood_sets)))
    timing = (test.manifest or {}).get("timing") or {}  # measured by extract; absent for BYOF
    meta = {
        "inference_s_per_sample": float(np.median(seconds)) / len(test.labels),
        "inference_s_repeats": [s / len(test.labels) for s in seconds],
        "n_test": len(test.labels),
        "backbone_s_per_sample": timing.get("forward_s_per_sample"),
        "backbone_passes": head.backbone_passes,
        "fit_split": json.loads((unit.head.path / RECORD).read_text()).get("fit_split"),
    }
    frame = metrics_frame(plan, unit, rows, meta, head)
    return frame, rows_frame(parts, row_provenance(frame))


def shown_scores(prediction: Prediction) -> dict[str, np.ndarray]:
    """The head's scores with ``mp`` the confidence a person is shown (the predictions file's
    ``confidence``, ``etn predict``'s ``probability``): the largest probability, after the
    temperature of a calibrated head. Selective prediction abstains by it; the OOD metrics keep
    the head's own scores (:mod:`etn_cli.heads.calibration`)."""
    if "mp" not in prediction.scores:
        return prediction.scores
    return prediction.scores | {"mp": np.asarray(prediction.probs, np.float64).max(axis=1)}


def row_provenance(frame: pl.DataFrame) -> dict[str, Any]:
    """The columns of the metrics frame that say whose rows these are and how they were made."""
    names = (
        "pipeline", "backbone", "id_dataset", "method", "method_label", "variant", "family",
        "seed", "sweep", "head_key", "metrics_key", "code_version", "etn_version",
        "metrics_version", "created_at",
    )  # fmt: skip
    return {name: frame[name][0] for name in names}


def timed_predict(head: Head, features: Any, device: str) -> tuple[Prediction, float]:
    started = time.perf_counter()
    prediction = head.predict(
        features.hidden, features.logits, layers=features.layers, device=device
    )
    return prediction, time.perf_counter() - started


def metrics_frame(
    plan: Plan,
    unit: MetricsUnit,
    rows: list[tuple[str, str, MetricValue]],
    meta: dict,
    fitted: Head,
) -> pl.DataFrame:
    head = unit.head
    label = head_label(plan.pipeline.heads[head.spec_index], fitted)  # ODIN: known after fit
    records = [
        {
            "pipeline": plan.pipeline.name,
            "backbone": plan.backbone_name,
            "id_dataset": plan.id_dataset,
            "eval_set": eval_set,
            "task": task,
            "method": head.head.name,
            "method_label": label,
            "variant": head.head.variant,
            "family": fitted.family,
            "ood_group": plan.groups.get(eval_set) if task == "ood" else None,
            "seed": head.seed,
            "metric": m.metric,
            "score": m.score,
            "value": None if m.value is None else float(m.value),
            "note": m.note,
        }
        for task, eval_set, m in rows
    ]
    spec = plan.pipeline.heads[head.spec_index]
    provenance_cols = {
        "sweep": json.dumps(spec.sweep, sort_keys=True),  # this head's point of a sweep, or {}
        "head_key": head.key,
        "metrics_key": unit.key,
        "config_hash": head.key,
        "code_version": code_version(),
        "etn_version": etn_version(),
        "metrics_version": METRICS_VERSION,
        "created_at": now(),
        "inference_s_per_sample": float(meta["inference_s_per_sample"]),
        "backbone_s_per_sample": meta["backbone_s_per_sample"],
        "backbone_passes": int(meta["backbone_passes"]),
        "n_test": int(meta["n_test"]),
        "fit_split": meta["fit_split"],  # the split the head was fitted on, with its rows
        # how a fitted temperature fell back to a rule (no finite NLL optimum), else None
        "fit_fallback": temperature_fallback(fitted.calibration_),
        # where the final layer a last-layer head started from came from (fitted, given, ...)
        "classifier": describe(classifier_record(plan.classifier_path))
        if head.head.needs_classifier
        else None,
    }
    frame = pl.DataFrame(
        records,
        schema_overrides={
            "score": pl.String, "note": pl.String, "value": pl.Float64, "ood_group": pl.String
        },
    )  # fmt: skip
    frame = frame.with_columns(pl.lit(v).alias(k) for k, v in provenance_cols.items())
    repeats = [float(s) for s in meta["inference_s_repeats"]]  # per sample, each timed run
    frame = frame.with_columns(
        pl.Series("inference_s_repeats", [repeats] * frame.height, pl.List(pl.Float64))
    )
    return frame.with_columns(
        pl.col("backbone_s_per_sample").cast(pl.Float64),
        pl.col("fit_split").cast(pl.String),
        pl.col("fit_fallback").cast(pl.String),
        pl.col("classifier").cast(pl.String),
    )


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    import io

    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    return buffer.getvalue()
