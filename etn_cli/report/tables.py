"""Report tables: long metrics Parquet -> seed summaries -> the paper's table layout.

Tables stay long until here (STYLE "Tables stay long until the report"). :func:`summarize`
averages the OOD sets into ``<ID>-OOD`` and reports the mean and 95% t-interval over seeds, as
in the paper ("we report the mean along with 95% confidence intervals"); :func:`paper_table`
lays the summary out like the paper's Table "AUPR scores" (ID: ACC, MP, UM; each OOD set: MP,
MI, DE); :func:`render` writes it as Markdown, CSV or LaTeX (booktabs).
"""

from __future__ import annotations

from itertools import groupby
from pathlib import Path

import numpy as np
import polars as pl

from etn_cli.errors import EtnError

COLUMN_TYPES: dict[str, pl.DataType] = {
    "pipeline": pl.String(),
    "backbone": pl.String(),
    "id_dataset": pl.String(),
    "eval_set": pl.String(),
    "task": pl.String(),
    "method": pl.String(),
    "method_label": pl.String(),
    "variant": pl.String(),
    "seed": pl.Int64(),
    "metric": pl.String(),
    "score": pl.String(),
    "value": pl.Float64(),
    "note": pl.String(),
}
SETTING = ["pipeline", "backbone", "id_dataset"]
METHOD = ["method", "method_label", "variant"]
SEED_KEYS = [*SETTING, "eval_set", "task", *METHOD, "metric", "score"]
PERCENT_METRICS = {"acc", "aupr", "auroc", "fpr95"}
ID_SCORES = ("mp", "um")
OOD_SCORES = ("mp", "mi", "de")
OWN_SCORES = ("md", "energy", "kernel")  # dedicated OOD-detector scores, one "Own" column


def read_metrics(paths: list[Path]) -> pl.DataFrame:
    """Concatenate long-format metrics Parquet files, checking the required columns."""
    if not paths:
        raise EtnError("Expected at least one metrics Parquet file, got none. Run evaluate first.")
    frames = []
    for path in paths:
        if not Path(path).is_file():
            raise EtnError(f"Metrics file {path} does not exist. Run evaluate or fix the path.")
        frame = pl.read_parquet(path)
        missing = [name for name in COLUMN_TYPES if name not in frame.columns]
        if missing:
            raise EtnError(
                f"Metrics file {path} lacks required columns: {', '.join(missing)}. "
                "Re-run evaluate with this version of etn to rewrite it."
            )
        frames.append(frame.with_columns(pl.col(n).cast(t) for n, t in COLUMN_TYPES.items()))
    return pl.concat(frames, how="diagonal_relaxed")


def _ood_average(df: pl.DataFrame) -> pl.DataFrame:
    """Per seed, the mean over 2+ OOD eval sets as eval set ``<id_dataset>-OOD`` (task "ood")."""
    keys = [*SETTING, *METHOD, "seed", "metric", "score"]
    average_name = pl.col("id_dataset") + "-OOD"
    ood = df.filter((pl.col("task") == "ood") & (pl.col("eval_set") != average_name))
    averaged = ood.group_by(keys, maintain_order=True).agg(
        pl.col("value").mean(), pl.col("eval_set").n_unique().alias("n_sets")
    )
    return averaged.filter(pl.col("n_sets") >= 2).select(
        *SETTING,
        average_name.alias("eval_set"),
        pl.lit("ood").alias("task"),
        *METHOD,
        "seed",
        "metric",
        "score",
        "value",
        pl.lit(None, pl.String).alias("note"),
    )


RUNTIME = "runtime_ms"  # pseudo-metric: inference time per sample (backbone + head), ms


