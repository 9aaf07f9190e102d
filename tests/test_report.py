"""Report tables from long metrics Parquet: OOD average, seed CI, paper layout and rendering."""

import io

import numpy as np
import polars as pl
import pytest
from scipy import stats

from etn_cli.errors import EtnError
from etn_cli.report.render import render
from etn_cli.report.summary import Summary, summarize
from etn_cli.report.tables import paper_table, read_metrics

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


def _frontier_rows(timings: dict[str, list[float]]) -> pl.DataFrame:
    """Three seeds of four methods: ETN and its temperature-scaled twin give one result, MAP's
    max probability and KNN's own score share an accuracy but not a quality."""
    methods = {  # label: (method, family, accuracy, {score: quality})
        "ETN": ("etn", "evidential", 0.95, {"mp": 0.80, "mi": 0.90}),
        "ETN + TS": ("etn", "evidential", 0.95, {"mp": 0.80, "mi": 0.90}),
        "MAP": ("map", "posthoc", 0.97, {"mp": 0.85}),
        "KNN": ("knn", "posthoc", 0.97, {"mp": 0.85, "knn": 0.88}),
    }
    rows = []
    for label, (method, family, acc, scores) in methods.items():
        for seed in range(3):
            base = {"pipeline": "p", "backbone": "b", "id_dataset": "digits", "method": method,
                    "method_label": label, "variant": "", "family": family, "seed": seed,
                    "note": None, "ood_group": None, "backbone_s_per_sample": 0.0,
                    "backbone_passes": 1, "inference_s_repeats": timings[label],
                    "inference_s_per_sample": float(np.median(timings[label]))}  # fmt: skip
            rows.append(base | {"eval_set": "digits", "task": "id", "metric": "acc",
                                "score": None, "value": acc})  # fmt: skip
            rows += [
                base
                | {
                    "eval_set": "noise",
                    "task": "ood",
                    "metric": "aupr",
                    "score": score,
                    "value": value + 0.001 * seed,
                }  # fmt: skip
                for score, value in scores.items()
            ]
    return pl.DataFrame(rows)


def test_the_frontier_draws_each_distinct_result_once_with_the_headline_score():
    from etn_cli.report.frontier_results import distinct_results

    frame = _frontier_rows(dict.fromkeys(["ETN", "ETN + TS", "MAP", "KNN"], [1e-4]))
    summary = Summary.of(frame)
    results, ood_set = distinct_results(summary, "aupr"), summary.ood_set
    assert ood_set == "noise"
    by_name = {r.label: r for r in results}
    assert set(by_name) == {"ETN, ETN + TS", "MAP", "KNN"}  # one marker for the twins
    # the score is fixed in advance (own score, else MP), never the best on the test set:
    # ETN's MI (90.1) is better than its MP, yet MP is drawn
    assert by_name["ETN, ETN + TS"].quality == pytest.approx(80.1)
    assert by_name["KNN"].quality == pytest.approx(88.1)  # its own score
    assert by_name["MAP"].acc == by_name["KNN"].acc == pytest.approx(97.0)  # no sideways spread


def test_the_pareto_front_keeps_exactly_the_undominated_points():
    from etn_cli.report.frontier_figure import pareto_front

    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 6, 40).astype(float), rng.integers(0, 6, 40).astype(float)
    front = set(pareto_front(x, y).tolist())
    for i in range(40):
        beaten = any(x[j] >= x[i] and y[j] >= y[i] and (x[j], y[j]) != (x[i], y[i])
                     for j in range(40))  # fmt: skip
        assert (i in front) == (not beaten)


def _drawn_axes(monkeypatch, frame, tmp_path) -> list:
    import etn_cli.report.plots as plots
    from etn_cli.report.frontier import frontier_plot

    figures = []
    monkeypatch.setattr(
        plots, "save_figure", lambda figure, folder, stem: figures.append(figure) or []
    )
    frontier_plot(Summary.of(frame), tmp_path, "aupr")
    return [ax for ax in figures[0].axes if ax.get_visible() and ax.axison]  # not the key


