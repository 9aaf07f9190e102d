"""The Python API: etn inside your own code, without the command line or the file store.

Three ways in, from the least wiring to the most:

* **Arrays.** Every head (``etn_cli.ETN``, or any name of ``etn_cli.heads.heads``) has
  ``fit(hidden, logits, labels)`` and ``predict(hidden, logits)``. Inputs are numpy arrays or
  torch tensors (any device and float dtype; they are copied to the CPU as float32):
  ``hidden`` (N, D) is the input of the classifier's final layer, ``logits`` (N, C) its output,
  ``labels`` (N,) class indices. ``predict`` returns a :class:`Prediction` of numpy arrays:
  ``probs`` (N, C), ``predictions`` (N,), ``scores`` (``mp``, ``um``, ``mi``, ``de`` … each
  (N,)) and, for evidential heads, the Dirichlet ``alpha`` (N, C).
* **Trained heads.** :func:`load_head` reads what ``etn train`` (or ``Head.save``) wrote:
  ``head.json`` and ``weights.safetensors``; nothing is ever unpickled.
* **One module.** :class:`EvidentialModel` joins a backbone (a torchvision classifier, or a
  Hugging Face causal LM answering multiple-choice questions) and a trained head: one backbone
  pass gives the prediction, its probabilities and its uncertainty scores (paper Sec. 4: the
  head costs almost nothing next to the backbone).

::

    import etn_cli
    head = etn_cli.ETN(prior_mode=10).fit(hidden, logits, labels)
    model = etn_cli.EvidentialModel.from_torchvision(resnet, head, transform=preprocess)
    out = model(images)  # out.predictions, out.probs, out.mp, out.um, out.mi, out.de
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

from etn_cli.errors import EtnError
from etn_cli.evidential_model import EvidentialModel, EvidentialOutput
from etn_cli.heads import heads
from etn_cli.heads.base import Head, Prediction
from etn_cli.heads.etn import ETN
from etn_cli.plan import HeadUnit, Plan

__all__ = ["ETN", "EvidentialModel", "EvidentialOutput", "Head", "Prediction"]
__all__ += ["load_head", "make_head", "read_head"]
DATA_DIR_ENV = "ETN_DATA_DIR"


# ------------------------------------------------------------------------- finding heads
def make_head(name: str, **settings: Any) -> Head:
    """An unfitted head by its registered name: ``make_head("etn", prior_mode=5)``. Unknown
    names and settings raise, naming the valid ones (``etn ls heads`` lists the names)."""
    return heads.get(name)(**settings)


def data_directory(data_dir: str | Path | None) -> Path:
    """``data_dir``, else ``$ETN_DATA_DIR``, else ``data`` (the command line's default)."""
    return Path(data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV, "data"))


def load_head(
    name_or_path: str | Path | None = None,
    *,
    data_dir: str | Path | None = None,
    pipeline: str | Path | None = None,
    head: str = "etn",
    seed: int = 0,
) -> Head:
    """A trained head, ready for ``predict``:

    * ``load_head("data/heads/etn-<key>")``: its folder;
    * ``load_head("etn-<key>", data_dir="data")``: its folder name under ``<data_dir>/heads``,
      a unique beginning of it (``"etn-3f2a"``), or a head name when one such head exists;
    * ``load_head(pipeline="pipelines/digits.toml", head="etn", seed=0, data_dir="data")``:
      the head ``etn train`` fitted for that pipeline; ``head`` is a head name, a label of the
      report (``"ETN (prior_mode=5)"``) or a folder name.

    ``data_dir`` defaults to ``$ETN_DATA_DIR``, else ``data``.
    """
    if pipeline is not None:
        if name_or_path is not None:
            raise EtnError("Give load_head a head folder or name, or pipeline=..., not both.")
        return read_head(pipeline_head(plan_of(pipeline, data_dir), head, seed).path)
    if name_or_path is None:
        raise EtnError(
            "load_head needs a head folder, a head name with data_dir=..., or pipeline=... ."
        )
    return read_head(find_head_folder(name_or_path, data_dir))


def read_head(folder: str | Path) -> Head:
    """Load the head in ``folder`` (``head.json`` + ``weights.safetensors``)."""
    from safetensors import SafetensorError

    folder = Path(folder)
    missing = [n for n in ("head.json", "weights.safetensors") if not (folder / n).is_file()]
    if missing:
        raise EtnError(
            f"{folder} is not a trained head folder ({' and '.join(missing)} missing). Point at "
            "a folder `etn train` wrote, <data-dir>/heads/<head>-<key>, or one Head.save wrote."
        )
    try:
        return Head.load(folder)
    except (json.JSONDecodeError, KeyError, SafetensorError) as err:
        raise EtnError(
            f"Head folder {folder} is damaged ({type(err).__name__}: {err}). Retrain the head "
            "(`etn train --force`)."
        ) from None


def plan_of(pipeline: str | Path, data_dir: str | Path | None) -> Plan:
    from etn_cli.pipeline import load_pipeline
    from etn_cli.plan import make_plan

    return make_plan(load_pipeline(Path(pipeline)), data_directory(data_dir))


def pipeline_head(plan: Plan, head: str, seed: int) -> HeadUnit:
    """The trained unit of ``plan`` called ``head`` (name, label or folder) for ``seed``."""
    where = plan.pipeline.path
    named = [u for u in plan.heads if head in (u.head.name, u.label, u.path.name)]
    if not named:
        choices = sorted({u.head.name for u in plan.heads} | {u.label for u in plan.heads})
        close = difflib.get_close_matches(head, choices, n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        names = ", ".join(sorted({u.head.name for u in plan.heads}))
        raise EtnError(f"Pipeline {where} has no head {head!r}.{hint} Its heads: {names}.")
    units = [u for u in named if u.seed == seed]
    if not units:
        seeds = sorted({u.seed for u in named})
        raise EtnError(f"Head {head!r} of {where} has seeds {seeds}, not {seed}. Pick one.")
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
            f"{unit.path}. Run `etn train {where}` (or `etn run`) first."
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
