"""The units of work a plan is made of (cached features, a fine-tuned backbone, a trained head,
its metrics file) and the plan that holds them; :mod:`etn_cli.planning.plan` resolves a
pipeline into them, :mod:`etn_cli.planning.own` for the user's own shard folders."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etn_cli.heads.base import Head
from etn_cli.planning.pipeline import Pipeline


@dataclass
class FeatureUnit:
    """One (backbone, dataset, split) of cached features."""

    role: str  # "adapt", "fit", "test", "ood" or "calibration"
    name: str  # the eval-set name in reports
    path: Path
    dataset: str = ""
    split: str = ""
    fingerprint: dict[str, Any] | None = None  # None: the user's own shards
    rows: int | None = None  # extract a seeded subsample of this many rows (``fit_rows``)
    # ("fit" | "holdout", fraction, seed): the rows of the split kept for fitting, or the
    # held-out rows that calibrate conformal sets ([conformal] on the adaptation split)
    part: tuple[str, float, int] | None = None

    @property
    def key(self) -> str:
        """The content key: the user's shards' checksum key, or the suffix etn named it by."""
        if self.fingerprint is not None and "byof" in self.fingerprint:
            return self.fingerprint["byof"]
        return self.path.name.rsplit("-", 1)[-1]


@dataclass
class FinetuneUnit:
    """Stage zero: the backbone trained on one split, in a content-keyed folder."""

    path: Path
    key: str
    dataset: str
    split: str
    settings: dict[str, Any]
    fingerprint: dict[str, Any]

    RECORD = "finetune.json"  # written last inside the private folder: the unit is complete

    def complete(self) -> bool:
        """True when the folder holds its record (whether its files are intact is
        :func:`etn_cli.stages.finetune.finetune_damage`'s question)."""
        return (Path(self.path) / self.RECORD).is_file()


@dataclass
class HeadUnit:
    spec_index: int
    head: Head
    seed: int
    label: str
    path: Path
    key: str


@dataclass
class MetricsUnit:
    head: HeadUnit
    path: Path
    key: str


@dataclass
class Plan:
    pipeline: Pipeline
    data_dir: Path
    backbone_name: str
    id_dataset: str
    adapt: FeatureUnit
    test: FeatureUnit
    ood: list[FeatureUnit]
    classifier_path: Path | None
    fit: FeatureUnit | None = None  # ID statistics' split (``[data] fit``), if any
    groups: dict[str, str] = field(default_factory=dict)  # OOD eval set -> its group
    backbone: Any = None  # the (not yet loaded) Backbone when etn extracts
    finetune: FinetuneUnit | None = None  # when the pipeline has a [finetune] table
    heads: list[HeadUnit] = field(default_factory=list)
    metrics: list[MetricsUnit] = field(default_factory=list)
    # [features] pipelines: where the classifier comes from (given, in a file, fitted), and
    # one line per head left out for want of one
    classifier_source: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)
    calibration: FeatureUnit | None = None  # [conformal]'s rows, unless part of the test split

    @property
    def feature_units(self) -> list[FeatureUnit]:
        extra = [u for u in (self.fit, self.calibration) if u is not None]
        return [self.adapt, *extra, self.test, *self.ood]

    @property
    def stores_classifier(self) -> bool:
        """Whether a run writes ``classifier_path``: the backbone's final layer when etn
        extracts, your own features' classifier when a head starts from it."""
        if self.classifier_path is None:
            return False
        return self.backbone is not None or any(u.head.needs_classifier for u in self.heads)

    def fit_unit(self, head: Any) -> FeatureUnit:
        """The split ``head`` is fitted on: ``fit`` for heads that estimate ID statistics
        when the pipeline has one, the adaptation split otherwise."""
        return self.fit if self.fit is not None and head.needs_id_statistics else self.adapt


def group_of(groups: dict[str, list[str]], names: dict[str, str]) -> dict[str, str]:
    """OOD eval-set name -> its group, from ``[data.groups]`` (entries as written in ``ood``)."""
    return {names[entry]: group for group, entries in groups.items() for entry in entries}
