"""``plots.json``: what a report folder holds, read back by the next report of its pipeline.

The record names the files the folder holds per view (``views``: ``summary``, the one every
report writes, ``auroc`` for ``--metric auroc``, ``compare-etn`` for ``--compare ETN`` …, so
that the next report replaces the files of the views it makes and leaves the others), all of
them (``files``), the figures drawn per plot kind (``drawn``) with the sha256 of each
(``sha256``), the key of the metrics they were drawn from (``key``) and the folder it belongs
to (``folder``); it is sealed like every other record (``record_sha256``). The next report
redraws a plot kind unless the key matches and every figure of it still hashes as recorded
(an older etn's record, unsealed and without digests, has every figure redrawn).

A record that does not parse, fails its seal, belongs to another folder or names anything but a
plain file of its own folder (``../../victim.txt``) is damage: :func:`read_plot_record` says so
and the report redraws every figure and writes a new record; ``etn verify`` reports it. Nothing
a damaged record names is ever deleted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from etn_cli.errors import DamagedArtefact
from etn_cli.store.artefacts.sealed import SEAL, check_record_seal, seal_record
from etn_cli.store.atomic import atomic_write_text
from etn_cli.store.fingerprint import file_sha256

PLOT_RECORD = "plots.json"
REPORT_SUFFIXES = (".txt", ".md", ".csv", ".tex", ".png", ".pdf")  # what a report writes
FIELDS = {"key": str, "drawn": dict, "files": list, "sha256": dict, "folder": str}


def plain_name(name: object) -> bool:
    """A file directly inside a folder: no separator, not hidden, not ``.`` or ``..``."""
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and Path(name).name == name
    )


def check_plot_record(record: Any, folder: Path) -> dict[str, Any]:
    """``record`` when it is a whole record of ``folder``; :class:`DamagedArtefact` otherwise."""
    path = folder / PLOT_RECORD

    def damaged(problem: str) -> DamagedArtefact:
        return DamagedArtefact(path, f"{path} {problem}. Run etn report again to redraw it.")

    if not isinstance(record, dict):
        raise damaged(f"holds {type(record).__name__}, expected a JSON object")
    check_record_seal(record, path, path)
    if SEAL not in record:  # an older etn's: no seal, folder or figure digests (all redrawn)
        record = {**record, "sha256": {}, "folder": folder.name}
    wrong = [k for k, kind in FIELDS.items() if not isinstance(record.get(k), kind)]
    if wrong:
        raise damaged(f"lacks or garbles {', '.join(wrong)}")
    if record["folder"] != folder.name:
        raise damaged(f"belongs to the report folder {record['folder']!r}, not {folder.name!r}")
    if not all(isinstance(drawn, list) for drawn in record["drawn"].values()):
        raise damaged("lists its figures as something other than lists of names")
    views = record.get("views", {})
    if not isinstance(views, dict) or not all(isinstance(v, list) for v in views.values()):
        raise damaged("lists its views as something other than lists of names")
    names = list(record["files"]) + list(record["sha256"])
    names += [name for files in views.values() for name in files]
    names += [name for drawn in record["drawn"].values() for name in drawn]
    outside = [name for name in names if not plain_name(name)]
    if outside:
        raise damaged(f"names {outside[0]!r}, which is not a file of its own folder")
    return record


def read_plot_record(folder: Path) -> dict[str, Any]:
    """The folder's record, ``{}`` where there is none; damage raises (see the module doc)."""
    path = folder / PLOT_RECORD
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedArtefact(path, f"{path} cannot be read ({type(err).__name__}).") from None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as err:
        message = f"{path} is not valid JSON ({type(err).__name__}). Run etn report again."
        raise DamagedArtefact(path, message) from None
    return check_plot_record(record, folder)


def intact_figures(folder: Path, record: dict[str, Any], names: list[str]) -> bool:
    """Every one of ``names`` is in ``folder`` and hashes as the record says."""
    digests = record.get("sha256", {})
    for name in names:
        path = folder / name
        if name not in digests or not path.is_file() or file_sha256(path) != digests[name]:
            return False
    return bool(names)


def check_report_folder(record_path: Path) -> None:
    """``etn verify``'s check of a report folder: its record is whole and every figure it
    lists still hashes as recorded."""
    folder = Path(record_path).parent
    record = read_plot_record(folder)
    for name in sorted({name for names in record.get("drawn", {}).values() for name in names}):
        if not intact_figures(folder, record, [name]):
            raise DamagedArtefact(
                record_path,
                f"Figure {folder / name} is missing or no longer matches the sha256 that "
                f"{PLOT_RECORD} records. Run etn report again to redraw it.",
            )


def views_of(record: dict[str, Any]) -> dict[str, list[str]]:
    """The files of each view the record names; an older record, which kept one list, has
    them all in the ``summary`` view (so the next report replaces them, as that etn did)."""
    if "views" in record:
        return record["views"]
    return {"summary": list(record.get("files", []))}


def replace_views(folder: Path, record: dict, made: dict[str, list[str]]) -> dict[str, list[str]]:
    """Remove what an earlier report wrote for the views in ``made`` and this one no longer
    writes (and the unversioned names of older etn: ``frontier.png``, ``plots-<metric>.json``
    …); return every view's files for the record: this report's, and those of the views it
    did not make (``--metric auroc``'s table and plots survive a plain report)."""
    earlier = views_of(record)
    names = {name for files in made.values() for name in files}
    stale = [folder / name for view in made for name in earlier.get(view, [])]
    stale += [*folder.glob("frontier.p[nd][gf]"), *folder.glob("plots-*.json")]
    if "files" not in record:  # tables and plots of an etn that kept no list of them
        stale += [p for p in folder.iterdir() if p.is_file() and p.suffix in REPORT_SUFFIXES]
    for old in stale:
        if old.name not in names:
            old.unlink(missing_ok=True)
    others = {v: [n for n in files if (folder / n).is_file()] for v, files in earlier.items()}
    return {**{v: files for v, files in others.items() if files and v not in made}, **made}


def write_plot_record(folder: Path, key: str, drawn: dict, views: dict[str, list[str]]) -> None:
    """Seal and write the record of what the folder holds: per view, and what was drawn."""
    figures = sorted({name for names in drawn.values() for name in names})
    record = {
        "folder": folder.name,
        "key": key,
        "drawn": drawn,
        "views": views,
        "files": sorted({name for names in views.values() for name in names}),
        "sha256": {name: file_sha256(folder / name) for name in figures},
    }
    atomic_write_text(folder / PLOT_RECORD, json.dumps(seal_record(record)))
