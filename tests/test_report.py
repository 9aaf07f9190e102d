"""Report tables from long metrics Parquet: OOD average, seed CI, paper layout and rendering."""

import io

import numpy as np
import polars as pl
import pytest
from scipy import stats

from etn_cli.errors import EtnError
from etn_cli.report.render import render
from etn_cli.report.tables import paper_table, read_metrics, summarize

SETS = [("digits", "id"), ("digits_unseen", "ood"), ("noise", "ood")]
METHODS = [("softmax", "MAP_CE", ["mp"]), ("etn", "ETN", ["mp", "um", "mi", "de"])]


def _long_rows(seed: int) -> list[dict]:
    """One seed of metrics: ETN beats MAP_CE everywhere, values jittered by the seed."""
    rng = np.random.default_rng(seed)
    rows = []
    for rank, (method, label, scores) in enumerate(METHODS):
        base = {"method": method, "method_label": label, "variant": "", "seed": seed}
        for eval_set, task in SETS:
            where = {**base, "eval_set": eval_set, "task": task}
            if task == "id":
                rows.append({**where, "metric": "acc", "score": None, "value": 0.9})
            for score in scores if task == "ood" else [s for s in scores if s in ("mp", "um")]:
                for metric in ("aupr", "fpr95"):
                    value = 0.6 + 0.2 * rank + 0.05 * rng.random()
                    rows.append({**where, "metric": metric, "score": score, "value": value})
    common = {"pipeline": "p", "backbone": "tiny", "id_dataset": "digits", "note": None}
    return [{**common, **row, "head_key": f"h{seed}"} for row in rows]


@pytest.fixture
def metrics(tmp_path) -> pl.DataFrame:
    paths = []
    for seed in range(3):
        paths.append(tmp_path / f"seed{seed}.parquet")
        pl.DataFrame(_long_rows(seed)).write_parquet(paths[-1])
    return read_metrics(paths)


def _value(df: pl.DataFrame, column: str, **where) -> object:
    return df.filter(**where)[column].item()


def test_read_metrics_concatenates_all_files(metrics):
    assert metrics.height == 3 * len(_long_rows(0))
    assert "head_key" in metrics.columns


def test_read_metrics_names_the_missing_columns_and_the_file(tmp_path):
    path = tmp_path / "bad.parquet"
    pl.DataFrame(_long_rows(0)).drop("variant", "note").write_parquet(path)
    with pytest.raises(EtnError, match=r"bad\.parquet lacks required columns: variant, note"):
        read_metrics([path])


def test_read_metrics_without_files_raises():
    with pytest.raises(EtnError, match="at least one"):
        read_metrics([])


def test_a_result_counted_twice_is_refused_naming_both_files(tmp_path):
    first, copy = tmp_path / "seed0.parquet", tmp_path / "old-copy.parquet"
    pl.DataFrame(_long_rows(0)).write_parquet(first)
    pl.DataFrame(_long_rows(0)).write_parquet(copy)
    with pytest.raises(EtnError, match="is given twice"):
        read_metrics([first, tmp_path / "." / "seed0.parquet"])
    with pytest.raises(EtnError, match=r"seed 0 on .* are in 2 files .*old-copy\.parquet"):
        read_metrics([first, copy])
    # the same head and seed at two sweep points are two results, not one counted twice
    other_point = pl.DataFrame(_long_rows(0)).with_columns(pl.lit('{"lr": 1}').alias("sweep"))
    other_point.write_parquet(copy)
    assert read_metrics([first, copy]).height == 2 * len(_long_rows(0))
    # a head and its temperature-scaled twin share method and variant, not label: two results
    scaled = pl.DataFrame(_long_rows(0)).with_columns(method_label=pl.col("method_label") + " + TS")
    scaled.write_parquet(copy)
    assert read_metrics([first, copy]).height == 2 * len(_long_rows(0))


def test_ood_average_mean_and_ci_match_numpy_and_scipy(metrics):
    summary = summarize(metrics)
    where = {"method": "etn", "metric": "aupr", "score": "mi"}
    per_set = [
        metrics.filter(eval_set=eval_set, **where).sort("seed")["value"].to_numpy()
        for eval_set in ("digits_unseen", "noise")
    ]
    per_seed = (per_set[0] + per_set[1]) / 2  # (3,)
    low, high = stats.t.interval(0.95, df=2, loc=per_seed.mean(), scale=stats.sem(per_seed))
    row = summary.filter(eval_set="digits-OOD", **where)
    assert row["task"].item() == "ood" and row["n_seeds"].item() == 3
    assert row["mean"].item() == pytest.approx(per_seed.mean())
    assert row["ci95"].item() == pytest.approx((high - low) / 2)


def test_single_seed_has_zero_ci_and_all_null_values_give_a_null_mean(metrics):
    one_seed = metrics.filter(seed=0).with_columns(
        pl.when(pl.col("score") == "um").then(None).otherwise(pl.col("value")).alias("value")
    )
    summary = summarize(one_seed)
    assert _value(summary, "ci95", method="etn", metric="aupr", score="mp", task="id") == 0.0
    assert _value(summary, "mean", method="etn", metric="aupr", score="um", task="id") is None


