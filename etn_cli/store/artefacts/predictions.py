"""The per-row predictions ``etn evaluate`` keeps beside each metrics file, so that a paired
test (``etn report --compare``) and the risk–coverage curves can resample the very rows the
metrics were computed on.

``<data>/predictions/<pipeline>/<head>-<key>.parquet``, with the key of its metrics file, one
row per (eval set, sample):

* ``eval_set``, ``task`` (``"id"`` for the ID test set, ``"ood"`` for an OOD set), ``row`` (the
  sample's position in its source split, the shards' ``index``);
* ``prediction``, ``confidence`` (its probability, the max probability);
* on the ID test set only (null on OOD rows): ``label``, ``correct``, ``nll``
  (``-log max(p_y, 1e-12)``) and ``brier`` (``sum_i (p_i - [i = y])^2``), whose means are the
  metrics file's values;
* ``score_<name>`` for every score of the head, as the head gives it (not oriented);
* with a ``[conformal]`` section, ``set_size`` and (ID rows) ``covered``: the size of the
  conformal prediction set and whether it holds the label;
* the provenance of the metrics file (pipeline, method, label, seed, ``metrics_key``, code and
  etn versions, time of writing), so every row says how it was made.

The file is sealed like the metrics file (a ``.sha256`` sidecar checked before parsing) and
written first: a metrics file is only ever beside its predictions. The columns of one eval set
come from :func:`etn_cli.stages.evaluate_rows.row_columns`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from etn_cli.errors import EtnError
from etn_cli.store.artefacts.sealed import read_sealed
from etn_cli.store.artefacts.unitkey import check_recorded_key

PREDICTIONS = "predictions"  # the folder beside <data>/metrics
SCORE_PREFIX = "score_"


def predictions_path(metrics_path: Path) -> Path:
    """``<data>/predictions/<pipeline>/<file>`` for ``<data>/metrics/<pipeline>/<file>``."""
    metrics_path = Path(metrics_path)
    return metrics_path.parents[2] / PREDICTIONS / metrics_path.parent.name / metrics_path.name


ROW_TYPES = {
    "row": pl.Int64, "prediction": pl.Int64, "confidence": pl.Float64, "label": pl.Int64,
    "correct": pl.Boolean, "nll": pl.Float64, "brier": pl.Float64, "set_size": pl.Int64,
    "covered": pl.Boolean,
}  # fmt: skip


def rows_frame(parts: list[tuple[str, str, dict]], provenance: dict[str, Any]) -> pl.DataFrame:
    """One frame of every ``(task, eval_set, columns)`` part, with the provenance columns."""
    frames = []
    for task, eval_set, columns in parts:
        n = len(columns["row"])
        data = {k: (pl.Series(k, [None] * n, ROW_TYPES[k]) if v is None else v)
                for k, v in columns.items()}  # fmt: skip
        frame = pl.DataFrame(data).with_columns(
            pl.lit(eval_set).alias("eval_set"), pl.lit(task).alias("task")
        )
        unmeasured = [c for c in ("set_size", "covered") if frame.schema.get(c) == pl.Float64]
        frame = frame.with_columns(pl.col(unmeasured).fill_nan(None))  # rows that calibrated
        frames.append(frame.cast({k: t for k, t in ROW_TYPES.items() if k in frame.columns}))
    frame = pl.concat(frames, how="diagonal_relaxed")
    first = ["eval_set", "task"]
    frame = frame.select(*first, *(c for c in frame.columns if c not in first))
    return frame.with_columns(pl.lit(v).alias(k) for k, v in provenance.items())


def read_rows(path: Path) -> pl.DataFrame:
    """A predictions file, after checking its bytes against its sidecar."""
    import io

    data = read_sealed(path, legacy_ok=False)
    try:
        frame = pl.read_parquet(io.BytesIO(data))
    except (OSError, pl.exceptions.PolarsError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise EtnError(
            f"Predictions file {path} is not a readable Parquet file ({first}). Delete it and "
            "run etn evaluate (or etn run) again."
        ) from None
    if "metrics_key" in frame.columns:
        keys = frame["metrics_key"].unique(maintain_order=True).to_list()
        fix = "Run etn evaluate (or etn run) on its pipeline to rebuild it."
        check_recorded_key(Path(path), keys, f"Predictions file {path}", fix)
    return frame
