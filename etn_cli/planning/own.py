"""Plans for the user's own features (``[features]``): files to import into the data directory
or shard folders read in place (:mod:`etn_cli.own_features.units`), whose content keys come
from their manifests, their shards' checksums or the imported file's sha256."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.own_features import units
from etn_cli.planning.pipeline import Pipeline
from etn_cli.planning.units import FeatureUnit, Plan, group_of


def ood_names(entries: tuple[str, ...], where: Path) -> dict[str, str]:
    """Each OOD entry's name in reports: its last path segment without suffix (``svhn``), or,
    where two entries share it (``x/svhn``, ``y/svhn``), the entry as written without suffix."""
    if len(set(entries)) < len(entries):
        twice = sorted({e for e in entries if entries.count(e) > 1})
        raise EtnError(f"{where} [features] ood lists {twice} twice. List each OOD set once.")
    stems = [Path(entry).stem for entry in entries]
    names = {
        e: s if stems.count(s) == 1 else str(Path(e).with_suffix("")).strip("/")
        for e, s in zip(entries, stems, strict=True)
    }
    if len(set(names.values())) < len(names):
        raise EtnError(
            f"{where} [features] ood entries {sorted(names)} name the same set twice. List each "
            "OOD folder or file once."
        )
    return names


def own_features(pipeline: Pipeline, data_dir: Path) -> Plan:
    """The plan of a ``[features]`` pipeline; heads are added by ``make_plan``."""
    spec = pipeline.features
    assert spec is not None
    store = units.own_store(pipeline, data_dir)

    def unit(role: str, entry: str, name: str) -> FeatureUnit:
        path, fingerprint = units.feature_entry(pipeline, store, role, entry)
        return FeatureUnit(role, name, path, fingerprint=fingerprint)

    names = ood_names(spec.ood, pipeline.path)
    plan = Plan(
        pipeline=pipeline,
        data_dir=data_dir,
        backbone_name=spec.backbone,
        id_dataset=spec.id_dataset,
        adapt=unit("adapt", spec.adapt, spec.id_dataset),
        test=unit("test", spec.test, spec.id_dataset),
        ood=tuple(unit("ood", entry, names[entry]) for entry in spec.ood),
        classifier_path=None,
        fit=unit("fit", spec.fit, Path(spec.fit).stem) if spec.fit else None,
        groups=group_of(spec.groups, names),
    )
    calibration = own_calibration(pipeline, spec, unit, plan.test.path)
    plan = dataclasses.replace(plan, calibration=calibration)
    source = units.classifier_source(pipeline, plan)
    path = units.classifier_path(store, source)
    return dataclasses.replace(plan, classifier_source=source, classifier_path=path)


def own_calibration(
    pipeline: Pipeline, spec: object, unit: object, test: Path
) -> FeatureUnit | None:
    """``[conformal]``'s calibration features of a ``[features]`` pipeline: a folder (or
    file) of its own, or None for a held-out part of the test folder (``split = "test"``).
    Holding rows of the adaptation folder out of head fitting needs etn to extract them, so
    the default is refused with what to write instead, and so is the test folder itself
    (sets calibrated on the rows they are measured on)."""
    conformal = pipeline.conformal
    if conformal is None or conformal.split == "test":
        return None
    if conformal.split in (None, "adapt", spec.adapt):  # type: ignore[attr-defined]
        raise EtnError(
            f"{pipeline.path} [conformal] needs calibration rows no head was fitted on; with "
            '[features], write split = "test" (a held-out part of the test folder) or split = '
            '"<folder or file of calibration features>".'
        )
    calibration = unit("calibration", conformal.split, "calibration")  # type: ignore[operator]
    if calibration.path.resolve() == test.resolve():
        raise EtnError(
            f"{pipeline.path} [conformal] split {conformal.split!r} is the [features] test split; "
            'expected calibration rows the sets are not measured on. Write split = "test" (a '
            "held-out part of it) or name another folder or file."
        )
    return calibration
