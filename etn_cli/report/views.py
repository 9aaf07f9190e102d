"""Which results a table shows: the summary a person reads first, or one metric in full.

* :func:`summary_view` (the default): one row per method, grouped by family; ID accuracy and
  ECE; per OOD set AUROC and FPR@95 (the headline metrics of OpenOOD and most papers) with each
  method's own OOD score; and the paper's AUPR of max probability averaged over the OOD sets.
  When the per-set columns would pass 100 characters, they collapse into the OOD mean.
* :func:`metric_view`: one metric across every score (``--metric aupr`` is the paper's table,
  its ``Own`` column a method's own OOD score, named in brackets after the method); ``acc``,
  ``ece``, ``nll`` and ``brier`` give the calibration table, ``runtime`` the time per sample.
  On a terminal a table wider than 100 columns is cut into blocks of whole eval sets
  (:func:`etn_cli.report.render.render`).

Both return a :func:`etn_cli.report.tables.paper_table`-shaped frame (``Method``, ``Family``,
then one struct column ``mean, ci95, metric, n_seeds`` per cell, named ``"<group> <column>"``),
so every renderer serves both.
"""

from __future__ import annotations

import polars as pl

from etn_cli.report.metric_names import (
    CALIBRATION,
    CONFORMAL,
    OOD_SET_SIZE,
    RANKING,
    SELECTIVE,
)
from etn_cli.report.render import text_width
from etn_cli.report.tables import (
    METHOD,
    PERCENT_METRICS,
    RUNTIME,
    STANDARD_SCORES,
    build_table,
    column_specs,
    paper_table,
)

SELECTIVE_NAMES = {"aurc": "AURC", "eaurc": "E-AURC", "risk80": "Risk@80",
                   "risk90": "Risk@90", "risk95": "Risk@95"}  # fmt: skip
MAX_WIDTH = 100


def own_scores(summary: pl.DataFrame) -> dict[tuple, str]:
    """Per method key, the OOD score its headline columns use: the method's own detector
    score when it has exactly one (``md``, ``energy``, ``kernel``, …), else max probability."""
    rows = summary.filter(pl.col("task") == "ood").select(*METHOD, "score").unique()
    scores: dict[tuple, set[str]] = {}
    for *key, score in rows.iter_rows():
        if score is not None:
            scores.setdefault(tuple(key), set()).add(score)
    chosen = {}
    for key, names in scores.items():
        own = sorted(names - set(STANDARD_SCORES))
        chosen[key] = own[0] if len(own) == 1 else "mp" if "mp" in names else sorted(names)[0]
    return chosen


def _ood_columns(summary: pl.DataFrame, id_dataset: str) -> tuple[list[str], str | None]:
    """The OOD columns in order of first appearance: the groups' averages (``near-OOD``,
    ``far-OOD``) when the pipeline groups its OOD sets, else the sets; and the name of the
    average over every set (if any)."""
    sets = (
        summary.filter((pl.col("task") == "ood") & (pl.col("id_dataset") == id_dataset))["eval_set"]
        .unique(maintain_order=True)
        .to_list()
    )
    average = f"{id_dataset}-OOD"
    groups = [s for s in sets if s.endswith("-OOD") and s != average]
    shown = groups or [s for s in sets if s != average]
    return shown, average if average in sets else None


def summary_view(summary: pl.DataFrame, max_width: int = MAX_WIDTH) -> pl.DataFrame:
    """The default results table (see the module docstring)."""
    id_dataset = summary["id_dataset"][0]
    sets, average = _ood_columns(summary, id_dataset)
    own = own_scores(summary)
    score_of = pl.struct(METHOD).map_elements(
        lambda k: own.get(tuple(k[c] for c in METHOD), "mp"), return_dtype=pl.String
    )
    scored = summary.with_columns(score_of.alias("_own"))
    is_id = (pl.col("task") == "id") & (pl.col("eval_set") == id_dataset)
    specs = [
        (f"{id_dataset} ACC", is_id & (pl.col("metric") == "acc"), "acc"),
        (f"{id_dataset} ECE", is_id & (pl.col("metric") == "ece"), "ece"),
    ]

    def per_set(eval_set: str, group: str) -> list:
        on_set = (pl.col("task") == "ood") & (pl.col("eval_set") == eval_set)
        with_own = on_set & (pl.col("score") == pl.col("_own"))
        return [
            (f"{group} AUROC", with_own & (pl.col("metric") == "auroc"), "auroc"),
            (f"{group} FPR95", with_own & (pl.col("metric") == "fpr95"), "fpr95"),
        ]

    mean_set = average or (sets[0] if len(sets) == 1 else None)
    aupr = []
    if mean_set is not None:
        keep = (
            (pl.col("task") == "ood")
            & (pl.col("eval_set") == mean_set)
            & (pl.col("metric") == "aupr")
            & (pl.col("score") == "mp")
        )
        aupr = [("OOD mean AUPR(MP)" if average else f"{mean_set} AUPR(MP)", keep, "aupr")]
    labels = _labels_with_scores(summary, own)
    table = build_table(scored, specs + [s for e in sets for s in per_set(e, e)] + aupr, labels)
    if average is not None and text_width(table) > max_width:
        table = build_table(scored, specs + per_set(average, "OOD mean") + aupr, labels)
    return table


