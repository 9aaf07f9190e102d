"""The backbone of a plan as a spec (:class:`~etn_cli.planning.units.BackboneSpec`): its
checked options, the device it is planned for and its fingerprint, which names the features.

A backbone whose identity is a recipe (the digits CNN: settings, the train split and the
code, plus the sha256 of its trained weights, read from its stage-zero record) is planned
without importing it, or torch. A library's backbone (torchvision, timm, Hugging Face) is
named by what only its library can resolve (weights' names, the library's version, a hub
revision), so planning one imports its module; it still builds no model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from etn_cli.config import build_config
from etn_cli.planning.pipeline import Pipeline
from etn_cli.planning.units import BackboneSpec, planned_device
from etn_cli.store.artefacts.records import intact_record


def planned_backbone(pipeline: Pipeline, data_dir: Path) -> BackboneSpec:
    """The spec of ``pipeline``'s backbone; reads files, builds nothing."""
    from etn_cli.backbones import backbones, settings_of

    assert pipeline.backbone is not None
    name = backbones.canonical(pipeline.backbone)
    cache_dir = Path(data_dir) / "backbones"
    where = f"{pipeline.path} [backbone]"
    if name == "digits_cnn":  # a recipe: planned from its settings and stage-zero record
        from etn_cli.backbones import digits_recipe as recipe

        config = build_config(settings_of(name)[0], dict(pipeline.backbone_options), where)
        recipe.check_layers(config.layers)
        folder = recipe.stage_zero_folder(config, cache_dir)
        sha256 = recipe.recorded_sha256(folder, intact_record(folder, recipe.META_FILE))
        fingerprint = recipe.digits_fingerprint(config, sha256)  # no device: float64 anywhere
        return BackboneSpec(
            name, config, cache_dir, pipeline.device, fingerprint, folder, recipe.META_FILE
        )
    device = planned_device(pipeline.device)  # dtype = "auto" resolves for the run's device
    cls = backbones.get(name)
    options = _resolve_path_options(pipeline, getattr(cls, "PATH_OPTIONS", ()))
    config = build_config(cls.Config, options, where)
    live = cls(config, cache_dir=cache_dir, device=device)  # no model is built
    folder = live.cache_folder()
    if folder is not None:
        live.use_cache(intact_record(folder, live.cache_record))
    return BackboneSpec(
        name, config, cache_dir, device, live.fingerprint(), folder, live.cache_record,
        live.planned_num_classes,
    )  # fmt: skip


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
