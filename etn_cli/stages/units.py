"""One way to build a unit of work safely, whatever the unit.

Every artefact etn builds (an extracted split, the backbone's classifier, a trained head, a
metrics file, a fine-tuned backbone, the digits CNN) is a :class:`Unit`: it says how to tell
whether it is intact (:meth:`Unit.damage`) and how to build itself into a temporary place
(:meth:`Unit.build`). The driver does the rest, the same way for each:

1. **skip** a unit that is intact (unless ``force``);
2. **lock** it (a kernel lock per unit, :func:`~etn_cli.store.atomic.unit_lock`) and **check
   again**: another run may have finished it while this one waited;
3. **clear** what a killed run left (private ``.partial-`` folders, ``.tmp`` files);
4. **discard** a damaged copy, saying so in a ``repair:`` line (every unit is derived, so it is
   rebuilt, never used damaged);
5. **build** it into a private folder, **seal** it (a record listing the sha256 of its files,
   itself sealed, written last) and **publish** it by renaming the folder into place;
6. **log** a start and an end line (:mod:`etn_cli.progress`) and record the unit in the
   stage's :class:`~etn_cli.stages.result.StageResult`;
7. **remember** a unit whose method refused its data, when the stage isolates refusals, in a
   failure record beside where it would be, and forget it once the unit builds
   (:mod:`etn_cli.stages.failure_records`): later commands read why it is missing.

A stage says what to build; :func:`build_units` (or :func:`build_unit`) builds it safely.
Extraction, whose split is written by processes that share it, takes steps 1-4 from
:func:`claim` and writes the split itself; ``etn import`` writes each split under
:func:`holding`. Damage found outside a build (a stage reading a damaged input, ``etn verify
--repair``) is discarded by :func:`discard_damaged`, and a run is retried after it by
:func:`repairing`: the locks and the discards of every writer are here (an architecture test
keeps them here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from etn_cli import progress
from etn_cli.errors import DamagedArtefact
from etn_cli.stages.failure_records import forget_failure, remember_failure
from etn_cli.stages.result import StageResult
from etn_cli.store.artefacts.records import write_record
from etn_cli.store.artefacts.sealed import discard, repair_line
from etn_cli.store.atomic import atomic_dir, remove_partials, unit_lock
from etn_cli.store.storage import ensure_writable


class Unit:
    """A unit of work. Subclasses set ``path`` and ``name`` and implement :meth:`damage` and
    :meth:`build`; the class attributes say how the driver treats the unit."""

    path: Path  # the published artefact: a folder (or a file, for units that override write)
    name: str  # how progress lines name it: "ETN seed 0", "digits.test"
    stage: str = ""  # the stage its lines are under, when not the StageResult's
    why: str = "no finished unit with this key"  # why it is built (start line, with -v)
    again: str = "Rebuilding {name}."  # what a repair line says etn does ({name}: path's name)
    record: str | None = None  # the sealed JSON record written last, inside the folder
    sealed_files: Sequence[str] | None = None  # files the record lists (None: every file)
    kept: str = "up to date"  # the reason a skip line gives for an intact unit
    counted: bool = True  # False: lines only, not in the StageResult (nor [k/N] of status)
    quiet_skip: bool = False  # no line when found intact

    def damage(self) -> str | None:
        """None when the unit is intact, "missing" when there is none, otherwise what is
        damaged (said in the repair line)."""
        raise NotImplementedError

    def build(self, folder: Path) -> dict[str, Any] | None:
        """Write the unit's files into the private ``folder``; return its record (sealed and
        written last by the driver) or None for a unit without one."""
        raise NotImplementedError

    # -- what most units share; a unit that is a file, or two, overrides these

    def locks(self) -> list[Path]:
        """The paths whose locks the unit is built under."""
        return [self.path]

    def clear(self) -> None:
        """Remove what a killed run left (called holding the locks)."""
        remove_partials(self.path)

    def write(self, force: bool) -> None:
        """Build into a private folder, seal the record and rename the folder into place;
        with ``force`` the new folder is swapped in for the old one."""
        with atomic_dir(self.path, replace=force) as folder:
            record = self.build(folder)
            if self.record is not None:
                write_record(folder, self.record, record or {}, self.sealed_files)


@dataclass(frozen=True)
class Claimed:
    """What :func:`claim` found: whether the unit needs building, and why (or why not)."""

    build: bool
    reason: str


FINISHED_MEANWHILE = "finished by another run"


def claim(unit: Unit, locks: ExitStack, *, force: bool = False, reason: str = "") -> Claimed:
    """Steps 1-4 for ``unit``: an intact unit is skipped; otherwise its locks are taken (on
    ``locks``, held until it closes), it is checked again, leftovers are cleared and a damaged
    copy is discarded with a repair line. ``reason`` overrides the unit's ``why``."""
    if not force and unit.damage() is None:
        return Claimed(False, unit.kept)
    for path in unit.locks():
        ensure_writable(path.parent)
    for path in unit.locks():
        locks.enter_context(unit_lock(path))
    damage = unit.damage()
    if damage is None and not force:
        return Claimed(False, FINISHED_MEANWHILE)
    unit.clear()
    if unit.path.exists() and not force:
        progress.say(repair_line(damage, unit.again.replace("{name}", unit.path.name)))
        discard(unit.path)
    return Claimed(True, "--force" if force else reason or unit.why)


