"""The report's figures as a reader meets them: one colour and marker per method in every
figure (read back from the drawn artists), labels that overlap no other label, marker or bar,
a crowded accuracy drawn once, legends outside the data and log axes only over decades."""

from __future__ import annotations

import itertools
import re

import numpy as np
import polars as pl
import pytest
from matplotlib.colors import to_hex
from matplotlib.markers import MarkerStyle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

import etn_cli.report.plots as plots
from etn_cli.report.frontier import frontier_plot
from etn_cli.report.reliability import reliability_plot
from etn_cli.report.selective_plot import risk_coverage_plot
from etn_cli.report.style import method_styles, set_scale, spans_decades
from etn_cli.report.summary import Summary

POSTHOC = ["Max logit", "Entropy", "GEN", "KNN", "ViM", "Residual", "RMDS", "fDBD", "SHE"]
# label: (family, accuracy, OOD AUPR, AURC); the post-hoc scorers and ETN share MAP's accuracy
METHODS = {
    "MAP": ("posthoc", 0.9747, 0.80, 0.0014),
    "ETN": ("evidential", 0.9747, 0.86, 0.0020),
    "ETN + TS": ("evidential", 0.9747, 0.86, 0.0021),
    **{name: ("posthoc", 0.9747, 0.705 + 0.021 * i, 0.0014) for i, name in enumerate(POSTHOC)},
    "MAP_EDL": ("evidential", 0.9731, 0.83, 0.0009),
    "IB-EDL": ("evidential", 0.9650, 0.88, 0.0030),
    "Laplace": ("bayesian", 0.9722, 0.93, 0.0015),
    "Deep ensemble": ("bayesian", 0.9810, 0.84, 0.0012),
    "DUQ": ("deterministic", 0.9580, 0.90, 0.0040),
    "SNGP": ("deterministic", 0.9690, 0.87, 0.0025),
}


def _rows(timed: bool = False) -> pl.DataFrame:
    """Three seeds of every method in :data:`METHODS`: accuracy, OOD AUPR by MP, AURC by MP,
    ECE and reliability bins; timings apart (``timed``) or all alike."""
    rows = []
    for k, (label, (family, acc, aupr, aurc)) in enumerate(METHODS.items()):
        times = [1e-5 * (1 + 3 * k if timed else 1) * f for f in (0.9, 1.0, 1.1)]
        confidence = 0.3 + 0.02 * k
        for seed in range(3):
            base = {"pipeline": "p", "backbone": "b", "id_dataset": "digits",
                    "method": label.lower().replace(" ", "_"), "method_label": label,
                    "variant": "", "family": family, "seed": seed, "note": None,
                    "ood_group": None, "metrics_key": f"{label}-{seed}",
                    "backbone_s_per_sample": 0.0, "backbone_passes": 1,
                    "inference_s_repeats": times,
                    "inference_s_per_sample": float(np.median(times))}  # fmt: skip
            test = base | {"eval_set": "digits", "task": "id"}
            rows.append(test | {"metric": "acc", "score": None, "value": acc})
            rows.append(test | {"metric": "aurc", "score": "mp", "value": aurc})
            rows.append(test | {"metric": "ece", "score": None, "value": 0.02})
            for metric, value in (("bin_count", 40.0), ("bin_confidence", confidence),
                                  ("bin_accuracy", confidence + 0.01)):  # fmt: skip
                rows.append(test | {"metric": metric, "score": "bin08", "value": value})
            rows.append(base | {"eval_set": "noise", "task": "ood", "metric": "aupr",
                                "score": "mp", "value": aupr + 0.002 * seed})  # fmt: skip
    return pl.DataFrame(rows)


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """Every figure the plot functions hand to ``save_figure``, by file stem."""
    figures = {}
    monkeypatch.setattr(
        plots, "save_figure", lambda figure, folder, stem: figures.setdefault(stem, figure) and []
    )
    return figures


def _curves(monkeypatch, tmp_path, frame) -> dict:
    """Predictions files for every metrics key, and a made-up curve per file."""
    import etn_cli.report.selective_plot as selective

    coverage = np.linspace(0.01, 1.0, 100)
    monkeypatch.setattr(selective, "mean_curve", lambda paths: (coverage, 0.02 * coverage**4))
    files = {}
    for key in frame["metrics_key"].unique().to_list():
        files[key] = tmp_path / f"{key}.parquet"
        files[key].write_bytes(b"")
    return files