def _runtime_rows(df: pl.DataFrame) -> pl.DataFrame:
    """Per head and seed, the inference time of one sample in ms, as metric ``runtime_ms``.

    ``backbone_passes * backbone_s_per_sample`` (the backbone's forward time measured at
    extraction, times the passes the method needs: 2 for ODIN's perturbation) plus the head's
    own ``inference_s_per_sample``; files without the backbone columns count the head only.
    """
    if "inference_s_per_sample" not in df.columns:
        return pl.DataFrame(schema=COLUMN_TYPES)
    backbone = (
        pl.col("backbone_passes").fill_null(1) * pl.col("backbone_s_per_sample").fill_null(0.0)
        if {"backbone_passes", "backbone_s_per_sample"} <= set(df.columns)
        else pl.lit(0.0)
    )
    per_head = df.group_by([*SETTING, *METHOD, "seed"], maintain_order=True).agg(
        ((pl.col("inference_s_per_sample") + backbone) * 1000).first().alias("value")
    )
    return per_head.select(
        *SETTING,
        pl.col("id_dataset").alias("eval_set"),
        pl.lit("id").alias("task"),
        *METHOD,
        "seed",
        pl.lit(RUNTIME).alias("metric"),
        pl.lit(None, pl.String).alias("score"),
        "value",
        pl.lit(None, pl.String).alias("note"),
    )


