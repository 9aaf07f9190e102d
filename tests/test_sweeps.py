"""Sweeps over head settings: the grid a ``sweep`` table expands to, its labels and seeds, clear
errors, one cached head per point (adding a point reruns only that point), and the ablation
plots ``etn report`` draws from them."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from cli_runner import etn
from tiny_pipeline import BOTH_OOD, tiny_pipeline

from etn_cli.errors import EtnError
from etn_cli.planning.pipeline import parse_pipeline
from etn_cli.planning.plan import make_plan

BASE = {
    "name": "s",
    "seeds": [0, 1],
    "backbone": {"name": "digits_cnn"},
    "data": {"id": "digits", "ood": ["digits_unseen"]},
}


def _pipeline(*heads: dict):
    return parse_pipeline(BASE | {"heads": list(heads)}, Path("/tmp/s.toml"))


def test_a_sweep_expands_to_the_grid_of_its_values():
    pipeline = _pipeline(
        {"name": "etn", "epochs": 2, "sweep": {"prior_mode": [1, 10, 100], "mc_samples": [1, 20]}}
    )
    points = [spec.sweep for spec in pipeline.heads]
    assert len(points) == 6
    assert {"prior_mode": 100, "mc_samples": 1} in points
    assert all(spec.settings["epochs"] == 2 for spec in pipeline.heads)
    assert all(spec.settings["prior_mode"] == spec.sweep["prior_mode"] for spec in pipeline.heads)


def test_each_point_is_its_own_head_with_a_readable_label(tmp_path):
    pipeline = _pipeline(
        {"name": "etn", "sweep": {"variant": ["scalar", "vector"], "kl_weight": [0.1, 1.0]}},
        {"name": "map"},
    )
    plan = make_plan(pipeline, tmp_path)
    labels = sorted({unit.label for unit in plan.heads})
    assert labels == [
        "ETN (kl_weight=0.1)",
        "ETN (kl_weight=1.0)",
        "ETN (vector) (kl_weight=0.1)",
        "ETN (vector) (kl_weight=1.0)",
        "MAP",
    ]
    # 4 ETN points x 2 seeds, and MAP once (seed-free)
    assert len({unit.key for unit in plan.heads}) == len(plan.heads) == 9


def test_a_swept_seed_replaces_the_pipeline_seeds_for_that_head(tmp_path):
    pipeline = _pipeline({"name": "etn", "sweep": {"seed": [5, 6, 7]}}, {"name": "map"})
    plan = make_plan(pipeline, tmp_path)
    seeds = {(unit.head.name, unit.seed) for unit in plan.heads}
    assert seeds == {("etn", 5), ("etn", 6), ("etn", 7), ("map", 0)}  # MAP is seed-free


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ([1, 2], "sweep must be a table"),
        ({"prior_mode": 5}, "sweep.prior_mode must be a non-empty list"),
        ({"prior_mode": []}, "sweep.prior_mode must be a non-empty list"),
        ({"prior_mode": [5, 5]}, "distinct values"),
        ({"epochs": [1, 2]}, "sets epochs both as a setting and in sweep"),
        ({"seed": [1.5]}, "seeds must be a non-empty list of integers"),
    ],
)
def test_a_bad_sweep_is_a_one_line_error(sweep, message):
    with pytest.raises(EtnError, match=message) as info:
        _pipeline({"name": "etn", "epochs": 2, "sweep": sweep})
    assert "\n" not in str(info.value)


def test_an_unknown_swept_setting_is_caught_when_planning(tmp_path):
    pipeline = _pipeline({"name": "etn", "sweep": {"prior_mdoe": [1, 2]}})
    with pytest.raises(EtnError, match="prior_mdoe"):
        make_plan(pipeline, tmp_path)


def sweep(modes: list[int]) -> str:
    etn = {"name": "etn", "epochs": 2, "batch_size": 64, "sweep": {"prior_mode": modes}}
    static = {"name": "static", "epochs": 2, "batch_size": 64}
    static["sweep"] = {"variant": ["scalar", "vector", "matrix"]}
    return tiny_pipeline(
        "sweep", seeds=(0, 1), backbone={"epochs": 3}, data={"ood": BOTH_OOD}, heads=(etn, static)
    )


def _etn(*args) -> str:
    code, output = etn(*args)
    assert code == 0, output
    return output


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    pipeline = root / "sweep.toml"
    pipeline.write_text(sweep([1, 10]))
    output = _etn("run", pipeline, "--data-dir", root / "data", "--format", "markdown")
    return pipeline, root / "data", output


def test_sweep_run_writes_rows_that_name_their_point(swept):
    _, data, output = swept
    assert "| ETN (prior_mode=1) |" in output and "| Static scaling (matrix) |" in output
    frame = pl.concat(
        [pl.read_parquet(p) for p in (data / "metrics" / "sweep").glob("*.parquet")],
        how="diagonal_relaxed",
    )
    points = {json.loads(s).get("prior_mode") for s in frame["sweep"]}
    assert points == {1, 10, None}
    assert set(frame.filter(pl.col("method") == "static")["variant"]) == {
        "scalar",
        "vector",
        "matrix",
    }


def test_sweep_report_draws_png_and_pdf_plots_per_method_and_setting_and_figure_1(swept):
    _, data, _ = swept
    folder = data / "reports" / "sweep"
    for stem in ("sweep-etn-prior_mode", "sweep-static-variant", "frontier-aupr"):
        assert (folder / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (folder / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"


def test_adding_a_sweep_point_trains_only_that_point_and_redraws_the_plot(swept):
    pipeline, data, _ = swept
    plot = data / "reports" / "sweep" / "sweep-etn-prior_mode.png"
    before = plot.stat().st_mtime_ns
    rerun = _etn("run", pipeline, "--data-dir", data)
    assert "train: 0 built, 10 up to date" in rerun
    assert plot.stat().st_mtime_ns == before  # unchanged metrics: no redraw

    pipeline.write_text(sweep([1, 10, 100]))
    output = _etn("run", pipeline, "--data-dir", data, "--format", "markdown")
    assert "train: 2 built, 10 up to date" in output  # one new point x 2 seeds
    assert "evaluate: 2 built, 10 up to date" in output
    assert "| ETN (prior_mode=100) |" in output
    assert plot.stat().st_mtime_ns > before
