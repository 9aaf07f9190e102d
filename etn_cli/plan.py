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
<data>/reports/<pipeline>/                         table.md, table.csv, table.tex
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etn_cli.config import config_dict
from etn_cli.errors import EtnError
from etn_cli.heads.base import HEAD_FORMAT, Head
from etn_cli.pipeline import HeadSpec, Pipeline
from etn_cli.store.fingerprint import fingerprint_key

EXTRACT_VERSION = 1  # bump when extraction's outputs change for the same inputs
METRICS_VERSION = 3  # 2: runtime columns, sweep; 3: reliability bins (bin_count, ...)
FINETUNE_VERSION = 1
# [finetune] settings that change speed or memory, never the weights
RUNTIME_SETTINGS = ("workers", "gradient_checkpointing")


@dataclass
class FeatureUnit:
    """One (backbone, dataset, split) of cached features."""

    role: str  # "adapt", "test" or "ood"
    name: str  # the eval-set name in reports
    path: Path
    dataset: str = ""
    split: str = ""
    fingerprint: dict[str, Any] | None = None  # None: the user's own shards

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
    backbone: Any = None  # the (not yet loaded) Backbone when etn extracts
    finetune: FinetuneUnit | None = None  # when the pipeline has a [finetune] table
    heads: list[HeadUnit] = field(default_factory=list)
    metrics: list[MetricsUnit] = field(default_factory=list)

    @property
    def feature_units(self) -> list[FeatureUnit]:
        return [self.adapt, self.test, *self.ood]


def make_plan(pipeline: Pipeline, data_dir: Path) -> Plan:
    """All units of ``pipeline`` with their keys and paths; nothing is loaded or written."""
    data_dir = Path(data_dir).resolve()
    _check_names(pipeline)  # a misspelt name fails before a backbone builds anything
    plan = (
        _own_features(pipeline, data_dir) if pipeline.features else _extracted(pipeline, data_dir)
    )
    plan.heads = _head_units(plan)
    plan.metrics = [_metrics_unit(plan, unit) for unit in plan.heads]
    return plan


def open_source(pipeline: Pipeline, dataset: str) -> Any:
    """The registered dataset ``dataset`` with the pipeline's root and its options table."""
    from etn_cli.datasets import datasets

    data = pipeline.data
    assert data is not None
    root = str(pipeline.resolve(data.root)) if data.root else None
    return datasets.get(dataset)(root=root, **data.options.get(dataset, {}))