def _marker_of(collection) -> str:
    """The marker a scatter collection was drawn with, recognised by its path."""
    vertices = collection.get_paths()[0].vertices
    for marker in MarkerStyle.filled_markers:
        style = MarkerStyle(marker)
        path = style.get_path().transformed(style.get_transform())
        if path.vertices.shape == vertices.shape and np.allclose(path.vertices, vertices):
            return marker
    raise AssertionError("a scatter drawn with an unknown marker")


def _curve_name(entry: str) -> str:
    """The first method a risk-coverage legend entry names: ``MAP`` of ``MAP + 9 post-hoc
    scorers (AURC 1.4‰)``."""
    entry = re.sub(r" \(AURC [0-9.]+‰\)$", "", entry)
    return re.sub(r" \+ \d+ (more|post-hoc scorers)$", "", entry).split(", ")[0]


def _looks(figures: dict) -> dict[str, dict[str, tuple[str, str]]]:
    """Per figure, method name -> (colour, marker) as drawn: the frontier's legend entries and
    ranked names, the risk-coverage lines' legend, each reliability panel's points."""
    looks: dict[str, dict[str, tuple[str, str]]] = {"frontier": {}, "risk": {}, "reliability": {}}
    for ax in figures["frontier-aupr"].axes:
        legend = ax.get_legend()
        entries = (legend.legend_handles, legend.texts) if legend else ([], [])
        for handle, text in zip(*entries, strict=True):
            if handle.get_marker() not in (None, "None", ""):
                look = (to_hex(handle.get_color()), handle.get_marker())
                looks["frontier"][text.get_text()] = look
        names = {round(t.get_position()[1]): t.get_text() for t in ax.get_yticklabels()}
        if not any(name[:1].isalpha() for name in names.values()):
            continue  # not a ranked panel
        for line in ax.get_lines():
            if len(line.get_ydata()) == 1 and line.get_marker() not in ("|", "_"):  # not caps
                name = names[round(float(line.get_ydata()[0]))].split(", ")[0]
                looks["frontier"][name] = (to_hex(line.get_color()), line.get_marker())
    for line in figures["risk-coverage"].axes[0].get_lines():
        if not line.get_label().startswith("_"):
            look = (to_hex(line.get_color()), line.get_marker())
            looks["risk"][_curve_name(line.get_label())] = look
    for ax in figures["reliability"].axes:
        if ax.collections:
            name = ax.get_title().split("\n")[0]
            points = ax.collections[0]
            looks["reliability"][name] = (to_hex(points.get_facecolor()[0]), _marker_of(points))
    return looks


def test_a_method_has_one_colour_and_marker_in_every_figure(monkeypatch, tmp_path, drawn):
    frame = _rows()
    frontier_plot(Summary.of(frame), tmp_path)
    risk_coverage_plot(Summary.of(frame), _curves(monkeypatch, tmp_path, frame), tmp_path)
    reliability_plot(Summary.of(frame), tmp_path)
    looks = _looks(drawn)
    styles = {name: (s.color.lower(), s.marker) for name, s in method_styles(frame).items()}
    assert all(len(looks[figure]) >= 4 for figure in looks), looks
    for figure, seen in looks.items():
        for name, look in seen.items():
            assert look == styles[name], (figure, name)
    in_two = [n for n in styles if sum(n in seen for seen in looks.values()) >= 2]
    assert {"MAP", "ETN", "MAP_EDL"} <= set(in_two)


def test_no_two_methods_of_a_report_share_a_colour_and_marker():
    styles = list(method_styles(_rows()).values())
    assert len(set(styles)) == len(styles) == len(METHODS)
    many = pl.DataFrame([{"method": f"s{i}", "method_label": f"Scorer {i}", "variant": "",
                          "family": "posthoc"} for i in range(40)])  # fmt: skip
    styles = list(method_styles(many).values())
    assert len(set(styles)) == len(styles) == 40


def test_the_style_of_a_method_does_not_depend_on_the_order_of_the_rows():
    frame = _rows()
    assert method_styles(frame) == method_styles(frame.reverse())


def _boxes_of_markers_and_bars(ax, renderer) -> list[Bbox]:
    boxes = []
    for line in ax.get_lines():
        if line.get_marker() in (None, "None", "", "_"):
            continue
        half = line.get_markersize() * ax.figure.dpi / 72 / 2
        for px, py in ax.transData.transform(line.get_xydata()):
            boxes.append(Bbox.from_extents(px - half, py - half, px + half, py + half))
    for collection in ax.collections:  # interval bars and the crowded accuracy's bar
        for segment in collection.get_segments() if hasattr(collection, "get_segments") else []:
            (x0, y0), (x1, y1) = ax.transData.transform(segment)
            width = max(collection.get_linewidth()) * ax.figure.dpi / 72 / 2
            boxes.append(Bbox.from_extents(min(x0, x1) - width, min(y0, y1) - width,
                                           max(x0, x1) + width, max(y0, y1) + width))  # fmt: skip
    return boxes


