"""``etn verify``: check every artefact under a data directory and say how to fix what is damaged.

An HDF5 file killed mid-write often still opens, with zero-filled rows, so "it opens" proves
nothing: every feature split is checked against its manifest (checksums, row counts, shapes,
finite values, unique index, the content key in its folder name), every head against the
checksums in its ``train.json`` and by loading it, every metrics file and per-row predictions
file by reading it and checking its columns and key, the backbone's classifier and the backbone
folders by reading them, every report folder's ``plots.json`` and the figures it lists.
Leftovers of interrupted runs are listed apart: they are not damage,
the next run resumes or replaces them, and ``--clean-partials`` deletes those no running etn
process holds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.report.plot_record import PLOT_RECORD, check_report_folder
from etn_cli.stages.units import discard_damaged
from etn_cli.store.artefacts.headfiles import read_json_object
from etn_cli.store.artefacts.sealed import without_advice
from etn_cli.store.fingerprint import fingerprint_key
from etn_cli.store.maintenance.leftovers import Leftover, clean_leftover, find_leftovers

METRICS_COLUMNS = (
    "pipeline", "backbone", "id_dataset", "eval_set", "task", "method", "variant", "seed",
    "metric", "score", "value", "head_key", "metrics_key",
)  # fmt: skip
KEY_SUFFIX = re.compile(r"-([0-9a-f]{12,16})$")


@dataclass
class Damage:
    path: Path
    problem: str
    fix: str

    def line(self) -> str:
        return f"DAMAGED {self.path}: {without_advice(self.problem)} Fix: {self.fix}"


@dataclass
class Verification:
    """What ``etn verify`` found: artefacts checked by kind, damage, leftovers, cleaned."""

    data_dir: Path
    checked: Counter = field(default_factory=Counter)
    damaged: list[Damage] = field(default_factory=list)
    leftovers: list[Leftover] = field(default_factory=list)
    cleaned: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)  # damaged units removed by --repair

    @property
    def left_damaged(self) -> list[Damage]:
        """Damage still there: not removed by ``--repair`` (your own folders never are)."""
        return [damage for damage in self.damaged if damage.path not in self.removed]

    def render(self) -> str:
        lines = [damage.line() for damage in self.damaged]
        lines += [left.line() for left in self.leftovers if left.path not in self.cleaned]
        lines += [f"removed {path}" for path in self.cleaned]
        lines += [f"removed damaged {path}; the next etn run rebuilds it" for path in self.removed]
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(self.checked.items())) or "nothing"
        kept = len(self.leftovers) - len(self.cleaned)
        removed = f" ({len(self.removed)} removed for the next etn run)" if self.removed else ""
        cleaned = f" ({len(self.cleaned)} removed)" if self.cleaned else ""
        lines.append(
            f"verified {counts} under {self.data_dir}: {len(self.damaged)} damaged{removed}, "
            f"{len(self.leftovers)} leftover(s) of interrupted runs{cleaned}"
        )
        if kept and not self.cleaned:
            lines.append("leftovers are harmless; `etn verify --clean-partials` removes them")
        return "\n".join(lines)


def verify(data_dir: Path, *, clean_partials: bool = False, repair: bool = False) -> Verification:
    """Check everything under ``data_dir``; with ``clean_partials`` delete unheld leftovers;
    with ``repair`` remove every damaged unit (under its lock), which the next ``etn run`` of
    its pipeline rebuilds: everything under a data directory is derived."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise EtnError(
            f"Expected a data directory at {data_dir}, found none. Pass --data-dir (or set "
            "ETN_DATA_DIR) to the folder etn run wrote."
        )
    result = Verification(data_dir)
    for kind, path, check, fix in _artefacts(data_dir):
        result.checked[kind] += 1
        try:
            check(path)
        except EtnError as err:
            result.damaged.append(Damage(path, str(err), fix))
            if repair:
                discard_damaged(path)
                result.removed.append(path)
    check_own_folders(data_dir, result)
    result.leftovers = find_leftovers(data_dir)
    if clean_partials:
        result.cleaned = [left.path for left in result.leftovers if clean_leftover(left)]
    return result


def check_own_folders(data_dir: Path, result: Verification) -> None:
    """Your own shard folders recorded at first use (:mod:`etn_cli.own_features.folders`):
    a shard changed without a write is damage, said but never removed (it is your data)."""
    from etn_cli.own_features.folders import OWN_RECORD, own_folder_key, read_record

    record = data_dir / "features" / OWN_RECORD
    for folder in map(Path, sorted(read_record(record))):
        if not folder.is_dir():  # moved or deleted by you: nothing of etn's to check
            continue
        result.checked["own feature folders"] += 1
        try:
            own_folder_key(folder, record)
        except EtnError as err:
            fix = "Restore the shard from a copy, or write it anew (etn never edits your folder)."
            result.damaged.append(Damage(folder, str(err), fix))


def _artefacts(data_dir: Path) -> list[tuple[str, Path, Callable[[Path], None], str]]:
    """``(kind, path, check, fix)`` for every artefact under ``data_dir``."""
    found = _feature_artefacts(data_dir / "features")
    for head in _units(data_dir / "heads"):
        found.append(("heads", head, _check_head, _rerun(head, "train")))
    for pipeline in _units(data_dir / "metrics"):
        for file in sorted(pipeline.glob("*.parquet")):
            found.append(("metrics files", file, _check_metrics, _rerun(file, "evaluate")))
    for pipeline in _units(data_dir / "predictions"):
        for file in sorted(pipeline.glob("*.parquet")):
            found.append(("prediction files", file, _check_predictions, _rerun(file, "evaluate")))
    for folder in _units(data_dir / "reports"):
        record = folder / PLOT_RECORD
        if record.is_file():
            fix = f"Run etn report on its pipeline again (it redraws {folder.name})."
            found.append(("report folders", record, check_report_folder, fix))
    return found + [_backbone_artefact(folder) for folder in _units(data_dir / "backbones")]


