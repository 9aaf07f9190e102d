"""What ``etn predict`` checks of its options before the stage loads: ``--threshold`` names a
known score (:data:`~etn_cli.metrics.score_names.HIGHER_MEANS_ID`) and a finite number, and
``--out`` a file etn writes (Parquet or CSV), and an input that reads as a path exists. No
numpy or torch: a mistake is one line at once.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from etn_cli.errors import EtnError, did_you_mean
from etn_cli.metrics.score_names import HIGHER_MEANS_ID

FORMATS = {".parquet": "parquet", ".csv": "csv"}


def parse_thresholds(items: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """``["mi=0.2", "mp@95"]`` -> ``({"mi": 0.2}, {"mp": 95.0})``: fixed values, and the
    percentages of the adaptation split's ID rows a threshold is chosen to keep; names and
    numbers checked."""
    fixed: dict[str, float] = {}
    kept: dict[str, float] = {}
    for item in items:
        at = "@" in item
        name, _, value = item.partition("@" if at else "=")
        name = name.strip().lower()
        try:
            number = float(value.strip().removesuffix("%") if at else value)
        except ValueError:
            number = None
        fits = number is not None and math.isfinite(number) and (not at or 0 < number <= 100)
        if name not in HIGHER_MEANS_ID or not fits:
            raise EtnError(
                f"--threshold expects SCORE@PERCENT (the threshold keeping that share of the "
                f"adaptation split's rows) or SCORE=VALUE, with a score of "
                f"{', '.join(HIGHER_MEANS_ID)}, got {item!r}. E.g. --threshold mp@95."
            )
        (kept if at else fixed)[name] = number
    return fixed, kept


def output_format(path: Path) -> str:
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise EtnError(f"--out must end in .parquet or .csv, got {path}. Rename it.")
    if Path(path).is_dir():
        suffix = Path(path).suffix
        raise EtnError(f"--out {path} is a folder; expected a file. Pass e.g. {path}/out{suffix}.")
    return fmt


def check_out_outside_store(path: Path, data_dir: Path) -> None:
    """``--out`` is not inside a folder etn manages in the data directory (heads, metrics,
    predictions, ...): a file written there would replace or sit among sealed artefacts."""
    inside = Path(os.path.realpath(path)).parent
    store = Path(os.path.realpath(data_dir))
    if inside != store and inside.is_relative_to(store):
        raise EtnError(
            f"--out {path} lies in {inside}, a folder etn manages in the data directory "
            f"{store}; expected a file elsewhere. Pass e.g. --out predictions{Path(path).suffix}."
        )


def check_input_named(text: str) -> None:
    """A path that does not exist is one line saying so, not a dataset lookup: ``INPUTS`` is a
    dataset split only when it reads as one (``digits:test``, ``digits_unseen``)."""
    path = Path(text).expanduser()
    looks_like_path = "/" in text or "\\" in text or text.startswith((".", "~")) or path.suffix
    if looks_like_path and ":" not in text and not path.exists():
        raise EtnError(
            f"Input {text} does not exist. Pass an image folder, a .jsonl file of questions, or a "
            "dataset split such as digits:test (`etn ls datasets` lists the datasets)."
        )


def check_head_named(pipeline: Any, head: str) -> None:
    """A ``--head`` that cannot name any of ``pipeline``'s heads, refused with the stage's line.

    A head goes by its name, an alias, its report label (with a variant, a sweep point or
    ``+ TS`` appended: ``ETN (vector)``) or its folder (``etn-3f2a...``), so anything that
    begins like one of the pipeline's names or labels is left to the stage, which knows the
    full labels; only what cannot match is refused here, before torch loads."""
    from etn_cli.catalogue import METHODS
    from etn_cli.heads import heads

    if head in heads:  # a name or an alias: the stage says whether this pipeline has it
        return
    canonical = [heads.canonical(spec.name) for spec in pipeline.heads]
    labels = [
        spec.label or METHODS[name].label
        for spec, name in zip(pipeline.heads, canonical, strict=True)
    ]
    stems = [label.split(" (")[0].split(" + ")[0] for label in labels]
    starts = {s.casefold() for s in (*canonical, *labels, *stems) if s}
    if any(head.casefold().startswith(s) for s in starts):
        return
    raise no_head(pipeline.path, head, set(canonical), set(labels))


def no_head(where: Any, head: str, names: set[str], labels: set[str]) -> EtnError:
    """The line for a ``--head`` that names none of the heads ``names`` (registered names)
    and ``labels`` (report labels): the stage's and :func:`check_head_named`'s."""
    hint = did_you_mean(head, sorted(names | labels), n=3, cutoff=0.5)
    shown = ", ".join(sorted(names))
    return EtnError(f"Pipeline {where} has no head {head!r}.{hint} Its heads: {shown}.")


def no_seed(where: Any, head: str, seeds: list[int], seed: int) -> EtnError:
    """The line for a ``--seed`` the head was not trained with."""
    return EtnError(f"Head {head!r} of {where} has seeds {seeds}, not {seed}. Pick one.")


def check_head_seed(pipeline: Any, head: str, seed: int) -> None:
    """``--seed`` that the head ``--head`` names (by name or alias) was not trained with,
    refused with the stage's line; a head that draws nothing at random takes any seed."""
    from etn_cli.catalogue import METHODS
    from etn_cli.heads import heads

    if head not in heads or METHODS[heads.canonical(head)].seed_free:
        return
    name = heads.canonical(head)
    specs = [s for s in pipeline.heads if name in (heads.canonical(s.name), s.label)]
    seeds = sorted({seed for spec in specs for seed in spec.seeds or pipeline.seeds})
    if specs and seed not in seeds:
        raise no_seed(pipeline.path, name, seeds, seed)
