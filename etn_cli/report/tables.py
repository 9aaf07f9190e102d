"""Report tables: the long metrics Parquet files read and checked (:func:`read_metrics`, the
report's first step), and the tables' layout of a summary
(:func:`etn_cli.report.summary.summarize`, the second).

Tables stay long until here (STYLE "Tables stay long until the report"). :func:`paper_table`
lays the summary out like the paper's Table "AUPR scores" (ID: ACC, MP, UM; each OOD set: MP,
MI, DE); :func:`etn_cli.report.render.render` writes it as text, Markdown, CSV or LaTeX.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from etn_cli.errors import DamagedArtefact, EtnError
from etn_cli.store.artefacts.sealed import read_sealed, recorded_sha256
from etn_cli.store.artefacts.unitkey import check_recorded_key
from etn_cli.store.notes import note_once

COLUMN_TYPES: dict[str, pl.DataType] = {
    "pipeline": pl.String(),
    "backbone": pl.String(),
    "id_dataset": pl.String(),
    "eval_set": pl.String(),
    "task": pl.String(),
    "method": pl.String(),
    "method_label": pl.String(),
    "variant": pl.String(),
    "family": pl.String(),  # evidential, bayesian, deterministic, posthoc (null in old files)
    "ood_group": pl.String(),  # the OOD set's group ([data.groups]: near, far, ...) or null
    "seed": pl.Int64(),
    "metric": pl.String(),
    "score": pl.String(),
    "value": pl.Float64(),
    "note": pl.String(),
}
SETTING = ["pipeline", "backbone", "id_dataset"]
METHOD = ["method", "method_label", "variant", "family"]
OPTIONAL_COLUMNS = ("family", "ood_group")
FAMILY_ORDER = ("evidential", "bayesian", "deterministic", "posthoc", "other")
SEED_KEYS = [*SETTING, "eval_set", "task", *METHOD, "metric", "score"]
PERCENT_METRICS = {
    "acc", "ece", "aupr", "auroc", "fpr95", "aupr_in", "aupr_out", "fpr95_id",
    "risk80", "risk90", "risk95", "coverage",
}  # fmt: skip
PERMILLE_METRICS = {"aurc", "eaurc"}  # areas of small risks, in ‰ as the literature gives them
RUNTIME = "runtime_ms"  # pseudo-metric: inference time per sample (backbone + head), ms


def display_scale(metric: str | None) -> float:
    """The factor a metric is shown with: 100 for percentages, 1,000 for ‰, else 1."""
    return 1000.0 if metric in PERMILLE_METRICS else 100.0 if metric in PERCENT_METRICS else 1.0


ID_SCORES = ("mp", "um")
OOD_SCORES = ("mp", "mi", "de")
STANDARD_SCORES = ("mp", "um", "mi", "de")  # any other score is a method's own (md, knn, ...)
# fields a paired comparison adds to a cell: the interval of a difference and its verdict
CELL_EXTRAS = ("lo", "hi", "significant")


def _sealed_metrics(path: Path) -> bytes:
    """The file's bytes once its recorded sha256 agrees; damage says how to rebuild it."""
    try:
        return read_sealed(path)
    except DamagedArtefact as err:
        raise DamagedArtefact(
            err.path,
            f"{err} Re-run etn evaluate (or etn run) on its pipeline to rebuild it; etn verify "
            "--repair removes it.",
        ) from None


def read_metrics(paths: list[Path]) -> pl.DataFrame:
    """Concatenate long-format metrics Parquet files, checking the required columns."""
    if not paths:
        raise EtnError("Expected at least one metrics Parquet file, got none. Run evaluate first.")
    _refuse_repeated_paths(paths)
    frames = []
    for path in paths:
        if not Path(path).is_file():
            raise EtnError(f"Metrics file {path} does not exist. Run evaluate or fix the path.")
        # checked against its recorded sha256 before parsing: the Parquet reader can abort
        # the process on a damaged file
        sealed = recorded_sha256(Path(path)) is not None
        data = _sealed_metrics(Path(path)) if sealed else Path(path).read_bytes()
        frame = parse_metrics_bytes(path, data, sealed=sealed)
        if not sealed:  # said once it parsed, so that a refusal stays one line
            note_once(
                f"note: {path} carries no checksum ({Path(path).name}.sha256), so damage that "
                "leaves it readable cannot be found; read as is"
            )
        check_metrics_key(Path(path), frame)
        frames.append(typed_metrics(path, frame))
    metrics = pl.concat(
        [f.with_columns(pl.lit(str(p)).alias("_file")) for f, p in zip(frames, paths, strict=True)],
        how="diagonal_relaxed",
    )
    _refuse_results_counted_twice(metrics)
    return metrics.drop("_file")


