"""The numbers behind a reliability diagram (Guo et al. 2017, Fig. 1; DeGroot & Fienberg 1983).

The ID test predictions are put into the 15 equal-width confidence bins ``(lo, hi]`` that ECE
uses (:func:`etn_cli.metrics.evaluation.expected_calibration_error`); per bin ``b`` the
metrics file gets three rows with ``score = "bin01"`` … ``"bin15"``:

* ``bin_count``: the number of predictions whose confidence (max probability) falls in it;
* ``bin_confidence``: their mean confidence;
* ``bin_accuracy``: the share of them that is correct.

An empty bin has a count of 0 and null confidence and accuracy. ``ECE = sum_b n_b / N
|bin_accuracy_b - bin_confidence_b|``, so the diagram and the ECE column tell one story;
``etn report`` pools the seeds by count and draws ``reliability.png`` / ``.pdf``.
"""

from __future__ import annotations

import numpy as np

from etn_cli.metrics.evaluation import ECE_BINS, MetricValue

RELIABILITY_METRICS = ("bin_count", "bin_confidence", "bin_accuracy")


def bin_name(index: int) -> str:
    """``bin01`` for the lowest of the 15 bins, ``bin15`` for ``(14/15, 1]``."""
    return f"bin{index + 1:02d}"


def confidence_bins(confidence: np.ndarray) -> np.ndarray:
    """The bin index (0..14) of each confidence (N,), ``(lo, hi]`` as for ECE."""
    bins = np.ceil(np.asarray(confidence, dtype=np.float64) * ECE_BINS).astype(np.int64) - 1
    return np.clip(bins, 0, ECE_BINS - 1)


def reliability_bins(confidence: np.ndarray, correct: np.ndarray) -> list[MetricValue]:
    """Per bin: count, mean confidence and accuracy of ``confidence`` (N,) and ``correct`` (N,)."""
    bins = confidence_bins(confidence)  # (N,)
    count = np.bincount(bins, minlength=ECE_BINS)  # (B,)
    conf_sum = np.bincount(bins, weights=confidence, minlength=ECE_BINS)  # (B,)
    right = np.bincount(bins, weights=np.asarray(correct, np.float64), minlength=ECE_BINS)
    rows = []
    for b in range(ECE_BINS):
        n = int(count[b])
        rows += [
            MetricValue("bin_count", bin_name(b), float(n)),
            MetricValue("bin_confidence", bin_name(b), conf_sum[b] / n if n else None),
            MetricValue("bin_accuracy", bin_name(b), right[b] / n if n else None),
        ]
    return rows
