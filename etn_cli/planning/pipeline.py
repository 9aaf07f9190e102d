"""Pipeline files: one TOML per study, listing only what differs from the defaults.

```toml
name = "digits"
seeds = [0, 1, 2]
[backbone]            # any registered backbone; other keys are its options
name = "digits_cnn"
[data]
id = "digits"         # registered dataset with the adaptation and test splits
ood = ["digits_unseen", "digits_noise:test"]
[[heads]]             # any registered head; other keys are its settings
name = "etn"
prior_mode = 10
```

Instead of ``[backbone]`` and ``[data]``, a ``[features]`` table points at shard folders a
user wrote from their own model ("bring your own features"); extract is then skipped.

Optional tables: ``[data.options.<dataset>]`` passes options to one dataset (``download =
true``, ``size = 64``, ...); ``[finetune]`` trains the backbone first (``etn finetune``, stage
zero) on ``split`` of the ID dataset, every other key being a setting the backbone checks;
``[conformal]`` adds conformal prediction sets to the evaluation (:class:`ConformalSpec`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from etn_cli.config import SEED_LIMIT, build_config
from etn_cli.errors import EtnError, did_you_mean


@dataclass(frozen=True)
class DataSpec:
    id: str
    adapt: str = "adapt"
    test: str = "test"
    ood: tuple[str, ...] = ()
    fit: str | None = None  # a split of the ID dataset for ID statistics (``"train"``)
    fit_rows: int | None = None  # a seeded subsample of that many rows of ``fit``
    groups: dict = field(default_factory=dict)  # group -> OOD entries, averaged in reports
    # "paper": every OOD set is OOD, averaged as <id>-OOD; "openood": the report also averages
    # them by kind of shift (semantic-OOD, covariate-OOD), as OpenOOD v1.5 groups ImageNet-R
    grouping: Literal["paper", "openood"] = "paper"
    root: str | None = None  # where datasets that need files on disk look for them
    batch_size: int = 256
    shard_rows: int = 8192  # 100 MB at ResNet-50 width: shards written while extraction runs
    # data-loading processes for extract (torchvision backbones): a number, or "auto"
    workers: int | Literal["auto"] = 0
    options: dict = field(default_factory=dict)  # dataset name -> its options table

    def __post_init__(self) -> None:
        bad_workers = self.workers != "auto" and self.workers < 0
        if self.batch_size < 1 or self.shard_rows < 1 or bad_workers:
            raise EtnError(
                f"[data] expects batch_size >= 1, shard_rows >= 1 and workers >= 0 (or "
                f'"auto"), found {self.batch_size}, {self.shard_rows} and {self.workers}. Fix them.'
            )
        check_fit_rows(self.fit, self.fit_rows, "[data]")
        # [data.groups] is checked while planning, once the OOD entries are known datasets:
        # --set data.ood=["x"] with a misspelt x must say so, not that the groups miss it
        object.__setattr__(self, "workers", loader_workers(self.workers))
        used = {self.id, *(name for name, _ in self.ood_sources())}
        for name, table in self.options.items():
            if name not in used or not isinstance(table, dict):
                raise EtnError(
                    f"[data.options.{name}] must be a table of options for a dataset the "
                    f"pipeline uses ({', '.join(sorted(used))}); found {table!r}."
                )

    def ood_sources(self) -> list[tuple[str, str]]:
        """``(dataset, split)`` per OOD entry; ``name`` alone means its ``test`` split."""
        return [
            tuple(entry.split(":", 1)) if ":" in entry else (entry, "test") for entry in self.ood
        ]


def loader_workers(workers: int | str) -> int:
    """Loader processes for ``[data] workers``: at most the cores this process may use, so a
    pipeline written for a large machine does not oversubscribe a laptop; ``"auto"`` takes
    them all, up to 8 (image decoding rarely needs more per GPU)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    return min(cores, 8) if workers == "auto" else min(int(workers), cores)


