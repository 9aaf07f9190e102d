"""Name -> object registries filled by a decorator at the definition site (timm / lm-eval style),
with a table of names that answers without importing any of them.

Each registry is made from a table, name -> the module that registers that name. The table
alone answers ``names()``, ``in`` and the "Unknown head 'etm'. Did you mean: etn?" of a
misspelt name, so ``etn --help`` and a pipeline file's mistakes never import torch or the
heads; ``get`` imports the one module that holds the name, whose decorator registers it. A
decorator for a name the table lacks, or names with another module, fails at import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

from etn_cli.errors import EtnError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of heads, backbones or datasets.

    >>> heads = Registry("head", {"etn": "etn_cli.heads.etn"})
    >>> "etn" in heads, heads.names()
    (True, ['etn'])
    >>> heads.get("etm")  # doctest: +SKIP
    EtnError: Unknown head 'etm'. Did you mean: etn? Available: etn
    """

    def __init__(
        self,
        kind: str,
        modules: Mapping[str, str],
        aliases: Mapping[str, str] | None = None,
        on_register: Callable[[str, T], None] | None = None,
    ) -> None:
        self.kind = kind
        self.on_register = on_register  # run on each object as it registers (heads: its record)
        self.modules = dict(modules)  # registered name -> the module whose decorator registers it
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}  # another name people search for -> registered name
        for alias, name in (aliases or {}).items():
            self.alias(alias, name)

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            module = getattr(obj, "__module__", None)
            if self.modules.get(name) != module:
                raise ValueError(
                    f"{self.kind} {name!r} is registered in {module}, but the table of "
                    f"{self.kind}s names {self.modules.get(name)}: add or fix its line there"
                )
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            if self.on_register is not None:
                self.on_register(name, obj)
            self._items[name] = obj
            return obj

        return decorator

    def alias(self, alias: str, name: str) -> None:
        """Let ``alias`` (a name other libraries use, like OpenOOD's ``msp``) find ``name``."""
        if alias in self.modules or alias in self._aliases or name not in self.modules:
            raise ValueError(f"{self.kind} alias {alias!r} -> {name!r} clashes or dangles")
        self._aliases[alias] = name

    def canonical(self, name: str) -> str:
        """The registered name ``name`` stands for (itself, or what its alias names), checked
        against the table only; an unknown name is the one-line error of :meth:`get`."""
        name = self._aliases.get(name, name)
        if name not in self.modules:
            raise EtnError(self.unknown_message(name))
        return name

    def get(self, name: str) -> T:
        name = self.canonical(name)
        if name not in self._items:
            importlib.import_module(self.modules[name])  # its decorator registers it
        if name not in self._items:
            raise ValueError(f"{self.modules[name]} does not register the {self.kind} {name!r}")
        return self._items[name]

    def aliases_of(self, name: str) -> list[str]:
        return sorted(a for a, target in self._aliases.items() if target == name)

    def unknown_message(self, name: str) -> str:
        hint = did_you_mean(name, self.modules, 3, 0.5) or did_you_mean(name, self._aliases, 3, 0.5)
        return f"Unknown {self.kind} {name!r}.{hint} Available: {', '.join(self.names())}"

    def names(self) -> list[str]:
        return sorted(self.modules)

    def __contains__(self, name: object) -> bool:
        return name in self.modules or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