def t_quantile(dof: np.ndarray) -> np.ndarray:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom (scipy.special on use:
    importing scipy.stats would cost a rerun half a second)."""
    from scipy.special import stdtrit

    return stdtrit(dof, 0.975)


def summarize(df: pl.DataFrame) -> pl.DataFrame:
    """Mean, 95% CI half-width and seed count per setting, eval set, method, metric and score.

    ``ci95 = t_{0.975, n-1} * std(ddof=1) / sqrt(n)`` over the n seeds with a value (0 when
    n == 1, null when n == 0). Null values are left out; a group of only nulls has a null mean
    and keeps the first note saying why.
    """
    long = df.select(pl.col(name).cast(dtype) for name, dtype in COLUMN_TYPES.items())
    runtime = _runtime_rows(df).select(pl.col(n).cast(t) for n, t in COLUMN_TYPES.items())
    long = pl.concat([long, _ood_average(long), runtime], how="vertical_relaxed")
    summary = long.group_by(SEED_KEYS, maintain_order=True).agg(
        pl.col("value").mean().alias("mean"),
        pl.col("value").std(ddof=1).alias("std"),
        pl.col("value").count().alias("n_seeds"),
        pl.col("note").drop_nulls().first().alias("note"),
    )
    n = summary["n_seeds"].to_numpy().astype(np.float64)  # (G,)
    std = summary["std"].fill_null(0.0).to_numpy()  # (G,)
    with np.errstate(invalid="ignore", divide="ignore"):
        ci = np.where(n > 1, t_quantile(n - 1) * std / np.sqrt(n), 0.0)  # (G,)
    ci95 = pl.Series("ci95", ci).set(pl.Series(n == 0), None)
    return summary.with_columns(ci95).select(*SEED_KEYS, "mean", "ci95", "n_seeds", "note")


def split_by_backbone(summary: pl.DataFrame) -> dict[tuple[str, str], pl.DataFrame]:
    """Split a summary into one frame per (pipeline, backbone), each fit for :func:`paper_table`."""
    parts = summary.partition_by(["pipeline", "backbone"], maintain_order=True, as_dict=True)
    return {(str(key[0]), str(key[1])): part for key, part in parts.items()}


def _column_specs(summary: pl.DataFrame, metric: str) -> list[tuple[str, pl.Expr, str]]:
    """(column name, row filter, metric) for every column of the paper table, in order."""
    specs = []
    for id_dataset in summary["id_dataset"].unique(maintain_order=True).to_list():
        rows = summary.filter(pl.col("id_dataset") == id_dataset)
        is_id = (pl.col("id_dataset") == id_dataset) & (pl.col("task") == "id")
        specs.append((f"{id_dataset} ACC", is_id & (pl.col("metric") == "acc"), "acc"))
        for score in ID_SCORES:
            keep = is_id & (pl.col("metric") == metric) & (pl.col("score") == score)
            specs.append((f"{id_dataset} {score.upper()}", keep, metric))
        ood_sets = rows.filter(pl.col("task") == "ood")["eval_set"].unique(maintain_order=True)
        average = f"{id_dataset}-OOD"
        ordered = [s for s in ood_sets.to_list() if s != average] + (
            [average] if average in ood_sets else []
        )
        for eval_set in ordered:
            is_set = (pl.col("id_dataset") == id_dataset) & (pl.col("eval_set") == eval_set)
            for score in OOD_SCORES:
                keep = is_set & (pl.col("task") == "ood") & (pl.col("metric") == metric)
                name = f"{id_dataset} → {eval_set} {score.upper()}"
                specs.append((name, keep & (pl.col("score") == score), metric))
            if summary.filter(pl.col("score").is_in(OWN_SCORES)).height:
                own = keep & pl.col("score").is_in(OWN_SCORES)
                specs.append((f"{id_dataset} → {eval_set} Own", own, metric))
    if summary.filter(pl.col("metric") == RUNTIME).height:
        specs.append(("Runtime ms", pl.col("metric") == RUNTIME, RUNTIME))
    return specs


def _row_labels(summary: pl.DataFrame) -> dict[tuple[str, str, str], str]:
    """Display label per (method, method_label, variant), in first-appearance order."""
    keys = summary.select(METHOD).unique(maintain_order=True).rows()
    labels = [key[1] for key in keys]
    return {
        key: key[1] if labels.count(key[1]) == 1 else f"{key[1]} [{key[0]}/{key[2]}]"
        for key in keys
    }


def paper_table(summary: pl.DataFrame, metric: str = "aupr") -> pl.DataFrame:
    """The paper's results table (Table "AUPR scores"; AUROC in the appendix with "auroc").

    One row per method; a ``Method`` column, then one struct column per cell with fields
    ``mean``, ``ci95`` and ``metric``; acc, aupr, auroc and fpr95 are shown in percent.
    """
    settings = summary.select("pipeline", "backbone").unique().height
    if settings > 1:
        raise EtnError(
            f"Expected one (pipeline, backbone) per table, found {settings}. "
            "Split the summary with split_by_backbone() and build one table each."
        )
    labels = _row_labels(summary)
    columns: dict[str, list] = {"Method": list(labels.values())}
    for name, keep, cell_metric in _column_specs(summary, metric):
        scale = 100.0 if cell_metric in PERCENT_METRICS else 1.0
        found = {
            tuple(row[:3]): row[3:]
            for row in summary.filter(keep).select(*METHOD, "mean", "ci95").iter_rows()
        }
        cells = []
        for key in labels:
            mean, ci95 = found.get(key, (None, None))
            mean = None if mean is None else mean * scale
            cells.append({"mean": mean, "ci95": None if mean is None else ci95 * scale})
        columns[name] = [{**cell, "metric": cell_metric} for cell in cells]
    return pl.DataFrame(columns)


LOWER_IS_BETTER = {"fpr95", "ece", "nll", "brier", RUNTIME}
RENDER_FORMATS = ("md", "csv", "tex")
MISSING = "–"


def _cell_columns(table: pl.DataFrame) -> list[str]:
    """Names of the struct (mean, ci95, metric) columns of a paper table."""
    return [name for name, dtype in table.schema.items() if isinstance(dtype, pl.Struct)]


def _ranks(cells: list[dict | None]) -> list[int]:
    """Per cell: 1 if best, 2 if second best (by the shown 2-decimal value), else 0.

    Best is the highest value, or the lowest for fpr95, ece, nll and brier. Needs 2+ values.
    """
    metrics = [cell["metric"] for cell in cells if cell and cell["metric"]]
    sign = -1.0 if metrics and metrics[0] in LOWER_IS_BETTER else 1.0
    shown = [None if not cell or cell["mean"] is None else round(cell["mean"], 2) for cell in cells]
    distinct = sorted({sign * v for v in shown if v is not None}, reverse=True)
    if sum(v is not None for v in shown) < 2:
        return [0] * len(cells)
    places = {value: place for place, value in enumerate(distinct[:2], start=1)}
    return [0 if v is None else places.get(sign * v, 0) for v in shown]


def _formatted(table: pl.DataFrame, style: str) -> list[list[str]]:
    """Rows of text cells for ``md`` or ``tex``: ``mean ± ci`` with best/second marked."""
    marks = {
        "md": ("**{}**", "{}", "{} ± {}"),
        "tex": (r"\textbf{{{}}}", r"\underline{{{}}}", r"{} $\pm$ {}"),
    }[style]
    columns = [[_escape(label, style) for label in table["Method"].to_list()]]
    for name in _cell_columns(table):
        cells = table[name].to_list()
        texts = []
        for cell, rank in zip(cells, _ranks(cells), strict=True):
            if not cell or cell["mean"] is None:
                texts.append(MISSING if style == "md" else "--")
                continue
            mean = marks[rank - 1].format(f"{cell['mean']:.2f}") if rank else f"{cell['mean']:.2f}"
            texts.append(marks[2].format(mean, f"{cell['ci95']:.2f}"))
        columns.append(texts)
    return [list(row) for row in zip(*columns, strict=True)]


def _escape(text: str, style: str) -> str:
    """Escape LaTeX specials (``_ & % #``) and write arrows as ``$\\to$`` for ``tex``."""
    if style != "tex":
        return text
    for char in "_&%#":
        text = text.replace(char, "\\" + char)
    return text.replace("→", r"$\to$")


def _render_md(table: pl.DataFrame) -> str:
    """Markdown table with ``mean ± ci`` cells, best per column in bold, ``–`` for missing."""
    header = ["Method", *_cell_columns(table)]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _formatted(table, "md")]
    return "\n".join(lines) + "\n"


