"""The ``[data] fit`` split end to end on the digits default: a seeded subsample extracted into
the cache, used by the heads that estimate ID statistics and recorded wherever they report;
``[data.groups]`` averaged in the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from cli_runner import etn
from tiny_pipeline import BOTH_OOD, tiny_pipeline

from etn_cli.datasets.digits import id_split_rows
from etn_cli.store.reading.reader import read_split


def fitted(rows: int) -> str:
    groups = {"semantic": ["digits_unseen"], "covariate": ["digits_noise"]}
    data = {"ood": BOTH_OOD, "fit": "train", "fit_rows": rows, "groups": groups}
    heads = ("msp", {"name": "knn", "k": 5}, "vim")
    return tiny_pipeline("fitted", seeds=(0, 1), backbone={"epochs": 3}, data=data, heads=heads)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("fit")
    pipeline = root / "fitted.toml"
    pipeline.write_text(fitted(120))
    code, output = etn("run", pipeline, "-d", root / "data", "-f", "md", "--metric", "auroc")
    assert code == 0, output
    return pipeline, root / "data", output


def head_records(data: Path) -> dict[str, dict]:
    records = [json.loads(p.read_text()) for p in (data / "heads").glob("*/train.json")]
    return {r["head"]: r for r in records}


def test_fit_rows_extracts_a_seeded_subsample_of_the_train_split(run) -> None:
    _, data, _ = run
    folder = next(p for p in (data / "features").glob("*/digits.train-*") if p.is_dir())
    features = read_split(folder)
    assert len(features.labels) == 120
    assert set(features.index) <= set(id_split_rows()["train"].tolist())
    assert np.all(np.diff(features.index) > 0)  # kept in source order, no repeats


def test_heads_with_id_statistics_fit_on_the_fit_split_the_others_on_adapt(run) -> None:
    _, data, _ = run
    records = head_records(data)
    assert records["knn"]["fit_split"] == "digits:train (120 rows)"
    assert records["vim"]["fit_split"] == "digits:train (120 rows)"
    assert records["map"]["fit_split"].startswith("digits:adapt (")
    assert len(list((data / "heads").glob("*/train.json"))) == 3  # seed-free: one fit each
    frame = pl.read_parquet(next((data / "metrics" / "fitted").glob("knn-*.parquet")))
    assert frame["fit_split"].unique().to_list() == ["digits:train (120 rows)"]
    assert {"aupr", "auroc", "aupr_in", "aupr_out", "fpr95", "fpr95_id"} <= set(frame["metric"])


def test_the_report_names_the_fit_splits_and_averages_each_group(run) -> None:
    _, _, output = run
    assert "Fitted on digits:train (120 rows): 2 methods; digits:adapt (" in output
    assert "semantic-OOD" in output and "covariate-OOD" in output and "digits-OOD" in output
    assert "X-OOD: the mean over group X's sets." in output
    own = [line for line in output.splitlines() if line.startswith("| KNN")][0]
    assert "–" not in own.split("|")[-3]  # the Own column holds KNN's own score


def test_a_new_fit_rows_refits_only_the_heads_that_read_it(run, tmp_path: Path) -> None:
    pipeline, data, _ = run
    pipeline.write_text(fitted(90))
    code, output = etn("run", pipeline, "-d", data)
    assert code == 0, output
    assert "extract: 1 built, 5 up to date" in output  # 4 splits and the classifier kept
    assert "train: 2 built, 1 up to date" in output  # knn and vim; msp reads adapt