def test_paper_table_has_the_paper_columns_in_percent(metrics):
    table = paper_table(summarize(metrics))
    assert table.columns[:4] == ["Method", "digits ACC", "digits MP", "digits UM"]
    cells = [c for c in table.columns if c != "Family"]
    assert cells[-3:] == [f"digits → digits-OOD {s}" for s in ("MP", "MI", "DE")]
    assert table["Family"].to_list() == ["other", "other"]  # files without a family column
    assert table["Method"].to_list() == ["MAP_CE", "ETN"]
    assert table["digits ACC"][1]["mean"] == pytest.approx(90.0)


def _tex_cell(tex: str, label: str, column: int) -> str:
    line = next(line for line in tex.splitlines() if line.startswith(label + " &"))
    return line.removesuffix(r" \\").split(" & ")[column]


def test_latex_bolds_the_best_and_underlines_the_second(metrics):
    tex = render(paper_table(summarize(metrics)), "tex")
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"digits\_unseen" in tex
    assert _tex_cell(tex, "ETN", 2).startswith(r"\textbf{")
    assert _tex_cell(tex, r"MAP\_CE", 2).startswith(r"\underline{")


def test_latex_bolds_the_lowest_value_for_fpr95(metrics):
    tex = render(paper_table(summarize(metrics), metric="fpr95"), "tex")
    assert _tex_cell(tex, r"MAP\_CE", 2).startswith(r"\textbf{")
    assert _tex_cell(tex, "ETN", 2).startswith(r"\underline{")


def test_markdown_shows_a_dash_for_a_missing_score_and_bolds_the_best(metrics):
    md = render(paper_table(summarize(metrics)), "md")
    map_row = next(line for line in md.splitlines() if line.startswith("| MAP_CE"))
    assert map_row.split(" | ")[3] == "–"
    etn_row = next(line for line in md.splitlines() if line.startswith("| ETN"))
    assert etn_row.split(" | ")[2].startswith("**")


def test_csv_parses_back_with_polars(metrics):
    table = paper_table(summarize(metrics), metric="auroc")
    parsed = pl.read_csv(io.StringIO(render(table, "csv")))
    assert parsed.columns[:3] == ["Method", "digits ACC mean", "digits ACC ci95"]
    assert parsed["digits ACC mean"].to_list() == pytest.approx([90.0, 90.0])
    assert parsed["digits UM mean"].null_count() == 2  # no AUROC values in the data


def test_unknown_format_lists_the_known_ones(metrics):
    with pytest.raises(EtnError, match="table, markdown, csv, latex"):
        render(paper_table(summarize(metrics)), "html")


def test_runtime_column_adds_the_backbone_passes_to_the_head_time(metrics):
    """runtime = (inference + passes x backbone forward) per sample, in ms, mean over seeds."""
    timed = metrics.with_columns(
        inference_s_per_sample=pl.when(pl.col("method") == "etn").then(2e-5).otherwise(1e-6),
        backbone_s_per_sample=pl.lit(1e-3),
        backbone_passes=pl.when(pl.col("method") == "etn").then(1).otherwise(2),
    )
    table = paper_table(summarize(timed))
    cells = dict(zip(table["Method"], table["Runtime ms"].to_list(), strict=True))
    assert cells["ETN"]["mean"] == pytest.approx(1.02)
    assert cells["MAP_CE"]["mean"] == pytest.approx(2.001)
    assert "**1.02**" in render(table, "md")  # lower runtime is better


def test_runtime_column_is_absent_without_timing_columns(metrics):
    assert "Runtime ms" not in paper_table(summarize(metrics)).columns


def test_methods_sharing_a_colour_get_clearly_different_markers():
    from etn_cli.report.plots import MARKERS, method_styles

    assert not {"h", "H", "8", "p"} & set(MARKERS)  # circle-like shapes beside "o"
    styles = method_styles([f"m{i}" for i in range(40)])
    pairs = {(s["color"], s["marker"]) for s in styles.values()}
    assert len(pairs) == 40
    for color in {s["color"] for s in styles.values()}:
        markers = [s["marker"] for s in styles.values() if s["color"] == color]
        assert len(set(markers)) == len(markers), (color, markers)


def test_points_sharing_an_accuracy_are_spread_sideways_deterministically():
    from etn_cli.report.plots import spread

    x = np.array([97.5] * 6 + [98.0])
    y = np.array([88.9, 88.9, 88.9, 91.0, 70.0, 88.95, 88.9])
    offsets = spread(x, y, width=0.02, height=0.5)
    assert offsets[6] == 0.0  # an accuracy of its own stays put
    assert offsets[4] == 0.0 and offsets[3] == 0.0  # alone at their height
    close = offsets[[0, 1, 2, 5]]
    assert len(set(np.round(close, 6))) == 4 and np.abs(close).max() <= 0.04 + 1e-9
    assert np.array_equal(offsets, spread(x, y, width=0.02, height=0.5))


def test_a_table_wider_than_the_terminal_is_cut_into_blocks_of_whole_eval_sets(metrics):
    from etn_cli.report.render import _render_text

    table = paper_table(summarize(metrics), "aupr")
    assert max(map(len, _render_text(table, max_width=None).splitlines())) > 100
    for width, text in ((100, render(table, "table")), (60, _render_text(table, max_width=60))):
        lines = text.splitlines()
        blocks = sum(line.startswith("Method ") for line in lines)
        assert max(map(len, lines)) <= width and blocks >= 2  # Method repeated per block
        assert sum(line.startswith("ETN ") for line in lines) == blocks
        assert sum("digits → noise" in line for line in lines) == 1  # a set's columns together
