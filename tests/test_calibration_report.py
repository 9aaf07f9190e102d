"""Calibration end to end: a temperature-scaled ETN beside the plain one through ``etn run``
(same ranking metrics, its own ECE, the temperature in the provenance), the reliability bins
in the metrics files, the reliability diagrams and calibration table ``etn report`` writes,
and a perfectly classified adaptation split whose temperatures fall back to a rule."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from cli_runner import etn, unstamped
from tiny_pipeline import calibrated_pair, tiny_pipeline

from etn_cli.metrics.evaluation import ECE_BINS, expected_calibration_error
from etn_cli.metrics.reliability import reliability_bins
from etn_cli.report.reliability import pooled_bins

PIPELINE = tiny_pipeline("cal", backbone={"epochs": 3}, heads=("map", *calibrated_pair(3)))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("cal")
    pipeline = root / "cal.toml"
    pipeline.write_text(PIPELINE)
    code, output = etn("run", pipeline, "-d", root / "data", "--format", "json")
    assert code == 0, output
    frames = [pl.read_parquet(p) for p in (root / "data" / "metrics" / "cal").glob("*.parquet")]
    return root / "data", pl.concat(frames, how="diagonal_relaxed")


def _values(frame: pl.DataFrame, label: str, **where) -> dict:
    rows = frame.filter(pl.col("method_label") == label, **where)
    return {
        (r["eval_set"], r["metric"], r["score"]): r["value"] for r in rows.iter_rows(named=True)
    }


def test_temperature_scaled_etn_ranks_exactly_as_etn_and_only_its_probabilities_move(finished):
    _, frame = finished
    plain, scaled = _values(frame, "ETN"), _values(frame, "ETN + TS")
    ranking = [k for k in plain if k[1] in ("aupr", "auroc", "fpr95")]
    assert ranking and all(plain[k] == scaled[k] for k in ranking)
    assert plain[("digits", "acc", None)] == scaled[("digits", "acc", None)]
    assert scaled[("digits", "nll", None)] < plain[("digits", "nll", None)]
    assert scaled[("digits", "ece", None)] != plain[("digits", "ece", None)]


def test_the_fitted_temperature_is_in_the_head_and_train_records(finished):
    data, _ = finished
    heads = [json.loads(p.read_text()) for p in (data / "heads").glob("etn-*/head.json")]
    scaled = [h for h in heads if h["config"]["calibrate"] == "temperature"]
    assert len(heads) == 2 and len(scaled) == 1
    [folder] = [
        p.parent
        for p in (data / "heads").glob("etn-*/head.json")
        if json.loads(p.read_text()) == scaled[0]
    ]
    record = json.loads((folder / "train.json").read_text())
    assert record["calibration"] == scaled[0]["calibration"]
    assert scaled[0]["calibration"]["temperature"] > 0
    assert scaled[0]["calibration"]["rule"] in ("nll", "laplace", "bound")


def test_the_reliability_bins_add_up_to_the_test_set_and_reproduce_the_ece(finished):
    _, frame = finished
    for label in ("MAP", "ETN", "ETN + TS"):
        rows = frame.filter(pl.col("method_label") == label)
        bins = {
            m: rows.filter(metric=m).sort("score")
            for m in ("bin_count", "bin_confidence", "bin_accuracy")
        }
        count = bins["bin_count"]["value"].to_numpy()
        assert len(count) == ECE_BINS and count.sum() == rows["n_test"][0]
        conf = bins["bin_confidence"]["value"].fill_null(0.0).to_numpy()
        acc = bins["bin_accuracy"]["value"].fill_null(0.0).to_numpy()
        ece = rows.filter(metric="ece")["value"].item()
        assert (count / count.sum() * np.abs(acc - conf)).sum() == pytest.approx(ece, abs=1e-12)


def test_report_writes_the_reliability_diagrams_and_the_calibration_table(finished):
    data, _ = finished
    folder = data / "reports" / "cal"
    assert (folder / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "reliability.pdf").read_bytes()[:5] == b"%PDF-"
    table = (folder / "calibration.md").read_text()
    assert "| ETN + TS |" in table and "NLL" in table and "BRIER" in table
    results = json.loads((folder / "results.json").read_text())["results"]
    assert not any(r["metric"].startswith("bin_") for r in results)


def test_reliability_bins_follow_the_ece_binning_and_leave_empty_bins_null():
    rng = np.random.default_rng(0)
    confidence = np.r_[rng.uniform(0.5, 1.0, 200), 1 / 15, 2 / 15]  # two on bin edges (lo, hi]
    correct = rng.random(confidence.size) < confidence
    rows = {(m.metric, m.score): m.value for m in reliability_bins(confidence, correct)}
    count = np.array([rows[("bin_count", f"bin{b:02d}")] for b in range(1, 16)])
    assert count.sum() == confidence.size and count[0] == 1 and count[1] == 1
    assert rows[("bin_accuracy", "bin03")] is None and rows[("bin_confidence", "bin03")] is None
    conf = np.array([rows[("bin_confidence", f"bin{b:02d}")] or 0.0 for b in range(1, 16)])
    acc = np.array([rows[("bin_accuracy", f"bin{b:02d}")] or 0.0 for b in range(1, 16)])
    ece = (count / count.sum() * np.abs(acc - conf)).sum()
    assert ece == pytest.approx(expected_calibration_error(confidence, correct), abs=1e-12)


def test_the_diagram_pools_seeds_by_their_counts():
    rows = []
    for seed, (confidence, correct) in enumerate([([0.95, 0.95, 0.97], [1, 1, 0]), ([0.96], [0])]):
        for m in reliability_bins(np.array(confidence), np.array(correct, bool)):
            rows.append(
                {
                    "method_label": "H",
                    "seed": seed,
                    "task": "id",
                    "metric": m.metric,
                    "score": m.score,
                    "value": m.value,
                }
            )
    n, conf, acc = pooled_bins(pl.DataFrame(rows))["H"]
    assert n[-1] == 4 and acc[-1] == pytest.approx(2 / 4)
    assert conf[-1] == pytest.approx((0.95 + 0.95 + 0.97 + 0.96) / 4)
    assert np.isnan(acc[:-1]).all()


FALLBACK = """
name = "fb"
seeds = [0]
[features]
adapt = "mine/adapt.npz"
test = "mine/test.npz"
ood = ["mine/ood.npz"]
[[heads]]
name = "map"
[[heads]]
name = "temperature"
[[heads]]
name = "map"
calibrate = "temperature"
"""


def test_a_perfectly_classified_adaptation_split_falls_back_warns_and_is_footnoted(tmp_path):
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 6)), rng.normal(size=3)
    (tmp_path / "mine").mkdir()
    for name, spread in (("adapt", 1.0), ("test", 1.0), ("ood", 3.0)):
        labels = rng.integers(0, 3, 80)
        hidden = (weight[labels] * 2 + rng.normal(size=(80, 6)) * spread).astype(np.float32)
        logits = (hidden @ weight.T + bias).astype(np.float32)
        if name == "adapt":  # every adaptation row right: no finite NLL optimum
            labels = logits.argmax(1)
        np.savez(tmp_path / "mine" / f"{name}.npz", hidden=hidden, logits=logits, labels=labels)
    (tmp_path / "fb.toml").write_text(FALLBACK)
    code, output = etn("run", tmp_path / "fb.toml", "-d", tmp_path / "data")
    assert code == 0, output
    warned = [line for line in unstamped(output) if line.startswith("warning: ")]
    assert len(warned) == 2 and all("Laplace's rule" in line for line in warned)
    assert not any("UserWarning" in line for line in output.splitlines())  # no source lines
    note = " ".join(output[output.index("Fell back to a rule") :].split("\n")[:3])
    assert "Temperature scaling (T by Laplace's rule)" in " ".join(note.split())
    assert "MAP + TS (T by Laplace's rule)" in " ".join(note.split())
    records = [json.loads(p.read_text()) for p in (tmp_path / "data" / "heads").glob("*/head.json")]
    rules = sorted(str((r["calibration"] or {}).get("rule")) for r in records)
    assert rules == ["None", "laplace", "laplace"]
