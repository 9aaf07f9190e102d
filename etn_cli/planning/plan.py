"""Resolve a pipeline against a data directory into content-keyed units of work.

Every unit's folder name ends in a key computed from everything that changes its output
(Hugging Face datasets / DVC style): a finished unit is never rewritten, a changed setting
gives a new key, and a rerun finds the finished units and skips them.

```
<data>/backbones/<name>-<key>/                     backbones etn builds itself (digits CNN)
<data>/backbones/<name>-finetune-<key>/            etn finetune's weights or adapter + finetune.json
<data>/features/<backbone>-<key>/classifier.safetensors
<data>/features/<backbone>-<key>/<dataset>.<split>-<key>/   manifest.json + shard-*.h5
<data>/heads/<head>-<key>/                         head.json, weights.safetensors, train.json
<data>/metrics/<pipeline>/<head>-<key>.parquet     long-format metrics of one head
<data>/reports/<pipeline>/                         tables, results.json, plots
<data>/reports/<pipeline>+<8 hex>/                 the same for a --set / --only selection
```
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.config import build_config, config_dict
from etn_cli.errors import EtnError, did_you_mean
from etn_cli.heads.facts import CALIBRATION_VERSION, HEAD_FORMAT
from etn_cli.own_features.units import drop_unusable
from etn_cli.planning.backbone import planned_backbone
from etn_cli.planning.own import own_features
from etn_cli.planning.pipeline import HeadSpec, Pipeline, check_groups, check_names, missing_root
from etn_cli.planning.units import (
    BackboneSpec,
    FeatureUnit,
    FinetuneUnit,
    HeadUnit,
    MetricsUnit,
    Plan,
    PlannedHead,
    group_of,
)
from etn_cli.store.content import use_data_dir
from etn_cli.store.fingerprint import fingerprint_key

EXTRACT_VERSION = 1  # bump when extraction's outputs change for the same inputs
METRICS_VERSION = 6  # 3: OpenOOD's aupr_in/aupr_out/fpr95 (OOD positive); 4: reliability bins;
# 5: timing repeats, selective prediction, per-row predictions, conformal sets; 6: selective
# prediction by the confidence shown (a calibrated head's MP after its temperature)
SUBSAMPLE_SEED = 0  # fixes the rows that ``fit_rows`` keeps
FINETUNE_VERSION = 1
# [finetune] settings that change speed or memory, never the weights
RUNTIME_SETTINGS = ("workers", "gradient_checkpointing")


# a command that extracts builds the backbone's stage zero while planning: given the planned
# spec and a way to plan it again, it returns the spec as built (:mod:`etn_cli.stages.prepare`)
StageZero = Callable[[BackboneSpec, Callable[[], BackboneSpec]], BackboneSpec]


def make_plan(pipeline: Pipeline, data_dir: Path, stage_zero: StageZero | None = None) -> Plan:
    """All units of ``pipeline`` with their keys and paths, from files and settings: nothing is
    built, trained, loaded or written, no device is touched and torch is not imported. With
    ``stage_zero`` (commands that extract), the backbone's stage zero is built once the names
    and input files are checked, before the features are keyed by what it built."""
    data_dir = Path(data_dir).resolve()
    use_data_dir(data_dir)  # the digests of your input files are remembered there
    check_names(pipeline)  # the registries' tables: no head, backbone or dataset imported
    _check_names(pipeline)  # a misspelt name fails before a backbone builds anything
    if pipeline.features:
        plan = own_features(pipeline, data_dir)
    else:
        plan = _extracted(pipeline, data_dir, stage_zero)
    names = [unit.name for unit in plan.ood]
    if len(set(names)) < len(names):  # one name, one metrics key: a second set would vanish
        twice = sorted({name for name in names if names.count(name) > 1})
        raise EtnError(
            f"{pipeline.path}: the OOD sets {twice} appear twice under one name. List each OOD "
            "set once."
        )
    heads, skipped = drop_unusable(_head_units(plan), plan)
    plan = dataclasses.replace(plan, heads=tuple(heads), skipped=tuple(skipped))
    return dataclasses.replace(plan, metrics=tuple(_metrics_unit(plan, unit) for unit in heads))


def open_source(pipeline: Pipeline, dataset: str) -> Any:
    """The registered dataset ``dataset`` with the pipeline's root and its options table."""
    from etn_cli.datasets import datasets

    data = pipeline.data
    assert data is not None
    root = str(pipeline.resolve(data.root)) if data.root else None
    return datasets.get(dataset)(root=root, **data.options.get(dataset, {}))