def build_unit(
    unit: Unit, result: StageResult, *, force: bool = False, quiet: bool = False
) -> bool:
    """Build ``unit`` unless it is intact (the steps of the module docstring); True when it
    was built. ``quiet`` keeps its lines off (every torchrun rank but 0)."""
    with ExitStack() as locks:
        claimed = claim(unit, locks, force=force)
        if not claimed.build:
            skip(unit, result, claimed.reason, quiet or unit.quiet_skip)
            return False
        with building(unit, result, claimed.reason, quiet):
            unit.write(force)
            forget_failure(unit.path)
            return True
        remember_failure(result.failed[-1])  # reached only past a refusal the stage isolated
    return False


def build_units(
    units: Iterable[Unit],
    result: StageResult,
    *,
    force: bool = False,
    before: Callable[[list[Unit]], None] | None = None,
) -> StageResult:
    """Build every unit that is not intact, in order. ``before`` is called once with the units
    to build, before the first is locked (the checks that must pass before anything is
    written); it is not called when every unit is intact."""
    units = list(units)
    damage = {id(u): (force or u.damage() is not None) for u in units}
    todo = [u for u in units if damage[id(u)]]
    for unit in units:
        if not damage[id(unit)]:
            skip(unit, result, unit.kept, unit.quiet_skip)
    if todo and before is not None:
        before(todo)
    for unit in todo:
        build_unit(unit, result, force=force)
    return result


def skip(unit: Unit, result: StageResult, reason: str, quiet: bool = False) -> None:
    if unit.counted:
        result.skip(unit.path, unit.name, reason, quiet=quiet)
    elif not quiet:
        progress.skipped(unit.stage or result.stage, unit.name, reason)


def building(unit: Unit, result: StageResult, reason: str, quiet: bool = False) -> Any:
    """The start and end lines of building ``unit`` (and, when counted, its record)."""
    if unit.counted:
        return result.build(unit.path, unit.name, reason, quiet=quiet)
    if quiet:
        return ExitStack()
    return progress.unit(unit.stage or result.stage, unit.name, reason)


@contextmanager
def holding(path: Path) -> Iterator[None]:
    """Steps 2-3 for a writer that publishes ``path`` itself (``etn import``): its lock held,
    a killed run's leftovers cleared."""
    with unit_lock(path):
        remove_partials(path)
        yield


def discard_damaged(path: Path, line: str | None = None) -> None:
    """Step 4 for damage found outside a build: ``line`` said (a repair line), then ``path``
    (a folder, or a file with its checksum) discarded holding its lock."""
    if line is not None:
        progress.say(line)
    with unit_lock(path):
        discard(path)


T = TypeVar("T")


def repairing(
    attempt: Callable[[], T],
    derived: Callable[[Path], bool],
    discarded: Callable[[Path], None] | None = None,
) -> T:
    """``attempt()``, retried after discarding each artefact it found damaged that etn derives
    (``derived``), so that the retry rebuilds it; ``discarded`` hears of each before the retry.
    Damage to the user's own input, or damage a rebuild did not cure, is raised."""
    repaired: set[Path] = set()
    while True:
        try:
            return attempt()
        except DamagedArtefact as damage:
            if damage.path in repaired or not derived(damage.path):
                raise
            repaired.add(damage.path)
            discard_damaged(damage.path, repair_line(damage, f"Rebuilding {damage.path.name}."))
            if discarded is not None:
                discarded(damage.path)