def test_the_runtime_panel_is_drawn_only_when_timings_are_told_apart(monkeypatch, tmp_path):
    noise = [1.0e-3, 1.4e-3, 2.3e-3]  # one cost, measured on a loaded machine
    same = dict.fromkeys(["ETN", "ETN + TS", "MAP", "KNN"], noise)
    assert len(_drawn_axes(monkeypatch, _frontier_rows(same), tmp_path)) == 1
    apart = same | {"KNN": [9e-3, 9.5e-3, 1.1e-2]}  # slower on every repeat
    axes = _drawn_axes(monkeypatch, _frontier_rows(apart), tmp_path)
    assert len(axes) == 2 and "inference time" in axes[1].get_xlabel()


def test_one_accuracy_for_every_method_gives_a_ranked_dot_plot(monkeypatch, tmp_path):
    frame = _frontier_rows(dict.fromkeys(["ETN", "ETN + TS", "MAP", "KNN"], [1e-4]))
    frame = frame.filter(pl.col("method") != "etn")  # MAP and KNN share their accuracy
    (ax,) = _drawn_axes(monkeypatch, frame, tmp_path)
    heights = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    assert heights["KNN"] > heights["MAP"]  # the best at the top


def test_heads_with_identical_reliability_bins_share_one_panel():
    from etn_cli.report.reliability import shared_panels

    bins = np.array([3.0, 0.0, 40.0]), np.array([0.2, np.nan, 0.9]), np.array([0.3, np.nan, 1.0])
    other = bins[0], bins[1], np.array([0.3, np.nan, 0.95])
    groups = shared_panels(["MAP", "ETN", "Energy", "KNN"],
                           {"MAP": bins, "ETN": other, "Energy": bins, "KNN": bins})  # fmt: skip
    assert groups == [["MAP", "Energy", "KNN"], ["ETN"]]


def test_a_table_wider_than_the_terminal_is_cut_into_blocks_of_whole_eval_sets(metrics):
    from etn_cli.report.render import render_text

    table = paper_table(summarize(metrics), "aupr")
    assert max(map(len, render_text(table, max_width=None).splitlines())) > 100
    for width, text in ((100, render(table, "table")), (60, render_text(table, max_width=60))):
        lines = text.splitlines()
        blocks = sum(line.startswith("Method ") for line in lines)
        assert max(map(len, lines)) <= width and blocks >= 2  # Method repeated per block
        assert sum(line.startswith("ETN ") for line in lines) == blocks
        assert sum("digits → noise" in line for line in lines) == 1  # a set's columns together


def _set_size_rows() -> list[dict]:
    """Conformal set sizes of two methods over three seeds: ``digits_unseen`` alone in the
    ``semantic`` group, ``noise`` and ``blur`` in ``covariate``; MAP's sets are smaller."""
    rows = []
    for seed in range(3):
        for rank, (method, label) in enumerate((("map", "MAP"), ("etn", "ETN"))):
            base = {"pipeline": "p", "backbone": "tiny", "id_dataset": "digits", "note": None,
                    "method": method, "method_label": label, "variant": "", "seed": seed,
                    "score": None, "head_key": f"{method}{seed}"}  # fmt: skip
            rows.append({**base, "eval_set": "digits", "task": "id", "ood_group": None,
                         "metric": "coverage", "value": 0.9})  # fmt: skip
            rows.append({**base, "eval_set": "digits", "task": "id", "ood_group": None,
                         "metric": "set_size", "value": 1.0 + rank + 0.01 * seed})  # fmt: skip
            for eval_set, group in (("digits_unseen", "semantic"), ("noise", "covariate"),
                                    ("blur", "covariate")):  # fmt: skip
                size = 2.0 + rank + 0.1 * seed + len(eval_set) / 10
                rows.append({**base, "eval_set": eval_set, "task": "ood", "ood_group": group,
                             "metric": "set_size", "value": size})  # fmt: skip
    return rows


def test_the_conformal_table_ranks_no_ood_set_size_and_drops_a_group_of_one_set(tmp_path):
    from etn_cli.report.views import conformal_view

    path = tmp_path / "sizes.parquet"
    pl.DataFrame(_set_size_rows()).write_parquet(path)
    table = conformal_view(summarize(read_metrics([path])))
    ood = [c.removeprefix("OOD set size ") for c in table.columns if c.startswith("OOD set")]
    assert ood == ["digits_unseen", "noise", "blur", "digits-OOD", "covariate-OOD"]
    text = render(table, "table")
    marked = [line for line in text.splitlines() if line.startswith("MAP")]
    assert marked[0].count("*") == 1  # the ID set size only: MAP's are smaller everywhere
    assert render(table, "latex").count(r"\textbf{") == 1