def _labels_with_scores(summary: pl.DataFrame, own: dict[tuple, str]) -> dict[tuple, str]:
    """Row labels; a method whose headline score is not MP names it: ``Mahalanobis [md]``."""
    from etn_cli.report.tables import row_labels

    labels = row_labels(summary)
    return {
        key: label if own.get(key, "mp") == "mp" else f"{label} [{own[key]}]"
        for key, label in labels.items()
    }


def metric_view(summary: pl.DataFrame, metric: str) -> pl.DataFrame:
    """One metric in full: the paper's layout for a ranking metric, else the calibration
    table (``acc``, ``ece``, ``nll``, ``brier``) or the runtime per sample."""
    if metric in RANKING:
        table = paper_table(summary, metric)
        if not any(name.endswith(" Own") for name in table.columns):
            return table
        # the Own column's score is named after the method, as in the summary: "KNN [knn]"
        own = {k: s for k, s in own_scores(summary).items() if s not in STANDARD_SCORES}
        labels = _labels_with_scores(summary, own)
        return build_table(summary, column_specs(summary, metric), labels)
    id_dataset = summary["id_dataset"][0]
    is_id = (pl.col("task") == "id") & (pl.col("eval_set") == id_dataset)
    if metric in SELECTIVE:
        own = {k: s for k, s in own_scores(summary).items() if s not in STANDARD_SCORES}
        labels = _labels_with_scores(summary, own)
        return build_table(summary, _per_score_specs(summary, metric, id_dataset), labels)
    if metric in CONFORMAL:
        return conformal_view(summary)
    if metric == "runtime":
        specs = [("Runtime ms", pl.col("metric") == RUNTIME, RUNTIME)]
    else:
        specs = [
            (f"{id_dataset} {name.upper()}", is_id & (pl.col("metric") == name), name)
            for name in CALIBRATION
        ]
    return build_table(summary, specs)


def _per_score_specs(summary: pl.DataFrame, metric: str, id_dataset: str) -> list:
    """ACC, then ``metric`` on the ID test set for MP, UM, MI, DE and the method's own score."""
    is_id = (pl.col("task") == "id") & (pl.col("eval_set") == id_dataset)
    specs = [(f"{id_dataset} ACC", is_id & (pl.col("metric") == "acc"), "acc")]
    has = set(summary.filter(pl.col("metric") == metric)["score"].drop_nulls().to_list())
    name = SELECTIVE_NAMES.get(metric, metric.upper())
    for score in STANDARD_SCORES:
        if score in has:
            keep = is_id & (pl.col("metric") == metric) & (pl.col("score") == score)
            specs.append((f"{name} {score.upper()}", keep, metric))
    if has - set(STANDARD_SCORES):
        own = pl.col("score").is_not_null() & ~pl.col("score").is_in(STANDARD_SCORES)
        specs.append((f"{name} Own", is_id & (pl.col("metric") == metric) & own, metric))
    return specs


def selective_view(summary: pl.DataFrame) -> pl.DataFrame:
    """Selective prediction at a glance: ACC, then AURC, E-AURC and the risk at 80/90/95%
    coverage, each ranking by max probability (the softmax-response baseline)."""
    id_dataset = summary["id_dataset"][0]
    is_id = (pl.col("task") == "id") & (pl.col("eval_set") == id_dataset)
    specs = [(f"{id_dataset} ACC", is_id & (pl.col("metric") == "acc"), "acc")]
    for metric, name in SELECTIVE_NAMES.items():
        keep = is_id & (pl.col("metric") == metric) & (pl.col("score") == "mp")
        specs.append((f"ranked by MP {name}", keep, metric))
    return build_table(summary, specs)


def conformal_view(summary: pl.DataFrame) -> pl.DataFrame:
    """Conformal prediction sets: coverage and mean set size on the ID test set, and the
    mean set size on every OOD set (and their averages; a group's only when it is not one
    set's column again). OOD set sizes are not ranked: there a larger set is the honest
    answer ("I don't know"), not a worse one."""
    id_dataset = summary["id_dataset"][0]
    is_id = (pl.col("task") == "id") & (pl.col("eval_set") == id_dataset)
    specs = [
        (f"{id_dataset} Coverage", is_id & (pl.col("metric") == "coverage"), "coverage"),
        (f"{id_dataset} Size", is_id & (pl.col("metric") == "set_size"), "set_size"),
    ]
    sizes = summary.filter((pl.col("task") == "ood") & (pl.col("metric") == "set_size"))
    for eval_set in _ood_size_columns(sizes, f"{id_dataset}-OOD"):
        keep = (pl.col("task") == "ood") & (pl.col("eval_set") == eval_set)
        name = f"OOD set size {eval_set}"  # the eval set under one "OOD set size" heading
        specs.append((name, keep & (pl.col("metric") == "set_size"), OOD_SET_SIZE))
    return build_table(summary, specs)


