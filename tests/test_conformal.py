"""Conformal prediction sets: coverage within the finite-sample bounds on exchangeable data,
the scores of LAC / APS / RAPS against their definitions, and ``[conformal]`` in a pipeline."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from cli_runner import etn
from test_cli_conventions import write_shards
from tiny_pipeline import tiny_pipeline

from etn_cli.datasets.base import held_out
from etn_cli.metrics.conformal import (
    label_scores,
    prediction_sets,
    rank_scores,
    threshold,
)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _exchangeable(rng: np.random.Generator, n: int, classes: int = 6):
    """A miscalibrated model's probabilities and labels drawn from the true ones."""
    logits = rng.normal(scale=2.0, size=(n, classes))
    labels = np.array([rng.choice(classes, p=p) for p in _softmax(logits)])
    return _softmax(1.8 * logits), labels  # over-confident: sharper than the truth


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_coverage_lies_within_the_finite_sample_bounds_on_exchangeable_data(method):
    rng = np.random.default_rng(0)
    alpha, n, m, trials = 0.1, 40, 400, 300
    covered = []
    for _ in range(trials):
        probs, labels = _exchangeable(rng, n + m)
        u = rng.random(n + m) if method != "lac" else np.zeros(n + m)
        cal, test = slice(0, n), slice(n, None)
        scores = label_scores(probs[cal], labels[cal], method, u[cal], 0.05, 2)
        q = threshold(scores, alpha)
        member = prediction_sets(probs[test], q, method, u[test], 0.05, 2)
        covered.append(member[np.arange(m), labels[test]].mean())
    mean = float(np.mean(covered))
    error = 3 * np.std(covered) / math.sqrt(trials)  # three standard errors of the mean
    assert 1 - alpha - error <= mean <= 1 - alpha + 1 / (n + 1) + error
    if method != "lac":  # no ties: coverage is exactly ceil((n+1)(1-alpha)) / (n+1) on average
        assert mean == pytest.approx(math.ceil((n + 1) * (1 - alpha)) / (n + 1), abs=error)


def test_the_threshold_is_the_right_order_statistic_or_infinite():
    scores = np.arange(1.0, 20.0)  # 19 scores
    assert threshold(scores, 0.1) == 18.0  # ceil(20 * 0.9) = 18th smallest
    assert threshold(scores[:5], 0.1) == math.inf  # ceil(6 * 0.9) = 6 > 5: keep every class


def test_raps_scores_follow_the_definition_rank_by_rank():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(7), size=20)
    u = rng.random(20)
    penalty, k_reg = 0.1, 2
    order, scores = rank_scores(probs, "raps", u, penalty, k_reg)
    for i in range(20):
        ranked = sorted(probs[i], reverse=True)
        for r in range(1, 8):  # the label at rank r
            expected = sum(ranked[:r]) + penalty * max(r - k_reg, 0) - u[i] * ranked[r - 1]
            assert scores[i, r - 1] == pytest.approx(expected)
    assert np.all(np.diff(scores, axis=1) >= 0)  # nested: every set is the top-L classes
    labels = order[:, 3]  # the label of each row at rank 4
    assert label_scores(probs, labels, "raps", u, penalty, k_reg) == pytest.approx(scores[:, 3])


def test_lac_keeps_the_classes_above_one_minus_the_threshold_and_raps_shrinks_aps_sets():
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.full(10, 0.3), size=200)
    zeros = np.zeros(200)
    lac = prediction_sets(probs, 0.8, "lac", zeros, 0.0, 0)
    assert np.array_equal(lac, probs >= 0.2)
    aps = prediction_sets(probs, 0.95, "aps", zeros, 0.0, 0)
    raps = prediction_sets(probs, 0.95, "raps", zeros, 0.2, 1)
    assert np.all(raps <= aps) and raps.sum() < aps.sum()


def test_the_held_out_part_is_seeded_and_never_empty_or_everything():
    first = held_out(190, 0.2, 0)
    assert first.sum() == 38 and np.array_equal(first, held_out(190, 0.2, 0))
    assert not np.array_equal(first, held_out(190, 0.2, 1))
    assert held_out(3, 0.01, 0).sum() == 1 and held_out(3, 0.99, 0).sum() == 2


def conformal(method: str, **extra: object) -> str:
    return tiny_pipeline("conf", backbone={"epochs": 3}, conformal={"method": method, **extra})


def _run(tmp_path, method: str, **extra: object) -> tuple[int, str, object]:
    (tmp_path / "conf.toml").write_text(conformal(method, **extra))
    code, output = etn("run", tmp_path / "conf.toml", "-d", tmp_path / "data", "-q")
    return code, output, tmp_path / "data"


