"""Plans for the user's own shard folders (``[features]``: bring your own features), whose
content keys come from their manifests or, without one, from their shards' checksums."""

from __future__ import annotations

from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.pipeline import Pipeline
from etn_cli.plan_units import FeatureUnit, Plan, group_of
from etn_cli.store.fingerprint import fingerprint_key


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


def own_features(pipeline: Pipeline, data_dir: Path) -> Plan:
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
        fit=unit("fit", spec.fit, Path(spec.fit).name) if spec.fit else None,
        groups=group_of(spec.groups, {folder: Path(folder).name for folder in spec.ood}),
    )