def _ood_size_columns(sizes: pl.DataFrame, average: str) -> list[str]:
    """The OOD eval sets of ``sizes`` to show, less each group (``semantic-OOD``) whose
    sizes are those of one of the sets, which is what a group of one set is."""
    names = sizes["eval_set"].unique(maintain_order=True).to_list()
    by_set = {
        name: sizes.filter(pl.col("eval_set") == name).sort(METHOD, nulls_last=True)["mean"]
        for name in names
    }
    members = [name for name in names if not name.endswith("-OOD")]

    def repeats(group: str) -> bool:
        return any(by_set[group].equals(by_set[member]) for member in members)

    grouped = [n for n in names if n.endswith("-OOD") and n != average and repeats(n)]
    return [name for name in names if name not in grouped]


def view(summary: pl.DataFrame, metric: str | None) -> pl.DataFrame:
    """The summary (None), the selective-prediction overview (``"selective"``) or one metric."""
    if metric is None:
        return summary_view(summary)
    return selective_view(summary) if metric == "selective" else metric_view(summary, metric)


def footnote(table: pl.DataFrame, metric: str | None) -> str:
    """What a reader needs under the table: seeds and CI, units, direction, scores."""
    seeds = table.select(
        pl.concat_list(
            pl.col(c).struct.field("n_seeds") for c in table.columns if c not in META_COLUMNS
        )
        .list.max()
        .max()
    ).item()
    lines = []
    if seeds and seeds >= 2:
        lines.append(f"mean ± half-width of the 95% CI over {seeds} seeds; * best per column.")
    else:
        lines.append("one seed (no confidence interval); * best per column.")
    shown = {c.rsplit(" ", 1)[-1] for c in table.columns if c not in META_COLUMNS}
    percent = sorted(m for m in PERCENT_METRICS | {"ece"} if m.upper() in shown or m == "acc")
    if metric is None:
        lines.append("In %. ACC and ECE on the ID test set. AUROC and FPR95 (OpenOOD v1.5's: ID")
        lines.append("rejected at 95% OOD recall, OOD positive; lower is better) rank by each")
        lines.append("method's own OOD score [in brackets], else by max probability (MP).")
        lines.append("AUPR(MP): the paper's (ID positive).")
    elif metric in (*SELECTIVE, *CONFORMAL, "selective"):
        lines.append("In % (AURC and E-AURC in ‰, Size in classes).")
        lines.append(METRIC_NOTES[metric])
    elif percent:
        lines.append("ACC, AUPR, AUROC, FPR95 and ECE in %; lower is better for FPR95 and ECE.")
        lines += [METRIC_NOTES[metric]] if metric in METRIC_NOTES else []
    if any("-OOD " in c for c in table.columns):
        lines.append("X-OOD: the mean over group X's sets.")
    if any(c.endswith(" Own") for c in table.columns):
        named = next((m for m in table["Method"].to_list() if m.endswith("]")), None)
        example = f", e.g. {named}" if named else ""
        lines.append(f"Own: the method's own OOD score, named in brackets after it{example}.")
    return "\n".join(lines)


META_COLUMNS = ("Method", "Family")
METRIC_NOTES = {  # which class is positive, for the one-metric tables (see metrics/ranking.py)
    "aupr": "AUPR: the paper's average precision, ID (or correct) positive.",
    "aupr_in": "AUPR-IN: OpenOOD's trapezoid AUPR, ID (or correct) positive.",
    "aupr_out": "AUPR-OUT: OpenOOD's trapezoid AUPR, OOD (or wrong) positive.",
    "fpr95": "FPR95: OpenOOD's, ID (correct) rejected at 95% recall of OOD (wrong) samples.",
    "fpr95_id": "FPR95_ID: OOD (wrong) accepted at 95% recall of ID (correct) samples.",
    **dict.fromkeys(
        (*SELECTIVE, "selective"),
        "Selective prediction on the ID test set (lower is better): AURC, the area under the\n"
        "risk-coverage curve; E-AURC, its excess over an oracle ranking; Risk@c, the error rate\n"
        "of the c% most confident predictions (Geifman & El-Yaniv 2017).",
    ),
    **dict.fromkeys(
        CONFORMAL,
        "Conformal prediction sets: Coverage, the share of ID test sets holding the label\n"
        "(target 1 - alpha); Size, the mean number of classes per set (lower is better on\n"
        "the ID test set; on OOD sets a larger set is the honest answer, so none is marked).",
    ),
}