def test_a_pipeline_holds_out_part_of_the_adaptation_split_and_reports_sets(tmp_path):
    code, output, data = _run(tmp_path, "lac", holdout=0.25)
    assert code == 0, output
    (metrics,) = (data / "metrics" / "conf").glob("*.parquet")
    frame = pl.read_parquet(metrics)
    values = {(r["eval_set"], r["metric"]): r["value"] for r in frame.iter_rows(named=True)}
    assert 0 < values["digits", "coverage"] <= 1 and values["digits_unseen", "set_size"] >= 0
    assert frame["fit_split"][0] == "digits:adapt (142 rows)"  # 190 less the 48 held out
    (rows,) = (data / "predictions" / "conf").glob("*.parquet")
    test = pl.read_parquet(rows).filter(task="id")
    assert test["covered"].mean() == pytest.approx(values["digits", "coverage"])
    code, table = etn("report", tmp_path / "conf.toml", "-d", data, "--metric", "coverage")
    assert code == 0 and "Coverage" in table and "digits_unseen" in table
    out = tmp_path / "sets.csv"
    code, printed = etn("predict", tmp_path / "conf.toml", "digits:test", "--head", "map",
                        "-d", data, "--out", out, "--sets")  # fmt: skip
    assert code == 0, printed
    lines = [line.split("\t") for line in printed.splitlines() if "\t" in line]
    assert len(lines) == test.height and lines[0][0] == "digits:test#21"
    written = pl.read_csv(out)
    assert written["set_size"].to_list() == test.sort("row")["set_size"].to_list()  # evaluate's
    assert all(s.startswith("{") for s in written["prediction_set"])


def test_calibrating_on_the_test_split_measures_on_its_other_rows(tmp_path):
    code, output, data = _run(tmp_path, "raps", split="test", holdout=0.5)
    assert code == 0, output
    (rows,) = (data / "predictions" / "conf").glob("*.parquet")
    test = pl.read_parquet(rows).filter(task="id")
    assert test["covered"].null_count() == 158  # half of the 316 test rows calibrated
    frame = pl.read_parquet(next((data / "metrics" / "conf").glob("*.parquet")))
    assert frame["fit_split"][0] == "digits:adapt (190 rows)"  # the heads keep every row


