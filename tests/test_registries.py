"""The registries' tables of names (read without importing any head, backbone or dataset)
agree with what the modules register: every name in a table is registered by the module it
names, every registered name is in its table, and each head's settings are its ``Config``."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import etn_cli.backbones
import etn_cli.datasets
import etn_cli.heads
from etn_cli.errors import EtnError, suggest
from etn_cli.registry import Registry

PACKAGES = (etn_cli.heads, etn_cli.backbones, etn_cli.datasets)


def import_every_module(package: ModuleType) -> None:
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)


@pytest.mark.parametrize("registry", [p.__name__ for p in PACKAGES])
def test_every_module_registers_exactly_the_names_its_table_gives(registry: str) -> None:
    """A decorator for a name the table lacks fails at import (``Registry.register``), so
    importing every module and then getting every name checks both directions."""
    package = importlib.import_module(registry)
    import_every_module(package)
    table: Registry = getattr(package, registry.rsplit(".", 1)[1])
    for name in table.names():
        found = table.get(name)
        assert found.__module__ == table.modules[name], name


def test_each_records_module_registers_that_name_with_that_settings_class() -> None:
    """Each record of :mod:`etn_cli.catalogue` names the module that registers the method and
    the settings a pipeline's ``[[heads]]`` entry is checked against before torch loads; the
    registered class takes its facts from the record."""
    from etn_cli.catalogue import METHODS
    from etn_cli.heads import heads, settings_of

    for name, record in METHODS.items():
        head = heads.get(name)
        assert head.__module__ == f"etn_cli.heads.{record.module}", name
        assert head.Config is settings_of(name), name
        assert (head.name, head.label, head.own_score) == (name, record.label, record.score)
        assert head(seed=0).config == settings_of(name)(seed=0), name


def test_a_head_that_writes_a_fact_its_record_holds_is_refused() -> None:
    """The record is the one place: a class (or a base below ``Head``) that sets its own
    label cannot register."""
    from etn_cli.heads import heads
    from etn_cli.heads.base import Head

    base = type("Base", (Head,), {"label": "Mine", "__module__": "etn_cli.heads.map"})
    head = type("MAP2", (base,), {"__module__": "etn_cli.heads.map"})
    registry = Registry("head", {"map": "etn_cli.heads.map"}, on_register=heads.on_register)
    with pytest.raises(ValueError, match="Base writes label: head 'map'"):
        registry.register("map")(head)


def test_each_backbones_settings_in_the_table_are_its_config() -> None:
    """What a pipeline's [backbone] and [finetune] tables are checked against before torch
    loads is what the backbone itself builds its options from."""
    from etn_cli.backbones import backbones, settings_of

    for name in backbones.names():
        backbone = backbones.get(name)
        assert backbone.name == name
        options, finetune = settings_of(name)
        assert backbone.Config is options, name
        assert getattr(backbone, "FinetuneConfig", None) is finetune, name


def test_each_datasets_options_in_the_table_are_its_own() -> None:
    """What a pipeline's [data.options.<dataset>] tables are checked against before torch
    loads is what the source builds its options from; one that takes none refuses any."""
    from etn_cli.datasets import OPTIONS, check_options, datasets

    for name in datasets.names():
        source = datasets.get(name)
        assert getattr(source, "Options", None) is OPTIONS.get(name), name
        if name not in OPTIONS:
            with pytest.raises(EtnError, match="takes no options") as light:
                check_options(name, {"size": 1}, f"[data.options.{name}]")
            with pytest.raises(EtnError) as heavy:
                source(size=1)
            assert str(heavy.value) == str(light.value), name


def test_the_datasets_checked_for_a_root_are_those_that_read_one() -> None:
    """``[data] root`` is checked before torch loads for exactly the datasets of your own
    files, with the line their source gives."""
    from etn_cli.datasets import ROOTED, datasets
    from etn_cli.datasets.base import PathSplits
    from etn_cli.datasets.settings import no_root

    reads_root = {name for name in datasets.names() if issubclass(datasets.get(name), PathSplits)}
    assert reads_root == set(ROOTED)
    for name in ROOTED:
        with pytest.raises(EtnError) as heavy:
            datasets.get(name)(root=None).root_path()
        assert str(heavy.value) == str(no_root(name)), name


def test_every_alias_finds_a_head_that_is_registered() -> None:
    from etn_cli.catalogue import METHODS
    from etn_cli.heads import heads

    for record in METHODS.values():
        for alias in record.aliases:
            assert heads.get(alias) is heads.get(record.name)


def test_a_name_missing_from_the_table_cannot_register() -> None:
    registry: Registry = Registry("head", {"etn": __name__})

    with pytest.raises(ValueError, match="table"):
        registry.register("etm")(type("Misspelt", (), {"__module__": __name__}))
    with pytest.raises(EtnError, match="Did you mean: etn"):
        registry.canonical("etm")


@pytest.mark.parametrize(
    ("typed", "choices", "first"),
    [
        ("auc", ("aupr", "auroc", "fpr95", "aurc", "eaurc"), "auroc"),  # not the shorter aurc
        ("aurocc", ("aupr", "auroc", "aurc"), "auroc"),
        ("etm", ("edl", "etn", "etn_offset", "map"), "etn"),
        ("epoch", ("lr", "epochs", "batch_size"), "epochs"),
        ("fpr9", ("fpr95_id", "fpr95"), "fpr95_id"),  # a tie keeps the caller's order
    ],
)
def test_a_suggestion_ranks_the_choice_holding_what_was_typed_first(
    typed: str, choices: tuple[str, ...], first: str
) -> None:
    assert suggest(typed, choices, n=3, cutoff=0.5)[0] == first


def test_nothing_is_suggested_for_a_name_like_no_choice() -> None:
    assert suggest("zebra", ("aupr", "auroc", "ece")) == []
