"""The bootstrap behind paired comparisons (:mod:`etn_cli.report.paired`): resamples that
every method shares, and each method's metrics recomputed from its per-row predictions
(:mod:`etn_cli.store.artefacts.predictions`) under them, with
:mod:`etn_cli.metrics.weighted`. At full weights the metrics are the metrics files' values."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from etn_cli.errors import EtnError
from etn_cli.metrics.ranking import RANKING_METRICS
from etn_cli.metrics.scores import id_score
from etn_cli.metrics.selective import SELECTIVE_METRICS, selective_values
from etn_cli.metrics.weighted import weighted_calibration, weighted_mean, weighted_ranking
from etn_cli.report.tables import METHOD
from etn_cli.store.artefacts.predictions import SCORE_PREFIX, read_rows

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0
CALIBRATION = ("acc", "ece", "nll", "brier")
CONFORMAL = ("coverage", "set_size")
COMPARED = (*CALIBRATION, *RANKING_METRICS, *SELECTIVE_METRICS, *CONFORMAL)


@dataclass
class Resamples:
    """The bootstrap draws every method shares: per eval set, the multiplicity of each of its
    rows in each replicate (row 0: the full data); per number of seeds, the seeds drawn."""

    samples: int = BOOTSTRAP_SAMPLES
    seed: int = BOOTSTRAP_SEED
    _rows: dict = field(default_factory=dict)
    _seeds: dict = field(default_factory=dict)

    def rows(self, eval_set: str, size: int) -> np.ndarray:
        """(B + 1, size): ones, then B multinomial draws of ``size`` rows."""
        if (eval_set, size) not in self._rows:
            rng = np.random.default_rng([self.seed, zlib.crc32(eval_set.encode())])
            draws = rng.multinomial(size, np.full(size, 1.0 / size), size=self.samples)
            self._rows[eval_set, size] = np.vstack([np.ones(size), draws]).astype(np.float64)
        return self._rows[eval_set, size]

    def seeds(self, count: int) -> np.ndarray:
        """(B, count) indices of the seeds each replicate draws."""
        if count not in self._seeds:
            rng = np.random.default_rng([self.seed, 7, count])
            self._seeds[count] = rng.integers(0, count, size=(self.samples, count))
        return self._seeds[count]


class Predictions:
    """One method's per-row predictions for one seed, each eval set ordered by row, with its
    metrics under the shared resamples (cached)."""

    def __init__(self, frame: pl.DataFrame, id_dataset: str, averages: dict[str, list[str]]):
        self.sets = {
            name: part.sort("row")
            for (name,), part in frame.partition_by("eval_set", as_dict=True).items()
        }
        self.id_dataset = id_dataset
        self.averages = averages
        self._cache: dict[tuple, dict[str, np.ndarray]] = {}

    def rows(self, eval_set: str) -> np.ndarray:
        return self.sets[eval_set]["row"].to_numpy()

    def has(self, task: str, eval_set: str, metric: str, score: str | None) -> bool:
        sets = self.averages.get(eval_set, [eval_set]) if task == "ood" else [eval_set]
        column = None if score is None else SCORE_PREFIX + score
        column = "set_size" if metric in CONFORMAL else column
        return all(
            s in self.sets and (column is None or column in self.sets[s].columns) for s in sets
        )

    def value(self, task: str, eval_set: str, metric: str, score: str | None, draws: Resamples):
        """The metric under every replicate, (B + 1,) (first: the full data)."""
        if task == "ood" and eval_set in self.averages:
            parts = [self.value(task, s, metric, score, draws) for s in self.averages[eval_set]]
            return np.mean(parts, axis=0)
        family = next(f for f, names in FAMILIES.items() if metric in names)
        key = (task, eval_set, family, score)
        if key not in self._cache:
            self._cache[key] = self._compute(task, eval_set, family, score, draws)
        return self._cache[key][metric]

    def _score(self, eval_set: str, score: str) -> np.ndarray:
        return id_score(score, self.sets[eval_set][SCORE_PREFIX + score].to_numpy())

    def _compute(self, task, eval_set, family, score, draws) -> dict[str, np.ndarray]:
        test = self.sets[self.id_dataset]
        w_id = draws.rows(self.id_dataset, test.height)
        if task == "id":
            correct = test["correct"].to_numpy()
            if family == "calibration":
                columns = [test[c].to_numpy() for c in ("correct", "confidence", "nll", "brier")]
                return weighted_calibration(*columns, w_id)
            if family == "ranking":
                return weighted_ranking(correct, self._score(eval_set, score), w_id)
            if family == "selective":  # by the confidence shown, as evaluate ranks
                shown = test["confidence"].to_numpy() if score == "mp" else None
                return selective_values(
                    self._score(eval_set, score) if shown is None else shown, correct, w_id
                )
            return {
                name: weighted_mean(test[column].cast(pl.Float64).to_numpy(), w_id)
                for name, column in (("coverage", "covered"), ("set_size", "set_size"))
            }
        other = self.sets[eval_set]
        w_ood = draws.rows(eval_set, other.height)
        if family == "conformal":
            return {"set_size": weighted_mean(other["set_size"].cast(pl.Float64).to_numpy(), w_ood)}
        labels = np.r_[np.ones(test.height), np.zeros(other.height)]
        scores = np.r_[self._score(self.id_dataset, score), self._score(eval_set, score)]
        return weighted_ranking(labels, scores, np.hstack([w_id, w_ood]))


FAMILIES = {
    "calibration": CALIBRATION,
    "ranking": RANKING_METRICS,
    "selective": SELECTIVE_METRICS,
    "conformal": CONFORMAL,
}


def load_predictions(
    paths: list[Path], metrics: pl.DataFrame
) -> dict[tuple, dict[int, Predictions]]:
    """Per method key (:data:`~etn_cli.report.tables.METHOD`) and seed, the predictions of
    the files at ``paths`` (each beside a metrics file of ``metrics``)."""
    id_dataset = metrics["id_dataset"][0]
    averages = ood_averages(metrics)
    found: dict[tuple, dict[int, Predictions]] = {}
    reference_rows = None
    for path in paths:
        if not Path(path).is_file():
            raise EtnError(
                f"Paired comparisons need the per-row predictions {path}, which is missing. Run "
                "etn evaluate --force (or delete the metrics file and etn run) to write it."
            )
        frame = read_rows(path)
        key = tuple(frame[c][0] for c in METHOD)
        predictions = Predictions(frame, id_dataset, averages)
        rows = predictions.rows(id_dataset)
        if reference_rows is None:
            reference_rows = rows
        elif not np.array_equal(rows, reference_rows):
            raise EtnError(
                f"{path} holds other ID test rows than the other predictions files: they were "
                "not evaluated on one test set, so they cannot be paired. Re-run etn evaluate."
            )
        found.setdefault(key, {})[int(frame["seed"][0])] = predictions
    return found


def ood_averages(metrics: pl.DataFrame) -> dict[str, list[str]]:
    """The averaged OOD eval sets the summary shows and the sets each averages:
    ``<id>-OOD`` (every set, when there are two or more) and ``<group>-OOD`` per group."""
    ood = metrics.filter(pl.col("task") == "ood").select("id_dataset", "eval_set", "ood_group")
    sets = ood["eval_set"].unique(maintain_order=True).to_list()
    averages = {}
    if len(sets) >= 2:
        averages[f"{metrics['id_dataset'][0]}-OOD"] = sets
    for group, members in ood.drop_nulls("ood_group").group_by("ood_group", maintain_order=True):
        averages[f"{group[0]}-OOD"] = members["eval_set"].unique(maintain_order=True).to_list()
    return averages
