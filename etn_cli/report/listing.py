"""``etn ls``: what etn has registered, as aligned text a person reads and greps.

Heads come with their family and what they need beyond the cached features (the backbone's
classifier, intermediate layers, ID statistics of the ``fit`` split); pipelines are the
``*.toml`` files of a folder.
"""

from __future__ import annotations

from pathlib import Path


def listing(what: str, folder: Path) -> str:
    if what == "pipelines":
        if not folder.is_dir():
            from etn_cli.cli_options import UsageError

            raise UsageError(
                f"Expected a folder of pipeline files at {folder}, found none. Pass --folder "
                "with the folder that holds your *.toml files (the shipped ones are in the "
                "repository's pipelines/)."
            )
        return "\n".join(str(p) for p in sorted(folder.glob("*.toml")))
    if what == "heads":
        return _heads()
    if what == "backbones":
        from etn_cli.backbones import backbones

        return "\n".join(backbones.names())
    from etn_cli.datasets import datasets

    return "\n".join(datasets.names())


def head_needs(cls: type) -> list[str]:
    """What a head needs beyond hidden states and logits."""
    needs = [
        ("classifier", getattr(cls, "needs_classifier", False)),
        ("layers", getattr(cls, "needs_layers", False)),
        ("ID statistics", getattr(cls, "needs_id_statistics", False)),
    ]
    return [name for name, needed in needs if needed]


def _heads() -> str:
    from etn_cli.heads import heads

    rows = [("name", "family", "label", "needs")]
    for name in heads.names():
        cls = heads.get(name)
        needs = ", ".join(head_needs(cls)) or "-"
        rows.append((name, getattr(cls, "family", "other"), cls.label, needs))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[3]]) for r in rows
    )