def load_unit_split(pipeline: Pipeline, unit: FeatureUnit) -> Any:
    """The dataset split a feature unit extracts: the whole split, for ``fit_rows`` a seeded
    subsample of it (:func:`etn_cli.datasets.base.subsample`), or for a ``part`` the rows kept
    for fitting or held out for conformal calibration."""
    from etn_cli.datasets.base import held_out, select_rows, subsample

    split = open_source(pipeline, unit.dataset).load_split(unit.split)
    if unit.part is not None:
        which, fraction, seed = unit.part
        held = held_out(len(split), fraction, seed)
        return select_rows(split, np.flatnonzero(held if which == "holdout" else ~held))
    return subsample(split, unit.rows, SUBSAMPLE_SEED) if unit.rows else split


def checked_source(pipeline: Pipeline, dataset: str, split: str, where: str = "") -> Any:
    """``open_source`` for a split the dataset has; otherwise one line naming the close ones
    (or, for a dataset of your own files, the root folder that does not exist)."""
    from etn_cli.datasets.base import PathSplits

    source = open_source(pipeline, dataset)
    root = source.root_path() if isinstance(source, PathSplits) else None
    if root is not None and not root.is_dir():
        data = pipeline.data
        raise missing_root(pipeline, root, dataset, data.adapt if data else split)
    if not source.has_split(split):
        names = source.available()
        hint = did_you_mean(split, names, cutoff=0.5)
        raise EtnError(
            f"Dataset {dataset!r} has no split {split!r} ({pipeline.path}{where}).{hint} "
            f"Available: {', '.join(names) or 'none'}"
        )
    return source


def _check_names(pipeline: Pipeline) -> None:
    """Heads with their settings, datasets and splits exist; checked before anything is built."""
    for spec in pipeline.heads:
        planned_head(pipeline, spec, 0)  # settings that only a head's settings class refuses
    _check_odin_temperature(pipeline)
    data = pipeline.data
    if data is not None:
        from etn_cli.datasets import datasets

        _named(pipeline, "[data] id", datasets.get, data.id)
        for dataset, _ in data.ood_sources():
            _named(pipeline, "[data] ood", datasets.get, dataset)
        try:
            check_groups(data.groups, data.ood, "[data.groups]")
        except EtnError as err:
            raise EtnError(f"{pipeline.path} {err}") from None
        for dataset, split in [(data.id, data.adapt), (data.id, data.test), *data.ood_sources()]:
            checked_source(pipeline, dataset, split)
        _check_apart(pipeline)
        if pipeline.finetune is not None:
            checked_source(pipeline, data.id, pipeline.finetune.split, " [finetune]")
        if data.fit is not None:
            checked_source(pipeline, data.id, data.fit, " [data] fit")


def _check_odin_temperature(pipeline: Pipeline) -> None:
    """With ``[backbone] odin = true`` extract stores ODIN's logits already divided by the
    backbone's ``odin_temperature`` (the perturbation depends on it too), so an ODIN head's own
    ``temperature`` would be ignored: each value a new head key with identical results. The
    head refuses any but its default where the features carry ODIN's logits (``ODIN._fit``)."""
    options = pipeline.backbone_options
    if options.get("odin") is not True:
        return
    from etn_cli.heads.settings import ODINConfig

    fixed = float(options.get("odin_temperature", 1000.0))
    for spec in pipeline.heads:
        value = spec.settings.get("temperature")
        if spec.name == "odin" and value is not None and value != ODINConfig.temperature:
            raise EtnError(
                f"{pipeline.path} [[heads]] 'odin' key 'temperature' = {value} would be ignored: "
                f"[backbone] odin = true stores logits at odin_temperature = {fixed}. Set "
                "odin_temperature in [backbone] and drop the head's temperature."
            )


def _check_apart(pipeline: Pipeline) -> None:
    """The adaptation and test splits read different data: one list (or folder, or file) in
    both would score the heads on the very rows they adapted on."""
    data = pipeline.data
    assert data is not None
    source = open_source(pipeline, data.id)
    path = source.data_path(data.adapt)
    if data.adapt != data.test and (path is None or path != source.data_path(data.test)):
        return
    both = path or f"{data.id}:{data.adapt}"
    fix = (
        'Split it in two (docs/own-data.md, "An OpenOOD image list", shows how) and name one '
        "in adapt, the other in test."
        if path is not None
        else f"Name another split of {data.id!r} in test."
    )
    raise EtnError(
        f"{pipeline.path} [data] adapt and test both read {both}; expected two disjoint splits, "
        f"or the heads are scored on the rows they adapted on. {fix}"
    )


def _named(pipeline: Pipeline, where: str, get: Any, name: str) -> None:
    """A registered name, or the registry's one line ("Unknown dataset 'x'. Did you mean ...")
    prefixed with the pipeline file and the section and key that name it."""
    try:
        get(name)
    except EtnError as err:
        raise EtnError(f"{pipeline.path} {where}: {err}") from None


