"""Every check the input files allow, made before any work: before stage zero's fine-tune,
before the first split is extracted.

A run that fine-tunes a backbone for a day and then finds that a Textures image is 500x333
wastes the day. So before ``etn finetune`` trains and before ``etn extract`` claims a split,
every split still to build is read and checked (:func:`check_splits`):

* it has rows;
* every image decodes, and all of them come to one size after the backbone's resize and crop
  (a batch needs one size, and the model one input size), for the ID splits and every OOD list
  alike;
* the splits a head or stage zero fits on (adapt, fit, the fine-tune split) and the ID test
  split hold at least two classes, and every class where a head estimates something per class
  (Mahalanobis, RMDS, DDU, SHE).

Each problem is one line; all of them are gathered and raised as one :class:`EtnError`, so a
user fixes every file at once instead of one per run. A split checked once in a process is not
checked again (its path carries its content key).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.datasets.base import check_inputs
from etn_cli.errors import EtnError

_CHECKED: set[Path] = set()  # unit paths (content-keyed) whose inputs passed in this process
CLASS_ROLES = {
    "tune": "stage zero trains on it",
    "adapt": "the heads fit on it",
    "fit": "the heads fit on it",
    "test": "ID test",
}


def check_splits(
    named: Iterable[tuple[Any, Callable[[], Any]]], transform: Any, every_class: dict | None = None
) -> None:
    """Check each ``(unit, load split)``; raise one EtnError listing every problem found.
    ``every_class`` maps a role to the heads fitted on it that need rows of every class."""
    problems: list[str] = []
    shapes: dict[str, set[tuple[int, int]]] = {}  # each split's sizes after resize and crop
    for unit, load in named:
        if unit.path in _CHECKED:
            continue
        heads = (every_class or {}).get(unit.role, [])
        found = split_problems(unit, load, transform, shapes, heads)
        problems += found
        if not found:
            _CHECKED.add(unit.path)
    problems += [p for p in [mixed_splits(shapes)] if p]
    if len(problems) == 1:
        raise EtnError(problems[0])
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise EtnError(
            f"{len(problems)} problems in the input files, found before any work:\n{lines}"
        )


def split_problems(
    unit: Any,
    load: Callable[[], Any],
    transform: Any,
    shapes: dict[str, set] | None = None,
    every_class: list[str] = (),
) -> list[str]:
    """The problems of one split, each a line naming it (empty: none); its image sizes after
    the transform go into ``shapes``."""
    name = unit_name(unit)
    try:
        split = load()
        if len(split) == 0:
            return [
                f"Split {name} is empty; expected rows. Check that the dataset split is not empty."
            ]
        sizes = check_inputs(split)
    except EtnError as err:
        return [f"{name}: {err}"]
    if sizes and transform is not None and shapes is not None:
        shapes[name] = {transform.output_size(*size) for size in sizes}
    problems = [size_problem(name, sizes, transform)]
    if unit.role in CLASS_ROLES:
        problems.append(class_problem(name, unit.role, split_labels(split)))
    if every_class:
        problems.append(missing_classes(name, split_labels(split), split.num_classes, every_class))
    return [p for p in problems if p]


def missing_classes(name: str, labels: Any, classes: int, heads: list[str]) -> str | None:
    """Heads that estimate something per class (Mahalanobis, RMDS, DDU, SHE) refuse a fit
    split without rows of some class; said from the labels, before any work."""
    if labels is None:
        return None
    missing = np.flatnonzero(np.bincount(labels[labels >= 0], minlength=classes) == 0)
    if not len(missing):
        return None
    shown = ", ".join(str(c) for c in missing[:10]) + (" ..." if len(missing) > 10 else "")
    return (
        f"Split {name} has no rows of {len(missing)} of its {classes} classes ({shown}), but "
        f"{', '.join(heads)} need rows of every class. Use a larger or stratified split."
    )


def size_problem(name: str, sizes: Any, transform: Any) -> str | None:
    """Images the backbone's transform leaves of several sizes cannot share a batch."""
    if not sizes or transform is None:
        return None
    shapes = sorted({transform.output_size(*size) for size in sizes})
    if len(shapes) < 2:
        return None
    return (
        f"Images of split {name} come to the sizes {shapes[:3]} (width, height) after the "
        "backbone's resize and crop; the model needs one size. Set crop = N (and resize) in the "
        "pipeline's [backbone] table."
    )