def parse_metrics_bytes(path: Path, data: bytes, sealed: bool = True) -> pl.DataFrame:
    """The metrics frame in ``data``; bytes without a recorded checksum are parsed through
    the checked path (:mod:`etn_cli.store.reading.parquet`), as a damaged file can abort the
    Parquet reader. Either way an unreadable file is one line."""
    from etn_cli.store.reading.parquet import parse_parquet, parse_parquet_checked

    parse = parse_parquet if sealed else parse_parquet_checked
    try:
        return parse(data, path, "Delete it and run etn evaluate (or etn run) again.")
    except EtnError as err:
        raise EtnError(f"Metrics file {err}") from None


def typed_metrics(path: Path, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with every column of :data:`COLUMN_TYPES`, each of its type (optional ones
    null where absent); a missing column or a value of another type is one line."""
    missing = [n for n in COLUMN_TYPES if n not in frame.columns and n not in OPTIONAL_COLUMNS]
    if missing:
        raise EtnError(
            f"Metrics file {path} lacks required columns: {', '.join(missing)}. "
            "Re-run evaluate with this version of etn to rewrite it."
        )
    absent = [pl.lit(None, pl.String).alias(n) for n in OPTIONAL_COLUMNS if n not in frame]
    frame = frame.with_columns(absent) if absent else frame
    try:
        return frame.with_columns(pl.col(n).cast(t) for n, t in COLUMN_TYPES.items())
    except pl.exceptions.PolarsError:
        wrong = [f"{n} is {frame.schema[n]}" for n, t in COLUMN_TYPES.items()
                 if frame.schema[n] != t and frame.schema[n] != pl.Null]  # fmt: skip
        raise EtnError(
            f"Metrics file {path} has columns of other types ({'; '.join(wrong[:3])}); expected "
            "etn's metrics schema. Re-run evaluate to rewrite it."
        ) from None


def check_metrics_key(path: Path, frame: pl.DataFrame) -> None:
    """The rows of ``<head>-<key>.parquet`` carry ``metrics_key`` = that key (a file copied
    over another's name, with its checksum, is another head's or seed's results)."""
    if "metrics_key" in frame.columns:
        keys = frame["metrics_key"].unique(maintain_order=True).to_list()
        fix = "Run etn evaluate (or etn run) on its pipeline to rebuild it."
        check_recorded_key(path, keys, f"Metrics file {path}", fix)


def _refuse_repeated_paths(paths: list[Path]) -> None:
    seen: dict[Path, Path] = {}
    for path in paths:
        resolved = Path(path).resolve()
        if resolved in seen:
            also = f" (also as {seen[resolved]})" if str(seen[resolved]) != str(path) else ""
            raise EtnError(
                f"Metrics file {path} is given twice{also}; every result would count twice in "
                "the means and intervals. Pass each file once."
            )
        seen[resolved] = Path(path)


def _refuse_results_counted_twice(metrics: pl.DataFrame) -> None:
    """One value per (setting, eval set, method as the summary groups it, sweep point, seed,
    metric, score): two files holding the same result (an old setting's file beside the current
    one, a copy) would move a mean and shrink its interval without a word. A head and its
    temperature-scaled twin (``ETN`` and ``ETN + TS``) differ by their label: two results."""
    keys = [*SETTING, "eval_set", *METHOD, "seed", "metric", "score"]
    keys += [k for k in ("sweep",) if k in metrics.columns]
    files = metrics.group_by(keys).agg(pl.col("_file").unique().sort())
    twice = files.filter(pl.col("_file").list.len() > 1)
    if twice.is_empty():
        return
    row = twice.row(0, named=True)
    raise EtnError(
        f"Results of {row['method']} ({row['variant']}) seed {row['seed']} on {row['eval_set']} "
        f"are in {len(row['_file'])} files ({', '.join(row['_file'][:2])}): they would count "
        "twice. Pass one metrics file per head and seed, or report the pipeline file, which "
        "reads its current results only."
    )


def column_specs(summary: pl.DataFrame, metric: str) -> list[tuple[str, pl.Expr, str]]:
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
            is_own = pl.col("score").is_not_null() & ~pl.col("score").is_in(STANDARD_SCORES)
            if summary.filter(is_own & (pl.col("task") == "ood")).height:
                own = keep & is_own
                specs.append((f"{id_dataset} → {eval_set} Own", own, metric))
    if summary.filter(pl.col("metric") == RUNTIME).height:
        specs.append(("Runtime ms", pl.col("metric") == RUNTIME, RUNTIME))
    return specs


def row_labels(summary: pl.DataFrame) -> dict[tuple, str]:
    """Display label per method key (``METHOD``), grouped by family in ``FAMILY_ORDER``, in
    first-appearance order within a family."""
    keys = summary.select(METHOD).unique(maintain_order=True).rows()
    rank = {name: i for i, name in enumerate(FAMILY_ORDER)}
    keys = sorted(keys, key=lambda k: rank.get(k[3] or "other", len(rank)))
    labels = [key[1] for key in keys]
    return {
        key: key[1] if labels.count(key[1]) == 1 else f"{key[1]} [{key[0]}/{key[2]}]"
        for key in keys
    }


def build_table(
    summary: pl.DataFrame,
    specs: list[tuple[str, pl.Expr, str]],
    labels: dict[tuple, str] | None = None,
) -> pl.DataFrame:
    """One row per method: ``Method``, then per ``(name, row filter, metric)`` of ``specs`` a
    struct cell ``mean, ci95, metric, n_seeds`` (percent metrics scaled by 100; with a paired
    comparison's columns also ``lo``, ``hi`` and ``significant``), and last the method's
    ``Family``."""
    labels = labels or row_labels(summary)
    columns: dict[str, list] = {"Method": list(labels.values())}
    extra = [c for c in CELL_EXTRAS if c in summary.columns]  # a paired comparison's fields
    for name, keep, cell_metric in specs:
        scale = display_scale(cell_metric)
        fields = ("mean", "ci95", "n_seeds", *extra)
        found = {
            tuple(row[: len(METHOD)]): dict(zip(fields, row[len(METHOD) :], strict=True))
            for row in summary.filter(keep).select(*METHOD, *fields).iter_rows()
        }
        cells = []
        for key in labels:
            cell = found.get(key, {"mean": None, "ci95": None, "n_seeds": 0} | dict.fromkeys(extra))
            for part in ("mean", "ci95", "lo", "hi"):
                value = cell.get(part)
                cell[part] = None if value is None or cell["mean"] is None else value * scale
            cells.append(cell | {"metric": cell_metric})
        columns[name] = cells
    columns["Family"] = [key[3] or "other" for key in labels]  # last: cells keep their places
    return pl.DataFrame(columns)


def paper_table(summary: pl.DataFrame, metric: str = "aupr") -> pl.DataFrame:
    """The paper's results table (Table "AUPR scores"; AUROC in the appendix with "auroc").

    One row per method; ``Method`` and ``Family`` columns, then one struct column per cell
    with fields ``mean``, ``ci95``, ``metric`` and ``n_seeds``; acc, ece, aupr, auroc and
    fpr95 are shown in percent.
    """
    settings = summary.select("pipeline", "backbone").unique().height
    if settings > 1:
        raise EtnError(
            f"Expected one (pipeline, backbone) per table, found {settings}. "
            "Build one table per part of Summary.parts()."
        )
    return build_table(summary, column_specs(summary, metric))
