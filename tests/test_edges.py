"""Results at every edge (issue 40): inputs at the limits of what a command can do are one
line and exit 2 before any work, never a traceback or a silently wrong figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_bad_inputs import byof_pipeline, etn


def test_compare_when_the_compared_method_is_the_only_one_is_one_line(tmp_path, capsys) -> None:
    pipeline, data = byof_pipeline(tmp_path), tmp_path / "data"
    assert etn(capsys, "run", pipeline, "-d", data, "--only", "map")[0] == 0
    code, err = etn(capsys, "report", pipeline, "-d", data, "--only", "map", "--compare", "map")
    assert code == 2 and err.count("\n") == 1, err
    assert "--compare needs two methods or more" in err and "'MAP' only" in err


@pytest.mark.parametrize("replicates", ["1000000000000", "100001"])
def test_a_bootstrap_beyond_what_fits_in_memory_is_one_line(tmp_path, capsys, replicates) -> None:
    pipeline = byof_pipeline(tmp_path)
    code, err = etn(capsys, "report", pipeline, "--compare", "map", "--bootstrap", replicates)
    assert code == 2 and err.count("\n") == 1 and "--bootstrap" in err, err
    assert not (tmp_path / "data").exists()


def test_a_pipeline_name_too_long_for_a_folder_is_one_line(tmp_path: Path, capsys) -> None:
    long = byof_pipeline(tmp_path).rename(tmp_path / f"{'p' * 250}.toml")
    long.write_text(long.read_text().replace('name = "byof"\n', ""))  # named by its stem
    code, err = etn(capsys, "run", long, "-d", tmp_path / "data", "--set", "heads.map.seed=1")
    assert code == 2 and err.count("\n") == 1, err
    assert "name is 250 characters long; expected at most 200" in err


@pytest.mark.parametrize("folder", ["metrics/byof", "heads", "predictions/byof"])
def test_predict_refuses_to_write_into_a_folder_etn_manages(tmp_path, capsys, folder) -> None:
    from etn_cli.errors import EtnError
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan
    from etn_cli.stages.predict import predict

    pipeline, data = byof_pipeline(tmp_path), tmp_path / "data"
    assert etn(capsys, "run", pipeline, "-d", data, "--only", "map")[0] == 0
    sealed = next((data / "metrics" / "byof").glob("*.parquet"))
    before = sealed.read_bytes()
    target = sealed if folder == "metrics/byof" else data / folder / "mine.parquet"
    plan = make_plan(load_pipeline(pipeline), data)
    with pytest.raises(EtnError, match="a folder etn manages in the data directory") as err:
        predict(plan, str(tmp_path / "mine" / "test"), head="map", out=target)
    assert "\n" not in str(err.value) and sealed.read_bytes() == before
    assert not (data / "heads" / "mine.parquet").exists()


def test_every_head_s_aurc_is_the_aurc_of_the_confidence_it_stores(tmp_path, capsys) -> None:
    import polars as pl

    from etn_cli.metrics.selective import selective_values

    rng = np.random.default_rng(0)  # a third of the labels wrong: errors to rank, a real T
    noisy = {s: {"labels": np.where(rng.random(40) < 0.3, rng.integers(0, 3, 40), _labels(i))}
             for i, s in enumerate(("adapt", "test"))}  # fmt: skip
    pipeline, data = byof_pipeline(tmp_path, **noisy), tmp_path / "data"
    pipeline.write_text(
        pipeline.read_text()
        + '[[heads]]\nname = "map"\nlabel = "MAP + TS"\ncalibrate = "temperature"\n'
        + '[[heads]]\nname = "etn"\nlabel = "ETN + TS"\nepochs = 2\ncalibrate = "temperature"\n'
    )
    assert etn(capsys, "run", pipeline, "-d", data)[0] == 0
    found = {}
    for metrics in sorted((data / "metrics" / "byof").glob("*.parquet")):
        frame = pl.read_parquet(metrics).filter(metric="aurc", score="mp", task="id")
        rows = pl.read_parquet(data / "predictions" / "byof" / metrics.name).filter(task="id")
        stored = selective_values(rows["confidence"].to_numpy(), rows["correct"].to_numpy())
        found[frame["method_label"][0]] = (frame["value"][0], float(stored["aurc"][0]))
    assert set(found) == {"ETN", "MAP", "MAP + TS", "ETN + TS"}
    for label, (reported, recomputed) in found.items():
        assert reported == pytest.approx(recomputed, rel=1e-12, abs=1e-15), label
    assert np.isfinite([v for pair in found.values() for v in pair]).all()


def _labels(seed: int) -> np.ndarray:
    """The labels write_shard draws for ``seed`` (its hidden states follow them)."""
    return np.random.default_rng(seed).integers(0, 3, 40)
