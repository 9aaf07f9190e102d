"""``etn ls``: what etn has registered, as aligned text a person reads and greps.

The command gathers the entries (:mod:`etn_cli.cli.inspect`, which knows the registries);
this module only lays them out. Heads come with their family and what they need beyond the
cached features (the backbone's classifier, intermediate layers, ID statistics of the ``fit``
split); pipelines (and examples) are files with a one-line description each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from etn_cli.errors import UsageError


@dataclass(frozen=True)
class HeadEntry:
    """One line of ``etn ls heads``: a registered head, and the other names it goes by
    (OpenOOD's and pytorch-ood's, e.g. ``msp`` for ``map``)."""

    name: str
    family: str
    label: str
    needs: tuple[str, ...]
    aliases: tuple[str, ...]


def head_needs(needs: tuple[str, ...]) -> list[str]:
    """What a head needs beyond hidden states and logits, from its record's ``needs``."""
    shown = {"classifier": "classifier", "layers": "layers", "id_statistics": "ID statistics"}
    return [text for need, text in shown.items() if need in needs]


def head_listing(entries: list[HeadEntry]) -> str:
    """One line per head: name, family, label, what it needs, and the other names."""
    rows = [("name", "family", "label", "needs", "also")]
    for e in entries:
        rows.append(
            (e.name, e.family, e.label, ", ".join(e.needs) or "-", ", ".join(e.aliases) or "-")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[4]]).rstrip()
        for r in rows
    )


def described_listing(rows: list[tuple[str, str]], width: int = 100) -> str:
    """One line per ``(name, description)``, the descriptions aligned and cut to ``width``
    columns (a cut one ends in "…")."""
    if not rows:
        return ""
    column = max(len(name) for name, _ in rows) + 2
    room = max(width - column, 20)
    return "\n".join(
        (name.ljust(column) + (text if len(text) <= room else text[: room - 1] + "…")).rstrip()
        for name, text in rows
    )


def missing_folder(folder: Path) -> UsageError:
    return UsageError(
        f"Expected a folder of pipeline files at {folder}, found none. Pass --folder with the "
        "folder that holds your *.toml files, or leave it out for the shipped pipelines."
    )
