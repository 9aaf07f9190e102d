"""Domain errors: anything a user can fix becomes an :class:`EtnError` with a one-line message."""

import difflib
import os
from collections.abc import Iterable

WORKER_PREFIX = "Caught EtnError"  # how torch's DataLoader re-raises a worker's error
MARKER = "EtnError: "


class EtnError(Exception):
    """A user-facing error: what was expected, what was found, and how to fix it.

    The CLI prints the message on one line and exits with status 2; bugs are left as ordinary
    exceptions so that they keep their traceback. An EtnError raised in a DataLoader worker
    (an unreadable image) comes back from torch as ``EtnError("Caught EtnError in DataLoader
    worker ... Original Traceback ... EtnError: <message>")``; only ``<message>`` is kept.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        if text.startswith(WORKER_PREFIX) and MARKER in text:
            message = text.rsplit(MARKER, 1)[1].strip()
        super().__init__(message, *args)


class UsageError(EtnError):
    """A mistyped choice or option value: one line and exit status 2, like click's own."""


def suggest(name: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``choices`` that ``name`` is probably a slip for, best first: every choice
    :func:`difflib.get_close_matches` finds within ``cutoff``, ranked by the share of the
    typed letters it holds in order, then by the length of the prefix it shares with ``name``;
    then a typo (a typed letter the choice lacks: ``resnet19``) goes to the most similar choice
    (``resnet18`` before ``resnet101``), while a shortening (every typed letter held: ``auc``)
    keeps the order ``choices`` come in (``auroc`` before ``aurc``, which a similarity ratio
    prefers for being shorter)."""
    choices = list(dict.fromkeys(choices))
    close = set(difflib.get_close_matches(name, choices, n=len(choices) or 1, cutoff=cutoff))

    def rank(choice: str) -> tuple[float, int, float]:
        matcher = difflib.SequenceMatcher(None, name, choice)
        held = sum(block.size for block in matcher.get_matching_blocks()) / max(len(name), 1)
        typo = -matcher.ratio() if held < 1 else 0.0
        return -held, -len(os.path.commonprefix([name, choice])), typo

    return sorted((c for c in choices if c in close), key=rank)[:n]  # stable: choices' order


def did_you_mean(name: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> str:
    """`` Did you mean 'auroc'?`` (``n`` > 1: `` Did you mean: a, b?``), or ``""`` when
    :func:`suggest` finds nothing."""
    close = suggest(name, choices, n, cutoff)
    if not close:
        return ""
    return f" Did you mean {close[0]!r}?" if n == 1 else f" Did you mean: {', '.join(close)}?"


def choose(value: str, allowed: tuple[str, ...], what: str, aliases: dict | None = None) -> str:
    """``value`` if it is one of ``allowed`` (or an alias of one); otherwise a one-line usage
    error naming the nearest choice and all of them."""
    value = (aliases or {}).get(value, value)
    if value in allowed:
        return value
    close = suggest(value, [*allowed, *(aliases or {})], cutoff=0.5)
    hint = f" Did you mean {(aliases or {}).get(close[0], close[0])!r}?" if close else ""
    raise UsageError(f"Unknown {what} {value!r}.{hint} Choose one of: {', '.join(allowed)}.")


def require_extra(modules: tuple[str, ...], extra: str, what: str) -> None:
    """One line naming the pip extra to install when an optional dependency is missing (the
    digits default needs none of them)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise EtnError(
            f"{what} needs {', '.join(missing)}, which is not installed here. Install it with "
            f"pip install 'etn-cli[{extra}]' (or pip install {' '.join(missing)})."
        )


REPAIR_PREFIX = "repair: "  # starts a line saying a damaged artefact is rebuilt: said even with -q


class DamagedArtefact(EtnError):
    """A file etn wrote no longer matches what was recorded when it was written: a flipped bit,
    a truncated, deleted or edited file. ``path`` is the unit that holds it (a split folder, a
    head folder, a metrics or classifier file, a backbone cache folder). ``etn run`` and ``etn
    verify --repair`` rebuild the unit when etn derived it; otherwise it is a one-line refusal.
    """

    def __init__(self, path: object, message: str) -> None:
        from pathlib import Path

        super().__init__(message)
        self.path = Path(str(path))