@dataclass(frozen=True)
class FeaturesSpec:
    adapt: str
    test: str
    ood: tuple[str, ...] = ()  # shard folders, named by their folder name in reports
    id_dataset: str = "custom"
    backbone: str = "custom"
    classifier: str | None = None  # classifier.safetensors with weight (C, D) and bias (C,)
    fit: str | None = None  # a shard folder of ID training features for ID statistics
    groups: dict = field(default_factory=dict)  # group -> OOD folders, averaged in reports

    def __post_init__(self) -> None:
        check_groups(self.groups, self.ood, "[features.groups]")
        for key in ("backbone", "id_dataset"):  # they name folders in the data directory
            check_path_part(getattr(self, key), f"[features] {key}")


def check_path_part(value: object, where: str) -> None:
    """A value that becomes part of a file name: letters, digits, '.', '-', '_', not starting
    with '.', so it can never name a folder outside the data directory."""
    ok = isinstance(value, str) and value and not value.startswith(".")
    if not ok or not value.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise EtnError(
            f"{where} = {value!r} names folders in the data directory; use letters, digits, '.', "
            "'-' or '_', not starting with '.'. For example: \"my_model\"."
        )


def check_fit_rows(fit: str | None, rows: int | None, where: str) -> None:
    if rows is not None and (fit is None or rows < 1):
        raise EtnError(
            f'{where} fit_rows = {rows} needs fit = "<split>" and a count >= 1. Write e.g. '
            'fit = "train" and fit_rows = 128000.'
        )


def check_groups(groups: dict, ood: tuple[str, ...], where: str) -> None:
    """Each group a non-empty list of OOD entries, each entry in at most one group."""
    seen: set[str] = set()
    for name, members in groups.items():
        if not isinstance(members, list) or not members:
            raise EtnError(
                f"{where} {name} must list OOD entries of the pipeline ({', '.join(ood)}), "
                f"found {members!r}. Write e.g. near = [{', '.join(map(repr, ood[:2]))}]."
            )
        if not set(members) <= set(ood):
            missing = [m for m in members if m not in ood]
            table = where.strip("[]")
            raise EtnError(
                f"{where} {name} lists {missing}, which the OOD entries do not ({', '.join(ood)}); "
                f"expected each group to list OOD entries. Change the group, or drop the groups "
                f"(on the command line: --set '{table}={{}}')."
            )
        if seen & set(members):
            raise EtnError(f"{where}: {sorted(seen & set(members))} are in two groups; keep one.")
        seen |= set(members)


@dataclass(frozen=True)
class FinetuneSpec:
    """``[finetune]``: train the backbone on ``split`` of the ID dataset before extracting."""

    split: str = "train"
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConformalSpec:
    """``[conformal]``: split conformal prediction sets for every head
    (:mod:`etn_cli.metrics.conformal`), calibrated on ``split`` of the ID dataset.

    By default (``split`` unset) the calibration rows are a held-out part (``holdout``) of the
    adaptation split that no head is fitted on. ``split = "test"`` calibrates on a held-out
    part of the test split instead and measures the sets on the rest of it (the heads are
    then fitted as without the section); any other split of the ID dataset (a ``[features]``
    pipeline: a shard folder) is used whole."""

    method: Literal["lac", "aps", "raps"] = "raps"
    alpha: float = 0.1
    split: str | None = None
    holdout: float = 0.2
    penalty: float = 0.01  # RAPS's lambda
    k_reg: int = 5  # RAPS: ranks up to k_reg are not penalised
    randomized: bool = True  # APS and RAPS: u ~ U[0, 1] per row (exact coverage)
    seed: int = 0  # the held-out rows and the uniform draws
    # the RAPS authors' name (and lightning-uq-box's): false puts the top class in every set
    allow_zero_sets: bool = True


@dataclass(frozen=True)
class HeadSpec:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    sweep: dict[str, Any] = field(default_factory=dict)  # this point's values of swept settings
    seeds: tuple[int, ...] | None = None  # the head's own seeds (a swept ``seed``)


