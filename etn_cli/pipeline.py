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
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etn_cli.config import build_config
from etn_cli.errors import EtnError


@dataclass(frozen=True)
class DataSpec:
    id: str
    adapt: str = "adapt"
    test: str = "test"
    ood: tuple[str, ...] = ()
    root: str | None = None  # where datasets that need files on disk look for them
    batch_size: int = 256
    shard_rows: int = 65536

    def ood_sources(self) -> list[tuple[str, str]]:
        """``(dataset, split)`` per OOD entry; ``name`` alone means its ``test`` split."""
        return [
            tuple(entry.split(":", 1)) if ":" in entry else (entry, "test") for entry in self.ood
        ]


@dataclass(frozen=True)
class FeaturesSpec:
    adapt: str
    test: str
    ood: tuple[str, ...] = ()  # shard folders, named by their folder name in reports
    id_dataset: str = "custom"
    backbone: str = "custom"
    classifier: str | None = None  # classifier.safetensors with weight (C, D) and bias (C,)


@dataclass(frozen=True)
class HeadSpec:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    label: str | None = None


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
    device: str = "auto"

    def resolve(self, path: str) -> Path:
        """A path from the pipeline file, relative to the file's folder unless absolute."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.path.parent / p


TOP_LEVEL = ("name", "description", "seeds", "device", "backbone", "data", "features", "heads")


def load_pipeline(path: Path) -> Pipeline:
    """Parse and check a pipeline file; every problem is one EtnError naming file and key."""
    path = Path(path)
    if not path.is_file():
        raise EtnError(
            f"Pipeline file {path} does not exist. List shipped ones with `etn ls pipelines`."
        )
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise EtnError(f"{path} is not valid TOML: {err}. Fix the syntax.") from None
    return parse_pipeline(raw, path)


def parse_pipeline(raw: dict[str, Any], path: Path) -> Pipeline:
    for key in raw:
        if key not in TOP_LEVEL:
            raise EtnError(
                f"Unknown key {key!r} in {path}. Allowed top-level keys: {', '.join(TOP_LEVEL)}"
            )
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise EtnError(f"{path}: name must be letters, digits, '-' or '_', got {name!r}.")
    if ("features" in raw) == ("backbone" in raw or "data" in raw):
        raise EtnError(
            f"{path}: give either [backbone] and [data] (etn extracts features) or [features] "
            "(your own shards), not both or neither."
        )
    heads = tuple(
        parse_head(entry, f"{path} [[heads]] #{i + 1}")
        for i, entry in enumerate(raw.get("heads", []))
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
        path=path.resolve(),
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
        device=raw.get("device", "auto"),
    )


def parse_head(entry: Any, where: str) -> HeadSpec:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise EtnError(f'{where} needs name = "...". See `etn ls heads`.')
    settings = {k: v for k, v in entry.items() if k not in ("name", "label")}
    return HeadSpec(entry["name"], settings, entry.get("label"))


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
    ):
        raise EtnError(f"{path}: seeds must be a non-empty list of integers, got {value!r}.")
    return tuple(value)
