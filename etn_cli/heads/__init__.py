"""Every head etn knows, by name, from the records of :mod:`etn_cli.catalogue`.

The records are read without importing any head (or torch): ``etn --help``, ``etn ls`` and a
pipeline file's misspelt head or setting answer in milliseconds. ``heads.get(name)`` imports
the one module that registers ``name``; its ``@heads.register`` writes the record's facts
(label, family, settings class, needs, version, own score, ...) onto the class, which may not
write them itself, so they are said once.
"""

from __future__ import annotations

import importlib
from typing import Any

from etn_cli.catalogue import METHODS, NEEDS, Method
from etn_cli.heads import settings as _head_settings
from etn_cli.heads.scorers import settings as _scorer_settings
from etn_cli.heads.settings import HeadConfig
from etn_cli.registry import Registry

FACTS = (  # the class attributes a record sets; only Head (etn_cli.heads.base) has defaults
    *("name", "label", "family", "Config", "seed_free", "version", "own_score"),
    *(f"needs_{need}" for need in NEEDS),
    *("reads_hidden", "reads_fit_rows", "higher_means_id"),
)


def settings_of(name: str) -> type[HeadConfig]:
    """The settings class of head ``name`` (or an alias), without importing the head."""
    wanted = METHODS[heads.canonical(name)].settings
    for module in (_head_settings, _scorer_settings):
        if isinstance(getattr(module, wanted, None), type):
            return getattr(module, wanted)
    raise ValueError(f"head {name!r}: no settings class {wanted!r} in either settings module")


def take_record(name: str, cls: Any) -> None:
    """Write method ``name``'s record onto the class that registers it: the record is the one
    place its facts are written, so a class (or a base class below ``Head``) that writes one
    itself is refused."""
    for klass in cls.__mro__:
        if klass.__module__ == "etn_cli.heads.base" or "record" in vars(klass):
            break  # Head's defaults, or a registered head whose facts came from its record
        written = sorted(set(FACTS) & set(vars(klass)))
        if written:
            raise ValueError(
                f"{klass.__module__}.{klass.__name__} writes {', '.join(written)}: head "
                f"{name!r}'s record in etn_cli/catalogue.py is the one place for them"
            )
    record: Method = METHODS[name]
    facts = {
        "name": name, "label": record.label, "family": record.family,
        "Config": settings_of(name), "seed_free": record.seed_free, "version": record.version,
        "own_score": record.score, "higher_means_id": record.higher_means_id,
        "reads_hidden": "hidden" in record.reads, "reads_fit_rows": "fit_rows" in record.reads,
    }  # fmt: skip
    facts |= {f"needs_{need}": need in record.needs for need in NEEDS}
    for attribute, value in facts.items():
        setattr(cls, attribute, value)
    cls.record = record


heads: Registry[Any] = Registry(
    "head",
    {m.name: f"etn_cli.heads.{m.module}" for m in METHODS.values()},
    {alias: m.name for m in METHODS.values() for alias in m.aliases},
    on_register=take_record,
)

_BASE = ("Head", "Prediction")  # in etn_cli.heads.base, which imports torch
__all__ = ["Head", "HeadConfig", "Prediction", "heads", "settings_of"]


def __getattr__(name: str) -> Any:
    """``Head`` and ``Prediction`` (and torch with them) load on first use."""
    if name in _BASE:
        return getattr(importlib.import_module("etn_cli.heads.base"), name)
    raise AttributeError(f"module 'etn_cli.heads' has no attribute {name!r}")