def _render_tex(table: pl.DataFrame) -> str:
    """booktabs LaTeX table grouped like the paper: one multicolumn per eval set."""
    names = _cell_columns(table)
    spans, rules, start = [], [], 2
    for group, members in groupby(names, key=lambda name: name.rsplit(" ", 1)[0]):
        width = len(list(members))
        spans.append(rf"\multicolumn{{{width}}}{{c}}{{{_escape(group, 'tex')}}}")
        rules.append(rf"\cmidrule(lr){{{start}-{start + width - 1}}}")
        start += width
    subheads = [name.rsplit(" ", 1)[-1] for name in names]
    lines = [rf"\begin{{tabular}}{{l{'c' * len(names)}}}", r"\toprule"]
    lines += ["Method & " + " & ".join(spans) + r" \\", " ".join(rules)]
    lines += [" & " + " & ".join(subheads) + r" \\", r"\midrule"]
    lines += [" & ".join(row) + r" \\" for row in _formatted(table, "tex")]
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"


def _render_csv(table: pl.DataFrame) -> str:
    """CSV with a ``<cell> mean`` and a ``<cell> ci95`` column per cell; empty when missing."""
    fields = [
        pl.col(name).struct.field(part).alias(f"{name} {part}")
        for name in _cell_columns(table)
        for part in ("mean", "ci95")
    ]
    return table.select("Method", *fields).write_csv()


def render(table: pl.DataFrame, fmt: str) -> str:
    """Render a :func:`paper_table` as ``md``, ``csv`` or ``tex`` text."""
    renderers = {"md": _render_md, "csv": _render_csv, "tex": _render_tex}
    if fmt not in renderers:
        raise EtnError(f"Unknown table format '{fmt}'. Use one of: {', '.join(RENDER_FORMATS)}.")
    return renderers[fmt](table)