def _extracted(pipeline: Pipeline, data_dir: Path, stage_zero: StageZero | None) -> Plan:
    assert pipeline.data is not None and pipeline.backbone is not None
    backbone = planned_backbone(pipeline, data_dir)
    if stage_zero is not None:
        backbone = stage_zero(backbone, lambda: planned_backbone(pipeline, data_dir))
    backbone_fp = backbone.fingerprint
    problems: list[str] = []  # every split's missing files, named at once
    finetune = _finetune_unit(pipeline, data_dir, backbone, problems) if pipeline.finetune else None
    if finetune is not None:
        backbone_fp = {**backbone_fp, "finetune": finetune.key}
    root = data_dir / "features" / f"{pipeline.backbone}-{fingerprint_key(backbone_fp, 12)}"
    data = pipeline.data

    def unit(
        role: str, dataset: str, split: str, name: str, rows: int | None = None, part=None
    ) -> FeatureUnit:
        source = checked_source(pipeline, dataset, split)
        fp = {
            "backbone": backbone_fp,
            "dataset": dataset,
            "split": split,
            "source": _split_fingerprint(source, split, problems),
            "extract_version": EXTRACT_VERSION,
        } | ({"rows": rows, "row_seed": SUBSAMPLE_SEED} if rows else {})
        fp |= {"part": list(part)} if part else {}
        suffix = f".{part[0]}" if part else ""
        folder = root / f"{dataset}.{split}{suffix}-{fingerprint_key(fp)}"
        return FeatureUnit(role, name, folder, dataset, split, fp, rows, part)

    names = [open_source(pipeline, ds).display_name(sp) for ds, sp in data.ood_sources()]
    ood = [unit("ood", ds, sp, n) for (ds, sp), n in zip(data.ood_sources(), names, strict=True)]
    id_name = open_source(pipeline, data.id).display_name(None)  # "my_images" for image_folder
    fit = (
        unit("fit", data.id, data.fit, f"{id_name}:{data.fit}", data.fit_rows) if data.fit else None
    )
    adapt, calibration = unit("adapt", data.id, data.adapt, id_name), None
    conformal = pipeline.conformal
    if conformal is not None and (conformal.split or data.adapt) == data.adapt:
        part = (conformal.holdout, conformal.seed)  # the heads never see the held-out rows
        adapt = unit("adapt", data.id, data.adapt, id_name, part=("fit", *part))
        name = f"{id_name}:{data.adapt} (held out)"
        calibration = unit("calibration", data.id, data.adapt, name, part=("holdout", *part))
    elif conformal is not None and conformal.split != data.test:
        calibration = unit("calibration", data.id, conformal.split, f"{id_name}:{conformal.split}")
    test = unit("test", data.id, data.test, id_name)
    if problems:
        raise input_problems(problems)
    return Plan(
        pipeline=pipeline,
        data_dir=data_dir,
        backbone_name=pipeline.backbone,
        id_dataset=id_name,
        calibration=calibration,
        adapt=adapt,
        test=test,
        ood=tuple(ood),
        classifier_path=root / "classifier.safetensors",
        fit=fit,
        groups=group_of(data.groups, dict(zip(data.ood, names, strict=True))),
        backbone=backbone,
        finetune=finetune,
    )


def _split_fingerprint(source: Any, split: str, problems: list[str]) -> dict[str, Any]:
    """The split's fingerprint; a missing or unreadable file goes into ``problems`` instead,
    so that planning names every one at once (:func:`input_problems`)."""
    try:
        return source.split_fingerprint(split)
    except EtnError as err:
        if str(err) not in problems:
            problems.append(str(err))
        return {"problem": str(err)}


def input_problems(problems: list[str]) -> EtnError:
    """One error naming every missing or unreadable input, one line each, each saying where
    to get it (``etn status``, ``etn run`` and ``--dry-run`` all plan, so all of them list it)."""
    if len(problems) == 1:
        return EtnError(problems[0])
    lines = "\n".join(f"  {problem}" for problem in problems)
    return EtnError(
        f"{len(problems)} problems with the input files, found while planning:\n{lines}"
    )


