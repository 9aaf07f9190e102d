"""The units of work a plan is made of (cached features, a fine-tuned backbone, a trained head,
its metrics file) and the plan that holds them; :mod:`etn_cli.planning.plan` resolves a
pipeline into them, :mod:`etn_cli.planning.own` for the user's own shard folders.

A plan holds specs (names, settings, keys), never a live head or backbone, and imports no
torch: ``etn status``, ``etn report`` and ``--dry-run`` plan without it. The stages build the
live objects from the specs (:meth:`PlannedHead.build`, :meth:`BackboneSpec.build`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etn_cli.catalogue import METHODS, Method
from etn_cli.heads import facts as head_facts
from etn_cli.planning.pipeline import Pipeline


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class PlannedHead:
    """One head as planned: its registered name, its settings (the seed included) and the
    checked settings object; what it reads from the cache, from its record in
    :mod:`etn_cli.catalogue`. :meth:`build` makes the live head (and imports torch)."""

    name: str
    settings: dict[str, Any]
    config: Any  # the head's settings class, checked and completed with defaults

    @property
    def record(self) -> Method:
        return METHODS[self.name]

    @property
    def label(self) -> str:
        return self.record.label

    @property
    def family(self) -> str:
        return self.record.family

    @property
    def needs_classifier(self) -> bool:
        return "classifier" in self.record.needs

    @property
    def needs_layers(self) -> bool:
        return "layers" in self.record.needs

    @property
    def needs_id_statistics(self) -> bool:
        return "id_statistics" in self.record.needs

    @property
    def needs_every_class(self) -> bool:
        return "every_class" in self.record.needs

    @property
    def seed_free(self) -> bool:
        return bool(self.record.seed_free)

    @property
    def version(self) -> int:
        return self.record.version

    @property
    def variant(self) -> str:
        return head_facts.planned_variant(self.name, self.config)

    @property
    def display_label(self) -> str:
        return head_facts.planned_label(self.name, self.label, self.config)

    def build(self) -> Any:
        """The live head, unfitted (imports its module, and torch)."""
        from etn_cli.heads import heads

        return heads.get(self.name)(**self.settings)


@dataclass(frozen=True)
class BackboneSpec:
    """The backbone a plan extracts with: its name, checked options, the device it was
    planned for and what planning computed of it (its fingerprint, the folder of its stage
    zero, its class count where known without the model). :meth:`build` makes the live one."""

    name: str
    config: Any
    cache_dir: Path
    device: str
    fingerprint: dict[str, Any]
    cache_folder: Path | None = None  # stage zero (the digits CNN's weights), keyed by recipe
    cache_record: str = "meta.json"
    planned_num_classes: int | None = None

    def build(self, device: str | None = None) -> Any:
        """The live backbone on ``device`` (the planned one by default), its model not yet
        loaded (imports its module, and torch)."""
        from etn_cli.backbones import backbones

        cls = backbones.get(self.name)
        device = planned_device(device or self.device)  # "auto": CUDA where there is a GPU
        return cls(self.config, cache_dir=self.cache_dir, device=device)


def planned_device(device: str) -> str:
    """The device a run asked for ``device`` will use, without checking that it exists:
    ``"auto"`` is CUDA where a GPU is visible, else the CPU (always, without torch)."""
    try:
        import torch
    except ImportError:  # nothing runs without torch: a plan to read, status, a dry run
        return "cpu" if device == "auto" else device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return str(torch.device(device))
    except (RuntimeError, ValueError):
        return "cpu"  # a wrong name fails later with a message of its own (resolve_device)


@dataclass(frozen=True)
class HeadUnit:
    spec_index: int
    head: PlannedHead
    seed: int
    label: str
    path: Path
    key: str


@dataclass(frozen=True)
class MetricsUnit:
    head: HeadUnit
    path: Path
    key: str


@dataclass(frozen=True)
class Plan:
    """Every unit of one pipeline, keyed, as :func:`~etn_cli.planning.plan.make_plan` made it
    once: specs, never a live head or backbone, and never changed afterwards."""

    pipeline: Pipeline
    data_dir: Path
    backbone_name: str
    id_dataset: str
    adapt: FeatureUnit
    test: FeatureUnit
    ood: tuple[FeatureUnit, ...]
    classifier_path: Path | None
    fit: FeatureUnit | None = None  # ID statistics' split (``[data] fit``), if any
    groups: dict[str, str] = field(default_factory=dict)  # OOD eval set -> its group
    backbone: BackboneSpec | None = None  # the backbone's spec when etn extracts
    finetune: FinetuneUnit | None = None  # when the pipeline has a [finetune] table
    heads: tuple[HeadUnit, ...] = ()
    metrics: tuple[MetricsUnit, ...] = ()
    # [features] pipelines: where the classifier comes from (given, in a file, fitted), and
    # one line per head left out for want of one
    classifier_source: dict[str, Any] | None = None
    skipped: tuple[str, ...] = ()
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