@dataclass(frozen=True)
class Pipeline:
    name: str
    path: Path
    heads: tuple[HeadSpec, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    backbone: str | None = None
    backbone_options: dict[str, Any] = field(default_factory=dict)
    data: DataSpec | None = None
    features: FeaturesSpec | None = None
    finetune: FinetuneSpec | None = None
    conformal: ConformalSpec | None = None
    device: str = "auto"
    # what the command line changed: ``--set KEY=VALUE`` overrides and ``--only`` heads; a
    # run whose options change the pipeline reports into its own folder, named by the key of
    # the pipeline they give (:func:`~etn_cli.planning.overrides.selection_key`; None: the
    # file as is)
    overrides: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    selection_key: str | None = None

    def resolve(self, path: str) -> Path:
        """A path from the pipeline file, relative to the file's folder unless absolute."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.path.parent / p

    def standins_hint(self) -> str:
        """For a pipeline next to a ``standins.py`` (the README's examples), how to write the
        stand-ins of the files it reads; otherwise nothing."""
        script = self.path.parent / "standins.py"
        if not script.is_file():
            return ""
        shown = script.relative_to(Path.cwd()) if script.is_relative_to(Path.cwd()) else script
        return f" For the example as shipped, `python {shown}` writes stand-ins of these files."


NAME_LIMIT = 200
TOP_LEVEL = (
    "name",
    "description",
    "seeds",
    "device",
    "backbone",
    "data",
    "features",
    "finetune",
    "conformal",
    "heads",
)


def load_pipeline(
    path: Path, overrides: tuple[str, ...] = (), only: tuple[str, ...] = ()
) -> Pipeline:
    """Parse and check a pipeline file (or the shipped pipeline a name such as ``digits``
    names: :func:`~etn_cli.planning.shipped.find_pipeline`); every problem is one EtnError
    naming file and key.

    ``overrides`` are ``--set KEY=VALUE`` strings applied to the file's tables before it is
    checked (:func:`etn_cli.planning.overrides.apply_overrides`); ``only`` keeps the heads of those
    names or labels (``--only etn,map``)."""
    from etn_cli.planning.overrides import apply_overrides, keep_heads, selection_key
    from etn_cli.planning.shipped import find_pipeline

    path = find_pipeline(path)  # a file, or the shipped pipeline of a name (``digits``)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise EtnError(f"{path} is not valid TOML: {err}. Fix the syntax.") from None
    except UnicodeDecodeError:
        raise EtnError(f"{path} is not a text file. Pass a pipeline .toml file.") from None
    effective = keep_heads(apply_overrides(raw, overrides, path), only, path)
    parsed = parse_pipeline(effective, path)
    key = selection_key(raw, effective)
    changed = {"overrides": tuple(overrides), "only": tuple(only), "selection_key": key}
    return dataclasses.replace(parsed, **changed)


def check_names(pipeline: Pipeline) -> None:
    """The heads (with their settings), the backbone (with its options and ``[finetune]``
    settings) and the datasets ``pipeline`` names exist, checked from the registries' tables:
    no head, backbone or dataset is imported, nor torch, so a misspelt name or setting is one
    line in milliseconds. Planning (:func:`etn_cli.planning.plan.make_plan`) checks the same
    first, with the same lines, and then what needs the sources themselves (their splits,
    their files)."""
    from etn_cli.backbones import backbones
    from etn_cli.datasets import datasets

    check_head_settings(pipeline)
    named = []
    if pipeline.backbone is not None:
        named.append(("[backbone] name", backbones, pipeline.backbone))
    if pipeline.data is not None:
        named.append(("[data] id", datasets, pipeline.data.id))
        named += [("[data] ood", datasets, name) for name, _ in pipeline.data.ood_sources()]
    for where, registry, name in named:
        try:
            registry.canonical(name)
        except EtnError as err:
            raise EtnError(f"{pipeline.path} {where}: {err}") from None
    if pipeline.backbone is not None:
        check_backbone_settings(pipeline)
    if pipeline.data is not None:
        check_data_tables(pipeline, pipeline.data)


def check_head_settings(pipeline: Pipeline) -> None:
    """Each ``[[heads]]`` entry names a head and only its settings, in their ranges."""
    from etn_cli.heads import heads, settings_of

    for spec in pipeline.heads:
        try:
            name = heads.canonical(spec.name)
            build_config(settings_of(name), spec.settings, f"head {name!r}")
        except EtnError as err:  # the entry is named once: "... [[heads]] 'etn': key 'lr' ..."
            message = str(err).replace(f"head {spec.name!r} key ", "key ", 1)
            raise EtnError(f"{pipeline.path} [[heads]] {spec.name!r}: {message}") from None


def check_data_tables(pipeline: Pipeline, data: DataSpec) -> None:
    """``[data.groups]`` names OOD sets of ``[data] ood``; ``[data.options.<name>]`` only the
    options of its dataset."""
    from etn_cli.datasets import check_options

    try:
        check_groups(data.groups, data.ood, "[data.groups]")
    except EtnError as err:
        raise EtnError(f"{pipeline.path} {err}") from None
    for name, options in data.options.items():
        where = f"[data.options.{name}]"
        try:
            check_options(name, options, where)
        except EtnError as err:  # said once: "<file> [data.options.x]: Unknown key ..."
            message = str(err).replace(f" in {where}", "", 1).removeprefix(f"{where} ")
            raise EtnError(f"{pipeline.path} {where}: {message}") from None


def check_roots(pipeline: Pipeline) -> None:
    """A dataset of your own files (:data:`etn_cli.datasets.ROOTED`) needs ``[data] root``,
    an existing folder: checked without importing its source, with planning's lines."""
    from etn_cli.datasets import ROOTED, datasets
    from etn_cli.datasets.settings import no_root

    data = pipeline.data
    if data is None:
        return
    named = [data.id, *(name for name, _ in data.ood_sources())]
    for name in dict.fromkeys(datasets.canonical(n) for n in named):
        if name not in ROOTED:
            continue
        if data.root is None:
            raise no_root(name)
        root = pipeline.resolve(data.root).resolve()
        if not root.is_dir():
            raise missing_root(pipeline, root, name, data.adapt)


def missing_root(pipeline: Pipeline, root: Path, dataset: str, split: str) -> EtnError:
    return EtnError(
        f"The [data] root folder {root} ({pipeline.path}) does not exist; expected the folder "
        f"holding the {dataset!r} splits ({split}, ...). Create it or point root at your "
        "files." + pipeline.standins_hint()
    )


def check_backbone_settings(pipeline: Pipeline) -> None:
    """The ``[backbone]`` options and ``[finetune]`` settings against the backbone's settings
    classes (:mod:`etn_cli.backbones.settings`), with the lines planning would give."""
    from etn_cli.backbones import settings_of

    assert pipeline.backbone is not None
    options, finetune = settings_of(pipeline.backbone)
    build_config(options, pipeline.backbone_options, f"{pipeline.path} [backbone]")
    if pipeline.finetune is None:
        return
    if finetune is None:
        raise EtnError(
            f"{pipeline.path}: Backbone {pipeline.backbone!r} has no fine-tuning stage; remove "
            "[finetune] from the pipeline."
        )
    build_config(finetune, pipeline.finetune.settings, f"{pipeline.path} [finetune]")


def expand_paths(paths: list[Path]) -> list[Path]:
    """Pipeline files, with folders replaced by the ``*.toml`` files inside them (sorted)."""
    expanded: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.toml"))
            if not found:
                raise EtnError(f"Folder {path} holds no *.toml pipeline files.")
            expanded += found
        else:
            expanded.append(path)
    return expanded


def parse_pipeline(raw: dict[str, Any], path: Path) -> Pipeline:
    for key in raw:
        if key not in TOP_LEVEL:
            hint = did_you_mean(key, TOP_LEVEL)
            raise EtnError(
                f"Unknown key {key!r} in {path}.{hint} Allowed top-level keys: "
                f"{', '.join(TOP_LEVEL)}"
            )
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise EtnError(
            f"{path}: name must be letters, digits, '-' or '_' (it names folders in the data "
            f'directory), got {name!r}. Rename it, e.g. name = "digits".'
        )
    if len(name) > NAME_LIMIT:  # folders get "+<8 hex>" and ".lock": 255 bytes is the limit
        raise EtnError(
            f"{path}: name is {len(name)} characters long; expected at most {NAME_LIMIT} (it "
            'names folders in the data directory). Set a shorter name = "..." in the file.'
        )
    if ("features" in raw) == ("backbone" in raw or "data" in raw):
        raise EtnError(
            f"{path}: give either [backbone] and [data] (etn extracts features) or [features] "
            "(your own shards), not both or neither."
        )
    heads = tuple(
        spec
        for i, entry in enumerate(raw.get("heads", []))
        for spec in parse_head(entry, f"{path} [[heads]] #{i + 1}")
    )
    if not heads:
        raise EtnError(f'{path} lists no [[heads]]. Add at least one, e.g. [[heads]] name = "etn".')
    options: dict[str, Any] = {}
    backbone = None
    if "backbone" in raw:
        options = dict(_table(raw, "backbone", path))
        backbone = options.pop("name", None)
        if not isinstance(backbone, str):
            raise EtnError(f'{path} [backbone] needs name = "...". See `etn ls backbones`.')
    return Pipeline(
        name=name,
        path=Path(os.path.abspath(path)),  # not resolved: examples/ in a clone is a link
        heads=heads,
        seeds=_seeds(raw.get("seeds", [0, 1, 2]), path),
        backbone=backbone,
        backbone_options=options,
        data=build_config(DataSpec, _table(raw, "data", path), f"{path} [data]")
        if "data" in raw
        else None,
        features=build_config(FeaturesSpec, _table(raw, "features", path), f"{path} [features]")
        if "features" in raw
        else None,
        finetune=parse_finetune(raw, path) if "finetune" in raw else None,
        conformal=build_config(ConformalSpec, _table(raw, "conformal", path), f"{path} [conformal]")
        if "conformal" in raw
        else None,
        device=raw.get("device", "auto"),
    )


def parse_finetune(raw: dict[str, Any], path: Path) -> FinetuneSpec:
    settings = dict(_table(raw, "finetune", path))
    split = settings.pop("split", "train")
    if "backbone" not in raw or not isinstance(split, str):
        raise EtnError(
            f'{path} [finetune] needs a [backbone] to train and split = "..." naming a split '
            f"of the ID dataset, found split = {split!r}."
        )
    return FinetuneSpec(split, settings)


def parse_head(entry: Any, where: str) -> list[HeadSpec]:
    """One ``[[heads]]`` entry as head specs: one, or one per point of its ``sweep`` table.

    ``sweep = { prior_mode = [1, 10, 100], mc_samples = [1, 20] }`` gives the grid of every
    combination (here 6 heads), each its own cached head and metrics file, so adding a value
    reruns only the new points. A swept ``seed`` replaces the pipeline's seeds for this head.
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise EtnError(f'{where} needs name = "...". See `etn ls heads`.')
    settings = {k: v for k, v in entry.items() if k not in ("name", "label", "sweep")}
    sweep = dict(entry.get("sweep", {})) if isinstance(entry.get("sweep", {}), dict) else None
    if sweep is None:
        raise EtnError(
            f"{where} sweep must be a table of setting = [values], found "
            f"{entry['sweep']!r}. Write e.g. sweep = {{ prior_mode = [1, 10, 100] }}."
        )
    for key, values in sweep.items():
        if not isinstance(values, list) or not values or len(set(map(repr, values))) < len(values):
            raise EtnError(
                f"{where} sweep.{key} must be a non-empty list of distinct values, found "
                f"{values!r}. Write e.g. {key} = [1, 10, 100]."
            )
        if key in settings:
            raise EtnError(
                f"{where} sets {key} both as a setting and in sweep. Keep it in one place."
            )
    seeds = None
    if "seed" in sweep:
        seeds = _seeds(sweep.pop("seed"), Path(where))
    points = [dict(zip(sweep, combo, strict=True)) for combo in itertools.product(*sweep.values())]
    return [
        HeadSpec(entry["name"], settings | point, entry.get("label"), point, seeds)
        for point in points
    ]


def _table(raw: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = raw[key]
    if not isinstance(value, dict):
        raise EtnError(f"{path}: [{key}] must be a table, got {type(value).__name__}.")
    return value


def _seeds(value: Any, path: Path) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)
        or not all(0 <= s < SEED_LIMIT for s in value)
        or len(set(value)) < len(value)
    ):
        raise EtnError(
            f"{path}: seeds must be a non-empty list of integers, got {value!r} (distinct, each "
            "in 0 .. 2**32 - 1, which every random generator takes). Write e.g. seeds = [0, 1, 2]."
        )
    return tuple(value)
