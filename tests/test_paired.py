"""Paired comparisons: the weighted metrics equal the metrics of resampled rows, the bootstrap
intervals behave, and ``etn report --compare`` through the entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from cli_runner import etn, without_progress
from tiny_pipeline import BOTH_OOD, calibrated_pair, tiny_pipeline

from etn_cli.metrics.evaluation import classification_metrics
from etn_cli.metrics.ranking import ranking_values
from etn_cli.metrics.weighted import weighted_calibration, weighted_ranking
from etn_cli.report.bootstrap import Predictions, Resamples
from etn_cli.report.paired import compare, seed_pairs
from etn_cli.report.summary import summarize


def test_weighted_ranking_metrics_are_those_of_the_resampled_rows():
    rng = np.random.default_rng(0)
    for trial in range(25):
        n = int(rng.integers(6, 120))
        labels = rng.random(n) < rng.uniform(0.2, 0.8)
        scores = np.round(rng.normal(size=n) + labels, int(rng.integers(0, 3)))  # ties
        weights = rng.multinomial(n, np.full(n, 1 / n), size=8)
        found = weighted_ranking(labels, scores, weights)
        for b in range(8):
            rows = np.repeat(np.arange(n), weights[b])
            if labels[rows].all() or not labels[rows].any():
                assert np.isnan(found["auroc"][b])  # one class drawn: undefined
                continue
            for name, value in ranking_values(labels[rows], scores[rows]).items():
                assert found[name][b] == pytest.approx(value, abs=1e-12), (trial, name)


def test_weighted_calibration_metrics_are_those_of_the_resampled_rows():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.full(5, 0.5), size=70)  # (70, 5)
    labels = rng.integers(0, 5, 70)
    correct = probs.argmax(1) == labels
    nll = -np.log(probs[np.arange(70), labels])
    brier = ((probs - np.eye(5)[labels]) ** 2).sum(1)
    weights = rng.multinomial(70, np.full(70, 1 / 70), size=4)
    found = weighted_calibration(correct, probs.max(1), nll, brier, weights)
    for b in range(4):
        rows = np.repeat(np.arange(70), weights[b])
        for m in classification_metrics(probs[rows], labels[rows]):
            assert found[m.metric][b] == pytest.approx(m.value, abs=1e-12), m.metric


def _rows(method: str, seed: int, id_scores: np.ndarray, ood_scores: np.ndarray) -> pl.DataFrame:
    n, m = len(id_scores), len(ood_scores)
    correct = np.arange(n) % 10 != 0
    return pl.DataFrame({
        "eval_set": ["digits"] * n + ["noise"] * m, "task": ["id"] * n + ["ood"] * m,
        "row": np.r_[np.arange(n), np.arange(m)], "correct": np.r_[correct, np.zeros(m, bool)],
        "confidence": np.r_[np.full(n, 0.9), np.full(m, 0.5)], "nll": np.ones(n + m),
        "brier": np.ones(n + m), "score_mp": np.r_[id_scores, ood_scores],
        "method": [method] * (n + m), "seed": [seed] * (n + m),
    })  # fmt: skip


def _summary(frames: dict) -> pl.DataFrame:
    """The summary of the metrics the predictions give (AUROC of MP on the OOD set)."""
    rows = []
    for (method, seed), frame in frames.items():
        ind, ood = frame.filter(task="id")["score_mp"], frame.filter(task="ood")["score_mp"]
        labels = np.r_[np.ones(len(ind)), np.zeros(len(ood))]
        value = ranking_values(labels, np.r_[ind, ood])["auroc"]
        rows.append({"pipeline": "p", "backbone": "b", "id_dataset": "digits",
                     "eval_set": "noise", "task": "ood", "method": method,
                     "method_label": method.upper(), "variant": "", "family": "posthoc",
                     "seed": seed, "metric": "auroc", "score": "mp", "value": value,
                     "note": None, "ood_group": None})  # fmt: skip
    return summarize(pl.DataFrame(rows))


def _compare(frames: dict, samples: int = 400) -> pl.DataFrame:
    predictions: dict = {}
    for (method, seed), frame in frames.items():
        key = (method, method.upper(), "", "posthoc")
        predictions.setdefault(key, {})[seed] = Predictions(frame, "digits", {})
    reference = ("ref", "REF", "", "posthoc")
    return compare(_summary(frames), predictions, reference, "same", Resamples(samples))


def test_a_method_against_an_identical_one_differs_by_exactly_zero():
    rng = np.random.default_rng(2)
    ind, ood = rng.normal(1, 1, 200), rng.normal(0, 1, 150)
    frames = {("ref", 0): _rows("ref", 0, ind, ood), ("same", 0): _rows("same", 0, ind, ood)}
    (row,) = _compare(frames).iter_rows(named=True)
    assert (row["mean"], row["lo"], row["hi"], row["significant"]) == (0.0, 0.0, 0.0, False)


def test_a_clearly_better_detector_is_significant_and_its_interval_holds_the_difference():
    rng = np.random.default_rng(3)
    noise_id, noise_ood = rng.normal(size=300), rng.normal(size=200)
    frames = {
        ("ref", 0): _rows("ref", 0, noise_id, noise_ood),  # no signal: AUROC near 0.5
        ("good", 0): _rows("good", 0, noise_id + 2.0, noise_ood),  # the same rows, shifted
    }
    (row,) = _compare(frames).iter_rows(named=True)
    summary = _summary(frames)
    gap = summary.filter(method="good")["mean"].item() - summary.filter(method="ref")["mean"].item()
    assert row["mean"] == pytest.approx(gap, abs=1e-12)  # the difference of the table's cells
    assert row["lo"] < row["mean"] < row["hi"] and row["lo"] > 0.3 and row["significant"]


def test_pairing_the_same_rows_gives_a_narrower_interval_than_two_independent_samples():
    """The paired bootstrap cancels what both methods share: two detectors that add small,
    different noise to one strong score differ little, and the interval says so."""
    rng = np.random.default_rng(4)
    base_id, base_ood = rng.normal(1.0, 1, 400), rng.normal(0, 1, 300)
    frames = {
        ("ref", 0): _rows("ref", 0, base_id, base_ood),
        ("twin", 0): _rows("twin", 0, base_id + 0.05 * rng.normal(size=400), base_ood),
    }
    (row,) = _compare(frames).iter_rows(named=True)
    auroc_se = 0.02  # about the standard error of one AUROC of 400 + 300 rows
    assert row["hi"] - row["lo"] < auroc_se  # far narrower than unpaired intervals


def test_seeds_pair_one_by_one_and_a_seed_free_method_meets_every_seed():
    assert seed_pairs([0, 1, 2], [0, 1, 2]) == [(0, 0), (1, 1), (2, 2)]
    assert seed_pairs([0], [0, 1, 2]) == [(0, 0), (0, 1), (0, 2)]
    assert seed_pairs([1, 2], [0, 1]) == [(1, 1)]


def test_seeds_combined_average_the_per_seed_differences_and_draw_the_seeds_too():
    rng = np.random.default_rng(5)
    base_id, base_ood = rng.normal(1.0, 1, 300), rng.normal(0, 1, 200)
    frames = {}
    for seed, shift in enumerate((0.0, 0.6, 1.2)):  # seeds that disagree a lot
        frames["ref", seed] = _rows("ref", seed, base_id, base_ood)
        frames["new", seed] = _rows("new", seed, base_id + shift, base_ood)
    (row,) = _compare(frames).iter_rows(named=True)
    per_seed = row["per_seed"]
    assert [p["seed"] for p in per_seed] == [0, 1, 2]
    assert row["mean"] == pytest.approx(np.mean([p["difference"] for p in per_seed]))
    assert per_seed[0]["difference"] == 0.0 and per_seed[0]["hi"] == 0.0
    widest = max(p["hi"] - p["lo"] for p in per_seed)
    assert row["hi"] - row["lo"] > widest  # the seeds' spread widens the combined interval


PIPELINE = tiny_pipeline(
    "pair", seeds=(0, 1), backbone={"epochs": 3}, data={"ood": BOTH_OOD},
    heads=("map", *calibrated_pair(3)),
)  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    (root / "pair.toml").write_text(PIPELINE)
    code, output = etn("run", root / "pair.toml", "-d", root / "data", "-q")
    assert code == 0, output
    return root / "pair.toml", root / "data"


def test_report_compare_writes_the_differences_and_marks_the_significant_cells(finished):
    pipeline, data = finished
    code, output = etn("report", pipeline, "-d", data, "--compare", "etn", "--bootstrap", "200")
    assert code == 0, output
    assert "Paired difference, method - ETN" in output and "† differs from ETN" in output
    folder = data / "reports" / "pair"
    record = json.loads((folder / "results.json").read_text())
    rows = {(r["method_label"], r["eval_set"], r["metric"], r["score"]): r
            for r in record["comparisons"]}  # fmt: skip
    twin = rows["ETN + TS", "digits-OOD", "auroc", "mp"]
    assert twin["difference"] == 0.0 and not twin["significant"]  # scaling keeps the ranking
    assert rows["MAP", "digits", "acc", None]["difference"] == 0.0  # ETN keeps the argmax
    results = {(r["method_label"], r["eval_set"], r["metric"], r["score"]): r["mean"]
               for r in record["results"]}  # fmt: skip
    for key in [("MAP", "digits_noise", "aupr", "mp"), ("ETN + TS", "digits", "ece", None)]:
        expected = results[key] - results[("ETN", *key[1:])]
        assert rows[key]["difference"] == pytest.approx(expected, abs=1e-12)
        assert len(rows[key]["per_seed"]) == 2
    tex = (folder / "compare-etn.tex").read_text()
    assert r"\scriptsize" in tex and "ETN + TS" in tex
    csv = pl.read_csv(folder / "compare-etn.csv")
    assert "digits ECE significant" in csv.columns and "digits ECE lo" in csv.columns
    summary_tex = (folder / "summary.tex").read_text()
    assert r"$^\dagger$" in summary_tex  # ETN's ECE of ~45% differs from MAP's and TS's


def test_report_compare_with_an_unknown_method_is_one_line_and_exit_2(finished):
    pipeline, data = finished
    done = subprocess.run(
        [sys.executable, "-m", "etn_cli", "report", pipeline, "-d", data, "--compare", "etm"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert "Did you mean 'ETN'?" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_report_metric_aurc_shows_every_selective_metric_then_the_risk_per_score(finished):
    pipeline, data = finished
    code, output = etn("report", pipeline, "-d", data, "--metric", "aurc")
    assert code == 0, output
    lines = without_progress(output).splitlines()  # stderr's lines of a slow step mixed in
    assert "ranked by MP" in lines[0] and "E-AURC" in lines[1] and "Risk@95" in lines[1]
    per_score = next(i for i, line in enumerate(lines) if line.endswith(" AURC"))
    assert "MP" in lines[per_score + 1] and "DE" in lines[per_score + 1]
    assert (data / "reports" / "pair" / "selective.md").is_file()


def test_a_damaged_predictions_file_is_found_by_verify_and_rebuilt_by_the_next_run(finished):
    pipeline, data = finished
    path = sorted((data / "predictions" / "pair").glob("map-*.parquet"))[0]
    metrics = data / "metrics" / "pair" / path.name
    before = pl.read_parquet(metrics).drop("created_at")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    code, output = etn("verify", "-d", data)
    assert code == 1 and f"DAMAGED {path}" in output
    code, output = etn("run", pipeline, "-d", data, "-q")
    assert code == 0 and f"{path.name} has sha256" in output and "Rebuilding" in output
    assert etn("verify", "-d", data)[0] == 0
    after = pl.read_parquet(metrics).drop("created_at", "inference_s_per_sample",
                                          "inference_s_repeats")  # fmt: skip
    assert after.equals(before.drop("inference_s_per_sample", "inference_s_repeats"))
