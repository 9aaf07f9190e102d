"""What a run tells the person (or the log) watching it, on stderr.

On a terminal: a ``[k/N]`` counter over the units of a run, one line per finished unit (a
``started`` line only for a unit still running after :data:`SLOW_S` seconds, so a long step
says what it is doing) and tqdm bars for long loops (extraction batches, training epochs);
units found up to date are counted, not listed. Off a terminal (cron, CI, ``| tee``): no bars,
every line stamped with the local time in ISO 8601, one line when a unit starts and one when it
ends, with its time, and one line per unit skipped as up to date, so a log shows when what ran,
what was already done and what failed. ``-q`` keeps only errors (and the final table on
stdout); ``-v`` adds the reason each unit is built and lists every unit on a terminal too.

Stages call :func:`unit` around each unit they build and :func:`skipped` for each one they
keep; :func:`begin` sets the total of a run (``etn run`` counts every stage's units). The
report, which builds no unit, brackets its slow steps with :func:`step`: a line only for a
step that takes longer than :data:`SLOW_S` seconds.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from etn_cli.errors import REPAIR_PREFIX, DamagedArtefact, EtnError

T = TypeVar("T")
QUIET, NORMAL, VERBOSE = -1, 0, 1
SLOW_S = 2.0  # on a terminal, a unit still running after this long gets its "started" line


@dataclass
class _State:
    verbosity: int = NORMAL
    total: int = 0  # units of the current run; 0 = not counting
    index: int = 0
    nested: bool = False  # a run counts; the stages inside it must not restart the counter


_state = _State()


def configure(*, quiet: bool = False, verbose: bool = False) -> None:
    """Set the verbosity for this process (``-q`` wins over ``-v``)."""
    _state.verbosity = QUIET if quiet else VERBOSE if verbose else NORMAL
    logger = logging.getLogger("etn")  # the store's one-time notes
    logger.setLevel(logging.ERROR if quiet else logging.INFO)
    if not logger.handlers:
        handler = _Stderr()
        handler.setFormatter(_Stamped("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class _Stamped(logging.Formatter):
    """The store's notes as progress lines: time-stamped off a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return stamped(super().format(record))


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a line is written."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def verbosity() -> int:
    return _state.verbosity


def on_terminal() -> bool:
    return sys.stderr.isatty()


def stamped(line: str) -> str:
    """``line`` as written to stderr: off a terminal (a cron log) after the local time in ISO
    8601 (``2026-11-27T04:41:12+01:00 ...``), on a terminal as it is."""
    if on_terminal():
        return line
    return f"{datetime.now().astimezone().isoformat(timespec='seconds')} {line}"


def write_line(line: str) -> None:
    """``line`` and its newline to stderr in one write: ranks under torchrun share the stream
    unbuffered, and ``print`` would write the newline separately, gluing their lines."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _write(line: str) -> None:
    write_line(stamped(line))


@contextmanager
def counting(total: int) -> Iterator[None]:
    """Number the next ``total`` units ``[1/total]`` … (nested calls keep the outer count)."""
    if _state.nested:
        yield
        return
    _state.total, _state.index, _state.nested = total, 0, True
    try:
        yield
    finally:
        _state.total, _state.index, _state.nested = 0, 0, False


def say(message: str) -> None:
    """A line for a person at normal verbosity (stderr: stdout stays the results). A repair
    line (``repair: ...``) is a warning: damage found and rebuilt is said even with ``-q``."""
    if _state.verbosity >= NORMAL or message.startswith(REPAIR_PREFIX):
        _write(message)


def detail(message: str) -> None:
    """A line shown only with ``-v``."""
    if _state.verbosity >= VERBOSE:
        _write(message)


def _counter() -> str:
    _state.index += 1
    if not _state.total:
        return ""
    width = len(str(_state.total))
    return f"[{_state.index:>{width}}/{_state.total}] "


def skipped(stage: str, name: str, reason: str = "up to date", *, shown: bool = False) -> None:
    """Count a unit found finished: one line off a terminal (a log must show it), on a
    terminal only with ``-v`` (the counter stays compact) unless ``shown`` (a unit left out
    because one it needs failed); none with ``-q``."""
    line = f"{_counter()}{stage:<8} {name}: skipped, {reason}"
    if _state.verbosity >= VERBOSE or (_state.verbosity >= NORMAL and (shown or not on_terminal())):
        _write(line)


@contextmanager
def unit(stage: str, name: str, reason: str = "", *, refusal_said: bool = False) -> Iterator[None]:
    """Bracket the building of one unit with a start and an end line (``FAILED`` on error,
    ``interrupted`` on Ctrl-C; with ``refusal_said``, a refusal's reason follows on the same
    line, as the run goes on).
    On a terminal at normal verbosity the start line waits :data:`SLOW_S` seconds and is
    never printed for a unit that ends sooner: one line per unit, the table stays in view."""
    prefix = f"{_counter()}{stage:<8} {name}"
    why = f" ({reason})" if reason and _state.verbosity >= VERBOSE else ""
    start_line = f"{prefix}: started{why}"
    later = None
    if _state.verbosity == NORMAL and on_terminal():
        later = threading.Timer(SLOW_S, say, (start_line,))
        later.daemon = True
        later.start()
    else:
        say(start_line)
    started = time.perf_counter()
    try:
        yield
    except BaseException as err:
        # The reason follows once: here for a refusal the run goes on after, otherwise as the
        # command's ``error:`` line or the run's summary; Ctrl-C is no failure: the command's
        # last line says how to resume.
        seconds = time.perf_counter() - started
        said = refusal_said and isinstance(err, EtnError) and not isinstance(err, DamagedArtefact)
        reason = f": {' '.join(str(err).split())}" if said else ""
        ended = "interrupted" if isinstance(err, KeyboardInterrupt) else "FAILED"
        _write(f"{prefix}: {ended} after {seconds:.1f} s{reason}")
        raise
    finally:
        if later is not None:
            later.cancel()
    say(f"{prefix}: done in {time.perf_counter() - started:.1f} s")


@contextmanager
def step(stage: str, name: str) -> Iterator[None]:
    """Bracket one step of a unit-less stage (the report's reading, comparison, plots): silent
    when it ends within :data:`SLOW_S` seconds; past that a ``started`` line (so a long step
    says what it is doing, on a terminal or in a log) and, at its end, ``done in``."""
    prefix = f"{stage:<8} {name}"
    later = threading.Timer(SLOW_S, say, (f"{prefix}: started",))
    later.daemon = True
    later.start()
    started = time.perf_counter()
    try:
        yield
    finally:
        later.cancel()
    seconds = time.perf_counter() - started
    if seconds >= SLOW_S:
        say(f"{prefix}: done in {seconds:.1f} s")


def bar(iterable: Iterable[T], desc: str, total: int | None = None, **options: Any) -> Iterable[T]:
    """A tqdm bar on a terminal at normal verbosity; the bare iterable otherwise."""
    if not on_terminal() or _state.verbosity < NORMAL:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False, **options)
