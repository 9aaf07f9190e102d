"""``etn status P.toml``: which units of a pipeline are done, partial or missing.

A unit is ``done`` when its completion record exists (a split's manifest, a head's
``train.json``, a metrics file, ``finetune.json``), ``partial`` when a private folder or
temporary file of an unfinished build is there (with the shards an extraction has finished so
far, and whether a running process holds it), ``damaged`` when a finished unit's files no longer
match their recorded checksums (``etn run`` rebuilds it), ``failed`` when its method refused its
data (its failure record gives the reason; ``etn run`` retries it), and ``missing`` otherwise
(a metrics file whose head failed says so). Nothing is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from etn_cli.planning.plan import Plan
from etn_cli.planning.shipped import shown
from etn_cli.stages.failure_records import recorded_failure
from etn_cli.store.atomic import is_locked, partial_folders
from etn_cli.store.maintenance.leftovers import TMP_FILE, peek_partial
from etn_cli.store.writing.manifest import load_manifest, split_is_complete

STATES = ("done", "partial", "missing", "failed", "damaged")
SHOWN_WHEN_ANY = ("failed", "damaged")  # counted in the summary only when there are some
WIDTH = 100  # a table row's columns at most


@dataclass(frozen=True)
class UnitStatus:
    kind: str  # finetune, features, classifier, head, metrics
    name: str
    state: str  # one of STATES
    detail: str
    path: Path


def status(plan: Plan) -> list[UnitStatus]:
    """The state of every unit of ``plan``, in the order ``etn run`` builds them."""
    units = []
    if plan.finetune is not None:
        done = (plan.finetune.path / "finetune.json").is_file()
        units.append(_folder_unit("finetune", plan.finetune.split, plan.finetune.path, done))
    for unit in plan.feature_units:
        units.append(_features(unit.name if unit.role == "ood" else unit.role, unit.path, plan))
    if plan.stores_classifier:
        what = "backbone's final layer" if plan.backbone is not None else "your own features"
        units.append(_file_unit("classifier", what, plan.classifier_path))
    for head in plan.heads:
        name = f"{head.label} seed {head.seed}"
        done = (head.path / "train.json").is_file()
        units.append(_failed(_folder_unit("head", name, head.path, done)))
    for metrics in plan.metrics:
        name = f"{metrics.head.label} seed {metrics.head.seed}"
        unit = _failed(_file_unit("metrics", name, metrics.path))
        if unit.state == "missing" and recorded_failure(metrics.head.path) is not None:
            unit = UnitStatus("metrics", name, "missing", "its head failed", metrics.path)
        units.append(unit)
    return [_checked(unit) for unit in units]


def _failed(unit: UnitStatus) -> UnitStatus:
    """A ``missing`` unit with a failure record is ``failed``, the stage and reason its detail
    (:mod:`etn_cli.stages.failure_records`)."""
    failure = recorded_failure(unit.path) if unit.state == "missing" else None
    if failure is None:
        return unit
    return UnitStatus(
        unit.kind, unit.name, "failed", f"{failure.stage}: {failure.reason}", unit.path
    )


def _checked(unit: UnitStatus) -> UnitStatus:
    """A ``done`` unit whose files no longer match their recorded checksums is ``damaged``
    (``etn run`` rebuilds it); the same cheap checks ``etn run`` makes before it skips one."""
    from etn_cli.store.artefacts.damage import classifier_damage, head_damage, metrics_damage
    from etn_cli.store.reading.reader import split_damage

    if unit.state != "done":
        return unit
    checks = {"head": head_damage, "metrics": metrics_damage, "classifier": classifier_damage}
    if unit.kind == "features" and (unit.path / "manifest.json").exists():
        checks["features"] = split_damage
    problem = checks[unit.kind](unit.path) if unit.kind in checks else None
    if problem is None:
        return unit
    first = re.split(r"(?<=\.) (?=[A-Z])", str(problem))[0]
    return UnitStatus(unit.kind, unit.name, "damaged", first, unit.path)


def render_status(plan: Plan, units: list[UnitStatus], fmt: str = "table") -> str:
    """The units as an aligned table with a summary line (``table``), or as ``markdown``,
    ``csv``, ``json`` or ``latex`` rows for a program or a document."""
    header = ("unit", "name", "state", "detail", "path")
    rows = [(u.kind, u.name, u.state, u.detail, _relative(u.path, plan)) for u in units]
    if fmt != "table":
        return _status_rows(header, rows, fmt)
    rows = [header[:4], *(row[:4] for row in rows)]  # paths: --format csv/json (too wide here)
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [_fit("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
             for row in rows]  # fmt: skip
    counts = {state: sum(u.state == state for u in units) for state in STATES}
    for state in SHOWN_WHEN_ANY:
        if not counts[state]:
            del counts[state]
    summary = f"{plan.pipeline.name}: {len(units)} units, " + ", ".join(
        f"{n} {state}" for state, n in counts.items()
    )
    command = f"`etn run {shown(plan.pipeline.path)}`"
    if counts.get("failed"):
        summary += f"; {command} retries the failed and builds the rest"
    elif counts["partial"] or counts["missing"] or counts.get("damaged"):
        summary += f"; {command} builds the rest"
    if not plan.data_dir.is_dir():
        summary += f" (no data directory at {plan.data_dir} yet)"
        return "\n".join([*lines, summary])
    where = f"data directory {plan.data_dir} (--format csv or json adds each unit's path)"
    return "\n".join([where, *lines, summary])


def _status_rows(header: tuple[str, ...], rows: list[tuple[str, ...]], fmt: str) -> str:
    import polars as pl

    frame = pl.DataFrame(rows, schema=list(header), orient="row")
    if fmt == "json":
        return json.dumps(frame.to_dicts(), indent=1)
    if fmt == "csv":
        return frame.write_csv()
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"
    escape = str.maketrans({c: "\\" + c for c in "_&%#"})
    lines = [r"\begin{tabular}{lllll}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    lines += [" & ".join(c.translate(escape) for c in row) + r" \\" for row in rows]
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"


def _features(name: str, path: Path, plan: Plan) -> UnitStatus:
    if plan.backbone is None:  # the user's own shards: there is nothing to build
        state = "done" if path.is_dir() else "missing"
        return UnitStatus("features", name, state, "your own shards", path)
    if split_is_complete(path):
        manifest = load_manifest(path)
        detail = f"{manifest['rows']} rows in {len(manifest['shards'])} shard(s)"
        return UnitStatus("features", name, "done", detail, path)
    folders = partial_folders(path)
    if not folders:
        return UnitStatus("features", name, "missing", "", path)
    journals = [j for j in (peek_partial(folder) for folder in folders) if j is not None]
    shards, rows = max(journals, default=(0, 0))
    detail = f"{shards} shard(s), {rows} rows done so far, {_holder(path)}"
    return UnitStatus("features", name, "partial", detail, path)


def _folder_unit(kind: str, name: str, path: Path, done: bool) -> UnitStatus:
    if done:
        return UnitStatus(kind, name, "done", "", path)
    if partial_folders(path) or is_locked(path):
        return UnitStatus(kind, name, "partial", _holder(path), path)
    return UnitStatus(kind, name, "missing", "", path)


def _file_unit(kind: str, name: str, path: Path) -> UnitStatus:
    if path.is_file():
        return UnitStatus(kind, name, "done", "", path)
    tmp = [p for p in path.parent.glob(f".{path.name}.*.tmp") if TMP_FILE.match(p.name)]
    if tmp or is_locked(path):
        return UnitStatus(kind, name, "partial", _holder(path), path)
    return UnitStatus(kind, name, "missing", "", path)


def _fit(line: str) -> str:
    """``line`` cut to :data:`WIDTH` columns (a failure's or damage's whole detail: --format
    json or csv)."""
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def _holder(path: Path) -> str:
    return "running" if is_locked(path) else "interrupted"


def _relative(path: Path, plan: Plan) -> str:
    try:
        return str(path.relative_to(plan.data_dir))
    except ValueError:
        return str(path)
