"""Name -> object registries filled by a decorator at the definition site (timm / lm-eval style)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from etn_cli.errors import EtnError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of heads, backbones or datasets.

    >>> heads = Registry("head")
    >>> @heads.register("etn")
    ... class ETN: ...
    >>> heads.get("etm")  # doctest: +SKIP
    EtnError: Unknown head 'etm'. Did you mean: etn? Available: etn
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}  # another name people search for -> registered name

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items or name in self._aliases:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def alias(self, alias: str, name: str) -> None:
        """Let ``alias`` (a name other libraries use, like OpenOOD's ``msp``) find ``name``."""
        if alias in self._items or alias in self._aliases or name not in self._items:
            raise ValueError(f"{self.kind} alias {alias!r} -> {name!r} clashes or dangles")
        self._aliases[alias] = name

    def get(self, name: str) -> T:
        name = self._aliases.get(name, name)
        if name not in self._items:
            raise EtnError(self.unknown_message(name))
        return self._items[name]

    def aliases_of(self, name: str) -> list[str]:
        return sorted(a for a, target in self._aliases.items() if target == name)

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._items), n=3, cutoff=0.5)
        close = close or difflib.get_close_matches(name, list(self._aliases), n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return f"Unknown {self.kind} {name!r}.{hint} Available: {', '.join(self.names())}"

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