def _feature_artefacts(features: Path) -> list[tuple[str, Path, Callable[[Path], None], str]]:
    """The classifiers and feature splits under ``features``."""
    found = []
    for folder in _units(features):
        classifier = folder / "classifier.safetensors"
        if classifier.is_file():
            fix = "Delete it and run etn extract again (it is saved once per backbone)."
            found.append(("classifiers", classifier, _check_classifier, fix))
        for split in _units(folder):
            found.append(("feature splits", split, _check_split, _rerun(split, "extract")))
    return found


def _backbone_artefact(folder: Path) -> tuple[str, Path, Callable[[Path], None], str]:
    if "-finetune-" in folder.name:
        return ("fine-tuned backbones", folder, _check_finetune, _rerun(folder, "finetune"))
    return (
        "backbone caches",
        folder,
        _check_files,
        f"Delete {folder}; the next etn run rebuilds it.",
    )


def _units(folder: Path) -> list[Path]:
    """Finished unit folders in ``folder``: leftovers (hidden, partial, old) are not units."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and ".partial-" not in p.name
        and ".old-" not in p.name
    )  # fmt: skip


def _rerun(path: Path, stage: str) -> str:
    return f"Delete {path} and run etn {stage} (or etn run) again."


def _check_split(path: Path) -> None:
    from etn_cli.store.reading.reader import check_split

    manifest = check_split(path)
    key = fingerprint_key(manifest["fingerprint"])
    named = KEY_SUFFIX.search(path.name)
    if manifest["key"] != key or (named and named.group(1) != key):
        raise EtnError(
            f"Manifest key {manifest['key']} and folder name disagree with the fingerprint's "
            f"key {key}: the folder was renamed or its manifest edited."
        )


def _check_classifier(path: Path) -> None:
    from etn_cli.store.artefacts.classifier import load_classifier

    load_classifier(path)


def _check_head(path: Path) -> None:
    from etn_cli.heads.base import Head
    from etn_cli.store.artefacts.headfiles import check_head_folder

    check_head_folder(path)  # its files, its recorded key and head name against the folder's
    try:
        Head.load(path)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise EtnError(f"The head does not load ({type(err).__name__}: {err}).") from None


def _check_metrics(path: Path) -> None:
    from etn_cli.report.tables import check_metrics_key, parse_metrics_bytes
    from etn_cli.store.artefacts.sealed import read_sealed

    frame = parse_metrics_bytes(path, read_sealed(path))  # checked before the Parquet reader runs
    missing = [column for column in METRICS_COLUMNS if column not in frame.columns]
    if missing or frame.height == 0:
        raise EtnError(f"Expected rows with columns {', '.join(METRICS_COLUMNS)}; missing "
                       f"{', '.join(missing) or 'no column'} in {frame.height} rows.")  # fmt: skip
    check_metrics_key(path, frame)


def _check_predictions(path: Path) -> None:
    from etn_cli.store.artefacts.predictions import read_rows

    frame = read_rows(path)  # checked against its sidecar and its key before it is used
    wanted = ("eval_set", "task", "row", "prediction", "metrics_key")
    missing = [column for column in wanted if column not in frame.columns]
    if missing or frame.height == 0:
        raise EtnError(f"Expected per-row predictions; missing {', '.join(missing) or 'no column'} "
                       f"in {frame.height} rows.")  # fmt: skip


def _check_finetune(path: Path) -> None:
    from etn_cli.stages.finetune import KIND, RECORD

    record = read_json_object(path / RECORD)
    named = KEY_SUFFIX.search(path.name)
    if record.get("kind") != KIND or (named and record.get("key") != named.group(1)):
        raise EtnError(f"{RECORD} has kind {record.get('kind')!r} and key {record.get('key')!r}; "
                       f"expected {KIND!r} and the folder's key.")  # fmt: skip
    _check_files(path)


def _check_files(path: Path) -> None:
    """Every JSON file parses and every safetensors file's header covers the file."""
    from safetensors import SafetensorError, safe_open

    from etn_cli.store.artefacts.sealed import check_record_seal
    from etn_cli.store.fingerprint import file_sha256

    files = sorted(p for p in path.rglob("*") if p.is_file())
    if not files:
        raise EtnError("The folder is empty.")
    for file in files:
        if file.suffix == ".json":
            record = read_json_object(file)
            check_record_seal(record, file, path)
            for name, digest in (record.get("files") or {}).items():  # recorded when written
                found = file_sha256(path / name) if (path / name).is_file() else "missing"
                if found != digest:
                    raise EtnError(
                        f"{name} has sha256 {found[:12]}… but {file.name} records "
                        f"{str(digest)[:12]}…: the file changed or is corrupt."
                    )
        elif file.suffix == ".safetensors":
            try:
                with safe_open(file, "np") as handle:
                    handle.keys()
            except (SafetensorError, OSError) as err:
                raise EtnError(f"{file.name} is not a readable safetensors file ({err}).") from None