def checked_source(pipeline: Pipeline, dataset: str, split: str, where: str = "") -> Any:
    """``open_source`` for a split the dataset has; otherwise one line naming the close ones."""
    import difflib

    source = open_source(pipeline, dataset)
    if split not in source.splits:
        close = difflib.get_close_matches(split, source.splits, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise EtnError(
            f"Dataset {dataset!r} has no split {split!r} ({pipeline.path}{where}).{hint} "
            f"Available: {', '.join(source.splits)}"
        )
    return source


def _check_names(pipeline: Pipeline) -> None:
    """Heads with their settings, datasets and splits exist; checked before anything is built."""
    from etn_cli.heads import heads

    for spec in pipeline.heads:
        try:
            heads.get(spec.name)(**spec.settings)
        except EtnError as err:  # the entry is named once: "... [[heads]] 'etn': key 'lr' ..."
            message = str(err).replace(f"head {spec.name!r} key ", "key ", 1)
            raise EtnError(f"{pipeline.path} [[heads]] {spec.name!r}: {message}") from None
    data = pipeline.data
    if data is not None:
        for dataset, split in [(data.id, data.adapt), (data.id, data.test), *data.ood_sources()]:
            checked_source(pipeline, dataset, split)
        if pipeline.finetune is not None:
            checked_source(pipeline, data.id, pipeline.finetune.split, " [finetune]")


def _resolve_path_options(pipeline: Pipeline, keys: tuple[str, ...]) -> dict[str, Any]:
    """Backbone options naming files (a checkpoint, a model folder, an adapter) are relative to
    the pipeline file when such a file exists there; otherwise they stay as written (a hub id,
    a weights enum name, or a path relative to the working directory)."""
    options = dict(pipeline.backbone_options)
    for key in keys:
        value = options.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            candidate = pipeline.resolve(value)
            if candidate.exists():
                options[key] = str(candidate)
    return options


def _extracted(pipeline: Pipeline, data_dir: Path) -> Plan:
    from etn_cli.backbones import backbones
    from etn_cli.config import build_config

    assert pipeline.data is not None and pipeline.backbone is not None
    cls = backbones.get(pipeline.backbone)
    options = _resolve_path_options(pipeline, getattr(cls, "PATH_OPTIONS", ()))
    config = build_config(cls.Config, options, f"{pipeline.path} [backbone]")
    backbone = cls(config, cache_dir=data_dir / "backbones")
    backbone_fp = backbone.fingerprint()
    finetune = _finetune_unit(pipeline, data_dir, backbone) if pipeline.finetune else None
    if finetune is not None:
        backbone_fp = {**backbone_fp, "finetune": finetune.key}
    root = data_dir / "features" / f"{pipeline.backbone}-{fingerprint_key(backbone_fp, 12)}"
    data = pipeline.data

    def unit(role: str, dataset: str, split: str, name: str) -> FeatureUnit:
        source = checked_source(pipeline, dataset, split)
        fp = {
            "backbone": backbone_fp,
            "dataset": dataset,
            "split": split,
            "source": source.split_fingerprint(split),
            "extract_version": EXTRACT_VERSION,
        }
        return FeatureUnit(
            role, name, root / f"{dataset}.{split}-{fingerprint_key(fp)}", dataset, split, fp
        )

    ood = [
        unit("ood", ds, sp, ds if sp == "test" else f"{ds}:{sp}") for ds, sp in data.ood_sources()
    ]
    return Plan(
        pipeline=pipeline,
        data_dir=data_dir,
        backbone_name=pipeline.backbone,
        id_dataset=data.id,
        adapt=unit("adapt", data.id, data.adapt, data.id),
        test=unit("test", data.id, data.test, data.id),
        ood=ood,
        classifier_path=root / "classifier.safetensors",
        backbone=backbone,
        finetune=finetune,
    )


def _finetune_unit(pipeline: Pipeline, data_dir: Path, backbone: Any) -> FinetuneUnit:
    """The ``[finetune]`` unit: its key covers the backbone as configured, the training split
    and the settings (checked and completed with defaults when the backbone declares a
    ``FinetuneConfig``), so a changed setting trains anew and an unchanged one never does."""
    from etn_cli.config import build_config

    spec, data = pipeline.finetune, pipeline.data
    assert spec is not None and data is not None
    source = checked_source(pipeline, data.id, spec.split, " [finetune]")
    settings = dict(spec.settings)
    config_cls = getattr(backbone, "FinetuneConfig", None)
    if config_cls is not None:
        checked = build_config(config_cls, settings, f"{pipeline.path} [finetune]")
        settings = config_dict(checked)
    fp = {
        "backbone": backbone.fingerprint(),
        "dataset": data.id,
        "split": spec.split,
        "source": source.split_fingerprint(spec.split),
        "settings": {k: v for k, v in settings.items() if k not in RUNTIME_SETTINGS},
        "finetune_version": FINETUNE_VERSION,
    }
    key = fingerprint_key(fp)
    path = data_dir / "backbones" / f"{pipeline.backbone}-finetune-{key}"
    return FinetuneUnit(path, key, data.id, spec.split, dict(spec.settings), fp)


def split_key(path: Path) -> str:
    """The content key of a shard folder: its manifest's key, or for a folder of the user's own
    shards without a manifest, the key of their checksums (as ``read_split`` computes it)."""
    import json

    from etn_cli.store.fingerprint import file_sha256

    manifest = path / "manifest.json"
    if manifest.is_file():
        return json.loads(manifest.read_text())["key"]
    hashes = {p.name: file_sha256(p) for p in sorted(path.glob("*.h5"))}
    if not hashes:
        raise EtnError(
            f"Feature folder {path} holds no *.h5 shards. See the README's shard format."
        )
    return fingerprint_key({"byof": True, "shards": hashes})


def _own_features(pipeline: Pipeline, data_dir: Path) -> Plan:
    spec = pipeline.features
    assert spec is not None

    def unit(role: str, folder: str, name: str) -> FeatureUnit:
        path = pipeline.resolve(folder)
        if not path.is_dir():
            raise EtnError(
                f"Feature folder {path} ({pipeline.path} [features] {role}) does not exist. "
                "Point it at a folder of shard-*.h5 files."
            )
        return FeatureUnit(role, name, path, fingerprint={"byof": split_key(path)})

    return Plan(
        pipeline=pipeline,
        data_dir=data_dir,
        backbone_name=spec.backbone,
        id_dataset=spec.id_dataset,
        adapt=unit("adapt", spec.adapt, spec.id_dataset),
        test=unit("test", spec.test, spec.id_dataset),
        ood=[unit("ood", folder, Path(folder).name) for folder in spec.ood],
        classifier_path=pipeline.resolve(spec.classifier) if spec.classifier else None,
    )


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


def _head_units(plan: Plan) -> list[HeadUnit]:
    from etn_cli.heads import heads

    units = []
    for index, spec in enumerate(plan.pipeline.heads):
        for seed in spec.seeds or plan.pipeline.seeds:
            head = heads.get(spec.name)(**(spec.settings | {"seed": seed}))
            fp = {
                "head": spec.name,
                "config": config_dict(head.config),
                "adapt": plan.adapt.key,
                "classifier": plan.classifier_path.parent.name
                if head.needs_classifier and plan.classifier_path
                else None,
                "head_format": HEAD_FORMAT,
            }
            key = fingerprint_key(fp)
            label = head_label(spec, head)
            path = plan.data_dir / "heads" / f"{spec.name}-{key}"
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
    }
    key = fingerprint_key(fp)
    path = plan.data_dir / "metrics" / plan.pipeline.name / f"{unit.head.name}-{key}.parquet"
    return MetricsUnit(unit, path, key)