def mixed_splits(shapes: dict[str, set[tuple[int, int]]]) -> str | None:
    """Splits each of one size, but not all of the same: the model would see the OOD sets at
    another resolution than the one it learnt on (OpenOOD resizes every set to the ID size)."""
    single = {name: next(iter(found)) for name, found in shapes.items() if len(found) == 1}
    if len(set(single.values())) < 2:
        return None
    by_size: dict[tuple[int, int], list[str]] = {}
    for name, size in single.items():
        by_size.setdefault(size, []).append(name)
    shown = "; ".join(f"{w}x{h}: {', '.join(names)}" for (w, h), names in sorted(by_size.items()))
    return (
        f"The splits come to different image sizes after the backbone's resize and crop ({shown}); "
        "expected one input size for every split. Set resize and crop in the [backbone] table."
    )


def class_problem(name: str, role: str, labels: np.ndarray | None) -> str | None:
    """A split of one class: nothing wrong to rank against right, nothing to fit between."""
    if labels is None:
        return None
    classes = np.unique(labels[labels >= 0])
    if len(classes) != 1:
        return None
    return (
        f"Split {name} ({CLASS_ROLES[role]}) holds only class {classes[0]} in its {len(labels)} "
        "rows; expected at least two classes. Use a split with several classes."
    )


def split_labels(split: Any) -> np.ndarray | None:
    """The labels of ``split``'s rows where its data holds them as an array, else None."""
    from torch.utils.data import Subset

    data, rows = split.data, None
    while isinstance(data, Subset):
        chosen = np.asarray(data.indices)
        rows = chosen if rows is None else chosen[rows]
        data = data.dataset
    labels = getattr(data, "labels", None)
    if labels is None:
        return None
    labels = np.asarray(labels)
    return labels if rows is None else labels[rows]


def unit_name(unit: Any) -> str:
    """``image_list:texture`` for a dataset's split, the role for your own."""
    dataset, split = getattr(unit, "dataset", None), getattr(unit, "split", None)
    return f"{dataset}:{split}" if dataset else f"{getattr(unit, 'name', '?')} ({unit.role})"


def check_planned_inputs(plan: Any, every_class: bool = False) -> None:
    """:func:`check_splits` over the fine-tune split (unless trained) and every feature split
    still to extract: what stage zero runs first (``etn finetune``). ``every_class``: also the
    classes the planned heads need (``etn run``, which goes on to train them)."""
    import functools
    from types import SimpleNamespace

    from etn_cli.planning.plan import load_unit_split, open_source
    from etn_cli.store.writing.manifest import split_is_complete

    named: list[tuple[Any, Callable[[], Any]]] = []
    if (tune := plan.finetune) is not None and not tune.complete():
        unit = SimpleNamespace(path=tune.path, dataset=tune.dataset, split=tune.split, role="tune")
        source = open_source(plan.pipeline, tune.dataset)
        named.append((unit, functools.partial(source.load_split, tune.split)))
    for unit in plan.feature_units:
        if not split_is_complete(unit.path):
            named.append((unit, functools.partial(load_unit_split, plan.pipeline, unit)))
    roles = every_class_roles(plan) if every_class else None
    live = plan.backbone.build() if plan.backbone is not None else None  # its model not built
    check_splits(named, getattr(live, "transform", None), roles)


def every_class_roles(plan: Any) -> dict[str, list[str]]:
    """Role of a fit split -> the planned heads fitted on it that need rows of every class."""
    roles: dict[str, list[str]] = {}
    for unit in plan.heads:
        if getattr(unit.head, "needs_every_class", False):
            names = roles.setdefault(plan.fit_unit(unit.head).role, [])
            names += [] if unit.head.label in names else [unit.head.label]
    return roles