def _finetune_unit(
    pipeline: Pipeline, data_dir: Path, backbone: BackboneSpec, problems: list[str]
) -> FinetuneUnit:
    """The ``[finetune]`` unit: its key covers the backbone as configured, the training split
    and the settings (checked and completed with defaults when the backbone declares a
    ``FinetuneConfig``), so a changed setting trains anew and an unchanged one never does."""
    from etn_cli.backbones import settings_of

    spec, data = pipeline.finetune, pipeline.data
    assert spec is not None and data is not None
    source = checked_source(pipeline, data.id, spec.split, " [finetune]")
    settings = dict(spec.settings)
    config_cls = settings_of(backbone.name)[1]
    if config_cls is not None:
        checked = build_config(config_cls, settings, f"{pipeline.path} [finetune]")
        settings = config_dict(checked)
    fp = {
        "backbone": backbone.fingerprint,
        "dataset": data.id,
        "split": spec.split,
        "source": _split_fingerprint(source, spec.split, problems),
        "settings": {k: v for k, v in settings.items() if k not in RUNTIME_SETTINGS},
        "finetune_version": FINETUNE_VERSION,
    }
    key = fingerprint_key(fp)
    path = data_dir / "backbones" / f"{pipeline.backbone}-finetune-{key}"
    return FinetuneUnit(path, key, data.id, spec.split, dict(spec.settings), fp)


def head_label(spec: HeadSpec, head: Any) -> str:
    """The name a head goes by in reports: the pipeline's ``label``, else the head's own
    display label (which may depend on what it was fitted on, like ODIN's), plus its sweep
    point; ``+ TS`` marks a temperature-scaled head."""
    own = head.display_label + (" + TS" if head.config.calibrate == "temperature" else "")
    return sweep_label(spec.label or own, spec.sweep, spec.label is None)


def sweep_label(label: str, point: dict[str, Any], variant_in_label: bool) -> str:
    """``ETN (prior_mode=5)`` for a sweep point; the variant and the calibration are already
    in a default label."""
    in_label = ("variant", "calibrate") if variant_in_label else ()
    shown = {k: v for k, v in point.items() if k not in in_label}
    return f"{label} ({', '.join(f'{k}={v}' for k, v in shown.items())})" if shown else label


def planned_head(pipeline: Pipeline, spec: HeadSpec, seed: int) -> PlannedHead:
    """The head ``spec`` names with its settings and ``seed``, checked against its settings
    class (as the head checks them) without importing it."""
    from etn_cli.heads import heads, settings_of

    name = heads.canonical(spec.name)
    settings = spec.settings | {"seed": seed}
    try:
        config = build_config(settings_of(name), settings, f"head {name!r}")
    except EtnError as err:  # the entry is named once: "... [[heads]] 'etn': key 'lr' ..."
        message = str(err).replace(f"head {spec.name!r} key ", "key ", 1)
        message = message.replace(f"head {name!r} key ", "key ", 1)
        raise EtnError(f"{pipeline.path} [[heads]] {spec.name!r}: {message}") from None
    return PlannedHead(name, settings, config)


def _head_units(plan: Plan) -> list[HeadUnit]:
    from etn_cli.catalogue import METHODS
    from etn_cli.heads import heads

    units = []
    for index, spec in enumerate(plan.pipeline.heads):
        seeds = spec.seeds or plan.pipeline.seeds
        seed_free = METHODS[heads.canonical(spec.name)].seed_free
        for seed in seeds[:1] if seed_free and not spec.seeds else seeds:
            head = planned_head(plan.pipeline, spec, seed)
            fp = {
                "head": head.name,
                "config": config_dict(head.config),
                "adapt": plan.fit_unit(head).key,
                "classifier": plan.classifier_path.parent.name
                if head.needs_classifier and plan.classifier_path
                else None,
                "head_format": HEAD_FORMAT,
            }
            if head.version:  # only then: every other head keeps its key
                fp["version"] = head.version
            if head.config.calibrate != "none":
                fp["calibration"] = CALIBRATION_VERSION
            key = fingerprint_key(fp)
            label = head_label(spec, head)
            path = plan.data_dir / "heads" / f"{head.name}-{key}"
            units.append(HeadUnit(index, head, seed, label, path, key))
    return units


def _metrics_unit(plan: Plan, unit: HeadUnit) -> MetricsUnit:
    fp = {
        "pipeline": plan.pipeline.name,
        "head": unit.key,
        "label": unit.label,
        "test": plan.test.key,
        "ood": {u.name: u.key for u in plan.ood},
        "metrics_version": METRICS_VERSION,
    } | ({"groups": plan.groups} if plan.groups else {})
    if plan.pipeline.conformal is not None:  # the sets change with their settings and rows
        calibration = plan.calibration.key if plan.calibration else "test"
        conformal = config_dict(plan.pipeline.conformal)
        if conformal["allow_zero_sets"]:  # the default: earlier metrics keep their keys
            del conformal["allow_zero_sets"]
        fp["conformal"] = conformal | {"calibration": calibration}
    key = fingerprint_key(fp)
    path = plan.data_dir / "metrics" / plan.pipeline.name / f"{unit.head.name}-{key}.parquet"
    return MetricsUnit(unit, path, key)