@pytest.mark.parametrize("timed", [False, True])
def test_frontier_labels_overlap_no_label_marker_or_bar(tmp_path, drawn, timed):
    frontier_plot(Summary.of(_rows(timed=timed)), tmp_path)
    figure = drawn["frontier-aupr"]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    labelled = 0
    for ax in figure.axes:
        labels = [Text.get_window_extent(t, renderer) for t in ax.texts]  # not leader lines
        labelled += len(labels)
        for a, b in itertools.combinations(labels, 2):
            assert not a.overlaps(b)
        obstacles = _boxes_of_markers_and_bars(ax, renderer)
        for label in labels:
            assert not any(label.overlaps(box) for box in obstacles), ax.get_title()
    assert labelled >= 2  # the Pareto front is named


def test_a_crowded_accuracy_is_one_bar_and_its_results_are_ranked_by_name(tmp_path, drawn):
    frontier_plot(Summary.of(_rows()), tmp_path)
    axes = [ax for ax in drawn["frontier-aupr"].axes if ax.axison]
    scatter, ranked = axes
    at_map = [name for name, (_, acc, *_) in METHODS.items() if acc == 0.9747]
    assert len(scatter.collections) >= 1 and "97.47%" in ranked.get_title()
    names = {t.get_text() for t in ranked.get_yticklabels()}
    assert {"MAP", "ETN, ETN + TS", *POSTHOC} == names
    markers_at_map = [
        line for line in scatter.get_lines()
        if line.get_marker() not in ("None", "_") and np.isclose(line.get_xdata()[0], 97.47)
    ]  # fmt: skip
    assert len(markers_at_map) <= 1 < len(at_map)  # at most the best, on the Pareto front


def test_every_legend_sits_outside_the_data(monkeypatch, tmp_path, drawn):
    frame = _rows(timed=True)
    frontier_plot(Summary.of(frame), tmp_path)
    risk_coverage_plot(Summary.of(frame), _curves(monkeypatch, tmp_path, frame), tmp_path)
    reliability_plot(Summary.of(frame), tmp_path)
    for stem, figure in drawn.items():
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        legends = [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend())]
        assert legends, stem
        data = [ax.get_window_extent(renderer) for ax in figure.axes if ax.axison]
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert not any(box.overlaps(panel) for panel in data), stem


def test_the_risk_coverage_reference_lines_are_named(monkeypatch, tmp_path, drawn):
    frame = _rows()
    risk_coverage_plot(Summary.of(frame), _curves(monkeypatch, tmp_path, frame), tmp_path)
    (ax,) = drawn["risk-coverage"].axes
    lines = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":")
    names = {t.get_text(): t.get_position()[0] for t in ax.texts}
    assert lines == [80, 90, 95]
    assert names == {"Risk@80": 80, "Risk@90": 90, "Risk@95": 95}


def test_an_axis_goes_log_only_where_the_data_span_decades():
    from matplotlib import pyplot as plt

    assert spans_decades([0.01, 0.5, 2.0]) and not spans_decades([0.05, 0.5, 0.9])
    assert not spans_decades([0.0, 10.0]) and not spans_decades([])
    fig, (near, far) = plt.subplots(1, 2)
    for ax, values in ((near, [0.05, 0.9]), (far, [0.002, 0.5, 3.0])):
        ax.plot(values, values)
        set_scale(ax, "x", values)
    fig.canvas.draw()
    assert near.get_xscale() == "linear" and far.get_xscale() == "log"
    ticks = [t.get_text() for t in far.get_xticklabels() if t.get_text()]
    assert ticks and not any("10^" in t or "$" in t for t in ticks)  # 0.01, not 10^-2
    plt.close(fig)


def test_the_runtime_axis_of_the_frontier_follows_the_same_rule(tmp_path, drawn):
    frontier_plot(Summary.of(_rows(timed=True)), tmp_path)  # 0.01 .. 0.8 ms: decades
    runtime = next(ax for ax in drawn["frontier-aupr"].axes if "time" in ax.get_xlabel())
    assert runtime.get_xscale() == "log"


def test_a_ranked_dot_plot_is_not_titled_against_accuracy(tmp_path, drawn):
    frame = _rows().filter(pl.col("method_label").is_in(["MAP", "ETN", "KNN", "GEN"]))
    frontier_plot(Summary.of(frame), tmp_path)
    title = drawn["frontier-aupr"]._suptitle.get_text()
    assert "ranked" in title and "against" not in title
