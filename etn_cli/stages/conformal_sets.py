"""A pipeline's ``[conformal]`` section at work: calibrate a trained head's threshold on the
calibration rows and build the prediction sets of any rows (``etn evaluate``, ``etn predict``).

The calibration rows are the plan's ``calibration`` features (the held-out part of the
adaptation split, or a split of their own) or, with ``split = "test"``, a held-out part of
the test split, whose other rows then measure the sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from etn_cli import progress
from etn_cli.datasets.base import held_out
from etn_cli.metrics.conformal import (
    label_scores,
    prediction_sets,
    threshold,
    uniforms,
)
from etn_cli.metrics.evaluation import MetricValue
from etn_cli.planning.pipeline import ConformalSpec
from etn_cli.store.reading.consistency import CALIBRATION, SplitInfo, check_labels


@dataclass
class Calibrated:
    """A head's conformal threshold ``q`` from ``n`` calibration rows."""

    spec: ConformalSpec
    q: float
    n: int

    def draws(self, rows: np.ndarray, name: str) -> np.ndarray:
        """The uniform draw of each row (zeros where the sets are not randomised)."""
        if self.spec.method == "lac" or not self.spec.randomized:
            return np.zeros(len(rows))
        return uniforms(rows, self.spec.seed, name)

    def sets(self, probs: np.ndarray, rows: np.ndarray, name: str) -> np.ndarray:
        """Membership (N, C) of the sets of ``probs`` (N, C) for the rows ``rows`` of the
        eval set ``name``."""
        spec = self.spec
        u = self.draws(rows, name)
        return prediction_sets(
            probs, self.q, spec.method, u, spec.penalty, spec.k_reg, spec.allow_zero_sets
        )

    def note(self) -> str | None:
        if np.isfinite(self.q):
            return None
        return (
            f"{self.n} calibration rows are too few for alpha = {self.spec.alpha}: every set "
            f"holds every class (needs n >= {int(np.ceil(1 / self.spec.alpha)) - 1})"
        )


def test_name(plan: Any) -> str:
    return f"{plan.id_dataset}:{plan.test.split or 'test'}"


def measured_rows(plan: Any, n_test: int) -> np.ndarray:
    """Which test rows the sets are measured on (N,): all, or with ``split = "test"`` those
    not held out to calibrate."""
    spec = plan.pipeline.conformal
    if plan.calibration is not None:
        return np.ones(n_test, dtype=bool)
    return ~held_out(n_test, spec.holdout, spec.seed)


def calibrate(plan: Any, head: Any, read: Any, device: str) -> Calibrated:
    """The head's threshold on the plan's calibration rows (``read`` reads a feature folder)."""
    spec = plan.pipeline.conformal
    if plan.calibration is not None:
        features = read(plan.calibration.path)
        keep, name = np.ones(len(features.labels), dtype=bool), plan.calibration.name
    else:
        features = read(plan.test.path)
        keep, name = ~measured_rows(plan, len(features.labels)), test_name(plan)
    layers = {k: v[keep] for k, v in (features.layers or {}).items()}
    predicted = head.predict(
        features.hidden[keep], features.logits[keep], layers=layers, device=device
    )
    rows, labels = features.index[keep], features.labels[keep]
    where = plan.calibration.path if plan.calibration is not None else plan.test.path
    classes = predicted.probs.shape[1]
    check_labels(SplitInfo(CALIBRATION, where, len(labels), -1, classes, None, []), labels, False)
    model = Calibrated(spec, float("inf"), len(labels))
    u = model.draws(rows, name)
    scores = label_scores(predicted.probs, labels, spec.method, u, spec.penalty, spec.k_reg)
    model.q = threshold(scores, spec.alpha)
    if (note := model.note()) is not None:  # degenerate sets: said, not only footnoted
        progress.say(f"warning: {head.display_label} conformal sets calibrated on {name}: {note}")
    return model


def id_results(
    model: Calibrated, probs: np.ndarray, rows: np.ndarray, labels: np.ndarray, name: str,
    measured: np.ndarray,
) -> tuple[list[MetricValue], dict[str, np.ndarray]]:  # fmt: skip
    """Coverage, mean set size and the threshold on the measured ID test rows, and the
    ``set_size`` and ``covered`` columns of the predictions file (null where not measured)."""
    member = model.sets(probs, rows, name)
    size = member.sum(axis=1).astype(np.float64)
    covered = member[np.arange(len(labels)), labels].astype(np.float64)
    note = model.note()
    metrics = [
        MetricValue("coverage", None, float(covered[measured].mean()), note),
        MetricValue("set_size", None, float(size[measured].mean()), note),
        MetricValue("conformal_threshold", None, model.q if np.isfinite(model.q) else None, note),
    ]
    columns = {
        "set_size": np.where(measured, size, np.nan),
        "covered": np.where(measured, covered, np.nan),
    }
    return metrics, columns


def ood_results(
    model: Calibrated, probs: np.ndarray, rows: np.ndarray, name: str
) -> tuple[list[MetricValue], dict[str, np.ndarray]]:
    """The mean set size on an OOD set, and its ``set_size`` column."""
    size = model.sets(probs, rows, name).sum(axis=1).astype(np.float64)
    return [MetricValue("set_size", None, float(size.mean()), model.note())], {"set_size": size}
