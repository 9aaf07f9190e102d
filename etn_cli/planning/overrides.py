"""Command-line overrides of a pipeline file, as people use them with Hydra and lm-eval.

``--set heads.etn.epochs=5 --set seeds=[0]`` changes the parsed TOML before it is checked, so
an override is validated exactly like the file (unknown keys, types, ranges) and flows into
the content keys of every unit it changes: a rerun with the same overrides finds its units, a
different value builds new ones. ``--only etn,map`` keeps a subset of the ``[[heads]]``.

Keys are dotted paths into the file's tables; ``heads.<name-or-label>.<setting>`` addresses
every ``[[heads]]`` entry of that name (or label). Values are TOML (``5``, ``1e-3``, ``[0, 1]``,
``true``, ``"text"``); a bare word that is not TOML is taken as a string (``device=cpu``).
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from etn_cli.errors import EtnError, did_you_mean
from etn_cli.store.fingerprint import canonical_json, fingerprint_key

T = TypeVar("T")


def parse_value(text: str) -> Any:
    """A TOML value, or the text itself when it is not one (``cpu``, ``cuda:1``)."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: tuple[str, ...], path: Path) -> dict:
    """A copy of the parsed pipeline ``raw`` with every ``KEY=VALUE`` of ``overrides`` set."""
    raw = copy.deepcopy(raw)
    for override in overrides:
        key, sep, text = override.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise EtnError(
                f"--set expects KEY=VALUE with a dotted key, got {override!r}. "
                "Write e.g. --set heads.etn.epochs=5 or --set seeds=[0]."
            )
        value = parse_value(text.strip())
        if parts[0] == "heads":
            _set_head(raw, parts[1:], value, override, path)
        else:
            _set_path(raw, parts, value, override)
    return raw


def blaming_overrides(
    check: Callable[[tuple[str, ...]], T], overrides: tuple[str, ...], path: Path
) -> T:
    """``check(overrides)`` (load and check the pipeline ``path`` with them); when it fails
    although the file alone passes, the error names the first ``--set KEY=VALUE`` that makes
    it fail as its source instead of the file, which is not where the value was written."""
    try:
        return check(overrides)
    except EtnError as err:
        if not overrides or str(err).startswith("--set "):
            raise
        try:
            check(())
        except EtnError:
            raise err from None  # the file's own mistake (or --only's)
        for n in range(1, len(overrides) + 1):
            try:
                check(overrides[:n])
            except EtnError as first:
                raise EtnError(_blamed(str(first), overrides[n - 1], path)) from None
        raise


def _blamed(message: str, override: str, path: Path) -> str:
    """``message`` with the pipeline file, wherever it names it as a whole word (as given, a
    shipped pipeline's file, absolute or resolved), replaced by the ``--set`` to blame."""
    from etn_cli.planning.shipped import find_pipeline

    source = f"--set {override.strip()}"
    file = find_pipeline(path)  # found: the file alone passed its check
    names = {str(p) for f in (Path(path), file) for p in (f, f.absolute(), f.resolve())}
    named = message
    for name in sorted(names, key=len, reverse=True):  # the longest first: no partial word
        word = rf"(?<!\S){re.escape(name)}(?=[\s:,]|\.(?:\s|$)|$)"  # "in P." ends a word too
        named = re.sub(word, lambda _: source, named)
    return named if named != message else f"{source}: {message}"


def _set_path(table: dict[str, Any], parts: list[str], value: Any, override: str) -> None:
    for i, part in enumerate(parts[:-1]):
        inner = table.setdefault(part, {})
        if not isinstance(inner, dict):
            where = ".".join(parts[: i + 1])
            raise EtnError(
                f"--set {override}: {where} is a value ({inner!r}), not a table, so it has no "
                f"key {parts[i + 1]!r}. Set {where}=... instead."
            )
        table = inner
    table[parts[-1]] = value


def _set_head(raw: dict, parts: list[str], value: Any, override: str, path: Path) -> None:
    if len(parts) < 2:
        raise EtnError(
            f"--set {override}: head settings are addressed as heads.<name>.<setting>, "
            "e.g. --set heads.etn.epochs=5."
        )
    entries = _heads_named(raw, parts[0], f"--set {override}", path)
    for entry in entries:
        _set_path(entry, parts[1:], value, override)


def _heads_named(raw: dict, name: str, where: str, path: Path) -> list[dict]:
    entries = [e for e in raw.get("heads", []) if isinstance(e, dict)]
    found = [e for e in entries if name in (e.get("name"), e.get("label"))]
    if not found:
        names = sorted({str(e.get("label") or e.get("name")) for e in entries})
        names += sorted({str(e.get("name")) for e in entries} - set(names))
        hint = did_you_mean(name, names)
        raise EtnError(
            f"{where}: {path} has no [[heads]] named {name!r}.{hint} Its heads: "
            f"{', '.join(dict.fromkeys(names))}."
        )
    return found


def keep_heads(raw: dict[str, Any], only: tuple[str, ...], path: Path) -> dict[str, Any]:
    """``raw`` with only the ``[[heads]]`` whose name or label is in ``only`` (all if empty)."""
    if not only:
        return raw
    kept: list[dict] = []
    for name in only:
        for entry in _heads_named(raw, name, f"--only {name}", path):
            if not any(entry is k for k in kept):
                kept.append(entry)
    order = [e for e in raw.get("heads", []) if any(e is k for k in kept)]
    return {**raw, "heads": order}


def selection(overrides: tuple[str, ...], only: tuple[str, ...], key: str | None) -> dict:
    """What the command line changed, as a report records it: the ``--set`` overrides in the
    order given (the last of two on one key wins), the sorted ``--only`` names and ``key``,
    the :func:`selection_key` of the pipeline they give."""
    normal = []
    for override in overrides:
        name, _, value = override.partition("=")
        normal.append(f"{name.strip()}={value.strip()}")
    return {"set": normal, "only": sorted(set(only)), "key": key}


def selection_key(written: dict[str, Any], effective: dict[str, Any]) -> str | None:
    """8 hex digits naming the pipeline that ``--set`` and ``--only`` made of the file's tables
    ``written``: a key of the ``effective`` tables themselves, so two option lists with one
    effect share it (the order of ``--only`` names, spaces around ``=``) and two with different
    effects never do (``--set k=5 --set k=7`` is k=7, the reverse k=5). None when the options
    change nothing."""
    if canonical_json(effective) == canonical_json(written):
        return None
    return fingerprint_key(effective, 8)
