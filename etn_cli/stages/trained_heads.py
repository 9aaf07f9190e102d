"""Finding the heads ``etn train`` wrote: by folder, by folder name under a data directory, or
by a pipeline's head name (or report label) and seed; and loading one without unpickling.

The Python API (:mod:`etn_cli.api.heads`),
:class:`~etn_cli.api.evidential_model.EvidentialModel` and ``etn predict`` share these;
nothing here imports torch until a head is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head
from etn_cli.planning.plan import HeadUnit, Plan
from etn_cli.planning.shipped import shown
from etn_cli.stages.predict_options import no_head, no_seed
from etn_cli.store.storage import default_data_dir


def data_directory(data_dir: str | Path | None) -> Path:
    """``data_dir``, else the command line's default (:func:`default_data_dir`)."""
    return Path(data_dir).expanduser() if data_dir is not None else default_data_dir()


def read_head(folder: str | Path) -> Head:
    """Load the head in ``folder`` (``head.json`` + ``weights.safetensors``), checked against
    the checksums in its ``train.json`` when ``etn train`` wrote it, else against the
    ``checksums.sha256`` that ``Head.save`` writes."""
    from safetensors import SafetensorError

    folder = Path(folder)
    missing = [n for n in ("head.json", "weights.safetensors") if not (folder / n).is_file()]
    if missing:
        raise EtnError(
            f"{folder} is not a trained head folder ({' and '.join(missing)} missing). Point at "
            "a folder `etn train` wrote, <data-dir>/heads/<head>-<key>, or one Head.save wrote."
        )
    from etn_cli.store.artefacts.headfiles import check_head_folder, check_saved_head

    if (folder / "train.json").is_file():  # etn train wrote it: check it against its record
        check_head_folder(folder)
    else:
        check_saved_head(folder)
    try:
        return Head.load(folder)
    except (json.JSONDecodeError, KeyError, SafetensorError) as err:
        raise EtnError(
            f"Head folder {folder} is damaged ({type(err).__name__}: {err}). Retrain the head "
            "(`etn train --force`)."
        ) from None


def plan_of(pipeline: str | Path, data_dir: str | Path | None) -> Plan:
    """The plan of a pipeline whose trained heads are read: nothing is built (a digits CNN not
    trained yet leaves its heads untrained, which :func:`pipeline_head` then says)."""
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan

    return make_plan(load_pipeline(Path(pipeline)), data_directory(data_dir))


def pipeline_head(plan: Plan, head: str, seed: int) -> HeadUnit:
    """The trained unit of ``plan`` called ``head`` (name, label, folder or a registry alias
    such as ``msp``) for ``seed``; a seed-free head has one unit, found for any seed."""
    from etn_cli.heads import heads

    where = plan.pipeline.path
    head = heads.get(head).name if head in heads else head  # an alias (msp) names its head
    named = [u for u in plan.heads if head in (u.head.name, u.label, u.path.name)]
    if not named:
        labels = {u.label for u in plan.heads}
        raise no_head(where, head, {u.head.name for u in plan.heads}, labels)
    units = [u for u in named if u.seed == seed or u.head.seed_free]  # seed-free: one unit
    exact = [u for u in units if u.label.casefold() == head.casefold()]
    units = exact if len(exact) == 1 else units  # "etn" is the ETN, not also ETN + TS
    if not units:
        raise no_seed(where, head, sorted({u.seed for u in named}), seed)
    if len(units) > 1:
        found = "; ".join(f"{u.label!r} ({u.path.name})" for u in units)
        raise EtnError(
            f"Head {head!r} is ambiguous in {where}: it matches {found}. Pass one of these "
            "labels or folder names instead."
        )
    unit = units[0]
    if not (unit.path / "train.json").is_file():
        raise EtnError(
            f"Head {unit.label!r} (seed {seed}) of {where} is not trained: expected it at "
            f"{unit.path}. Run `etn train {shown(where)}` (or `etn run`) first."
        )
    return unit


def find_head_folder(name_or_path: str | Path, data_dir: str | Path | None) -> Path:
    """A folder as given, else the trained head under ``<data_dir>/heads`` that ``name``
    names: the folder name, a head name (``etn``) or a folder-name prefix (``etn-3f2a``)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name, root = str(name_or_path), data_directory(data_dir) / "heads"
    trained = sorted(
        d for d in (root.iterdir() if root.is_dir() else ()) if (d / "train.json").is_file()
    )
    trained = [d for d in trained if ".partial-" not in d.name and ".old-" not in d.name]
    found = [
        d
        for d in trained
        if d.name == name
        or d.name.rsplit("-", 1)[0] == name
        or ("-" in name and d.name.startswith(name))
    ]
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(d.name for d in found)
        raise EtnError(f"Head {name!r} is ambiguous in {root}: {names}. Pass a full folder name.")
    available = ", ".join(d.name for d in trained) or "none"
    raise EtnError(
        f"No head folder {path} and no trained head {name!r} in {root} (available: "
        f"{available}). Pass a head folder, set data_dir=..., or run `etn train` first."
    )