def test_an_unknown_conformal_method_or_key_is_one_line_and_exit_2(tmp_path):
    for extra, expected in (({}, "expected one of 'lac', 'aps', 'raps', got 'rasp'"),
                            ({"alhpa": 0.1}, "Did you mean 'alpha'?")):  # fmt: skip
        method = "rasp" if not extra else "raps"
        (tmp_path / "conf.toml").write_text(conformal(method, **extra))
        done = subprocess.run(
            [sys.executable, "-m", "etn_cli", "run", tmp_path / "conf.toml", "--dry-run"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2 and expected in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_own_features_calibrate_on_a_folder_or_the_test_split_never_the_fitted_rows(tmp_path):
    from etn_cli.errors import EtnError
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan

    rng = np.random.default_rng(0)
    for name in ("adapt", "test", "calib"):
        write_shards(tmp_path / name, rng, 40, 0)
    base = '[features]\nadapt = "adapt"\ntest = "test"\n[[heads]]\nname = "map"\n[conformal]\n'
    for extra, calibration in (('split = "calib"', tmp_path / "calib"), ('split = "test"', None)):
        (tmp_path / "own.toml").write_text(base + extra)
        plan = make_plan(load_pipeline(tmp_path / "own.toml"), tmp_path / "data")
        assert (plan.calibration.path if plan.calibration else None) == calibration
    (tmp_path / "own.toml").write_text(base)  # the default: part of the adaptation folder
    with pytest.raises(EtnError, match="no head was fitted on; with \\[features\\], write split"):
        make_plan(load_pipeline(tmp_path / "own.toml"), tmp_path / "data")


def _own_pipeline(tmp_path, split: str) -> object:
    rng = np.random.default_rng(0)
    for name in ("adapt", "test"):
        if not (tmp_path / name).exists():
            write_shards(tmp_path / name, rng, 40, 0)
    (tmp_path / "own.toml").write_text(
        '[features]\nadapt = "adapt"\ntest = "test"\n[[heads]]\nname = "map"\n'
        f'[conformal]\nsplit = "{split}"\n'
    )
    return tmp_path / "own.toml"


@pytest.mark.parametrize("labels", ["missing", -1, 99])
def test_calibration_rows_without_labels_or_outside_the_classes_are_refused_before_work(
    tmp_path, labels
):
    rng = np.random.default_rng(1)
    n, hidden = 30, rng.normal(size=(30, 8)).astype(np.float32)
    arrays = {"hidden": hidden, "logits": hidden[:, :3] * 2}
    if labels != "missing":  # -1: a row without a label; 99: no class of the 3
        arrays["labels"] = np.r_[rng.integers(0, 3, n - 1), labels].astype(np.int64)
    np.savez(tmp_path / "calib.npz", **arrays)
    code, output = etn("run", _own_pipeline(tmp_path, "calib.npz"), "-d", tmp_path / "d", "-q")
    assert code == 2 and len(output.strip().splitlines()) == 1, output
    assert ("labels" in output) and ("calib" in output)
    assert not list((tmp_path / "d").rglob("train.json"))  # no head was fitted


def test_calibration_folder_of_unlabelled_rows_is_refused_in_one_line(tmp_path):
    import h5py

    pipeline = _own_pipeline(tmp_path, "calib")
    write_shards(tmp_path / "calib", np.random.default_rng(2), 30, 0)
    with h5py.File(tmp_path / "calib" / "shard-00000.h5", "r+") as f:
        f["labels"][...] = -1  # what an unlabelled OOD or image `ood` folder holds
    code, output = etn("run", pipeline, "-d", tmp_path / "d", "-q")
    assert code == 2 and len(output.strip().splitlines()) == 1, output
    assert "conformal calibration set" in output and "has no labels" in output


def test_the_test_split_itself_as_the_calibration_split_is_refused(tmp_path):
    from etn_cli.errors import EtnError

    with pytest.raises(EtnError, match=r"split './test' is the \[features\] test split") as err:
        etn("run", _own_pipeline(tmp_path, "./test"), "-d", tmp_path / "d", "-q")
    assert "\n" not in str(err.value)


def test_the_unchecked_score_of_a_missing_label_would_rank_it_first():
    # why calibration labels are checked: argmax of an all-False row is 0, the top class
    probs = np.array([[0.1, 0.7, 0.2]])
    assert label_scores(probs, np.array([-1]), "lac", np.zeros(1), 0.0, 0) == pytest.approx(0.3)


def test_without_zero_sets_every_set_holds_the_top_class_and_coverage_only_rises():
    rng = np.random.default_rng(3)
    probs, labels = _exchangeable(rng, 600)
    u = rng.random(600)
    scores = label_scores(probs[:300], labels[:300], "aps", u[:300], 0.0, 0)
    q = threshold(scores, 0.3)  # a loose alpha: some APS sets come out empty
    allowed = prediction_sets(probs[300:], q, "aps", u[300:], 0.0, 0)
    top1 = prediction_sets(probs[300:], q, "aps", u[300:], 0.0, 0, allow_zero_sets=False)
    assert (allowed.sum(1) == 0).any() and (top1.sum(1) >= 1).all()
    assert top1[np.arange(300), probs[300:].argmax(1)].all()
    assert (top1 >= allowed).all() and (top1.sum(1) - allowed.sum(1) <= 1).all()


def test_tied_scores_can_break_the_upper_coverage_bound_but_never_the_lower_one():
    # one probability vector for every row: LAC's scores take two values, full of ties
    n, m, alpha = 99, 2000, 0.1
    rng = np.random.default_rng(4)
    probs = np.tile([0.8, 0.1, 0.1], (n + m, 1))
    labels = rng.choice(3, size=n + m, p=[0.8, 0.1, 0.1])
    q = threshold(label_scores(probs[:n], labels[:n], "lac", np.zeros(n), 0.0, 0), alpha)
    member = prediction_sets(probs[n:], q, "lac", np.zeros(m), 0.0, 0)
    coverage = member[np.arange(m), labels[n:]].mean()
    assert coverage >= 1 - alpha
    assert coverage > 1 - alpha + 1 / (n + 1)  # the upper bound needs scores free of ties


def test_too_few_calibration_rows_for_alpha_are_said_on_stderr(tmp_path, capsys):
    from test_bad_inputs import etn as etn_main

    rng = np.random.default_rng(5)
    for name, n in (("adapt", 40), ("test", 40), ("calib", 5)):  # 5 < ceil(1 / 0.1) - 1
        write_shards(tmp_path / name, rng, n, 0)
    (tmp_path / "own.toml").write_text(
        '[features]\nadapt = "adapt"\ntest = "test"\n[[heads]]\nname = "map"\n'
        '[conformal]\nsplit = "calib"\n'
    )
    code, err = etn_main(capsys, "run", tmp_path / "own.toml", "-d", tmp_path / "d")
    assert code == 0, err
    assert "warning: MAP conformal sets calibrated on calibration: 5 calibration rows" in err
    assert "every set holds every class (needs n >= 9)" in err


def test_allow_zero_sets_false_is_a_conformal_setting_with_its_own_metrics_key(tmp_path):
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan

    keys = []
    for extra in ("", "allow_zero_sets = true", "allow_zero_sets = false"):
        pipeline = _own_pipeline(tmp_path, "test")
        pipeline.write_text(pipeline.read_text() + extra + "\n")
        plan = make_plan(load_pipeline(pipeline), tmp_path / "d")
        keys.append(plan.metrics[0].key)
    assert keys[0] == keys[1] != keys[2]  # the default keeps earlier metrics' keys
