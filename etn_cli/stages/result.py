"""What a stage did: the units it built, the ones it found finished and the ones that failed
or were left out because a unit they need failed, reported as it goes (:mod:`etn_cli.progress`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from etn_cli import progress
from etn_cli.errors import DamagedArtefact, EtnError


@dataclass(frozen=True)
class UnitFailure:
    """A unit whose method refused its data (an :class:`EtnError` while building it): the run
    goes on without it, its report says why, and a rerun builds it again."""

    stage: str  # "train", "evaluate"
    name: str  # "SHE seed 0"
    path: str  # the unit's artefact, never written
    reason: str  # the refusal's one line

    def line(self) -> str:
        return f"{self.stage} {self.name}: {self.reason}"


@dataclass
class StageResult:
    """``isolate``: a unit refusing its data (an :class:`EtnError`) is recorded in ``failed``
    and the stage goes on; otherwise (``--fail-fast``) the error stops the run."""

    stage: str
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[UnitFailure] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)  # not built: a unit it needs failed
    blocking: list[UnitFailure] = field(default_factory=list)  # those units' failures
    isolate: bool = False

    def skip(
        self, path: Path, name: str, reason: str = "up to date", *, quiet: bool = False
    ) -> None:
        """Record a unit found finished (named on stderr with ``-v``, unless ``quiet``)."""
        self.skipped.append(str(path))
        if not quiet:
            progress.skipped(self.stage, name, reason)

    @contextmanager
    def build(
        self, path: Path, name: str, reason: str = "", *, quiet: bool = False
    ) -> Iterator[None]:
        """Bracket building one unit: start and end lines (none when ``quiet``, as on every
        torchrun rank but 0), then record it as built; with ``isolate``, a refusal is recorded
        as the unit's failure (its end line gives the reason) and the stage goes on. Damage is
        never a refusal: the run rebuilds what it names."""
        try:
            if quiet:
                yield
            else:
                with progress.unit(self.stage, name, reason, refusal_said=self.isolate):
                    yield
        except EtnError as err:
            if not self.isolate or isinstance(err, DamagedArtefact):
                raise
            self.failed.append(UnitFailure(self.stage, name, str(path), one_line(err)))
            return
        self.done.append(str(path))

    def block(self, path: Path, name: str, why: str, failure: UnitFailure) -> None:
        """Record a unit left unbuilt because a unit it needs failed (``failure``, recorded by
        an earlier stage or command), in one ``skipped`` line."""
        self.blocked.append(str(path))
        if failure not in self.blocking:
            self.blocking.append(failure)
        progress.skipped(self.stage, name, why, shown=True)

    def failures(self) -> list[UnitFailure]:
        """The units that failed here and those whose failure left units of this stage
        unbuilt: what a command run on its own names in its closing line."""
        return [*self.blocking, *self.failed]

    def summary(self) -> str:
        text = f"{self.stage}: {len(self.done)} built, {len(self.skipped)} up to date"
        text += f", {len(self.failed)} failed" if self.failed else ""
        return text + (f", {len(self.blocked)} skipped" if self.blocked else "")


def failures_line(failures: Sequence[UnitFailure]) -> str:
    """``1 unit failed (train SHE seed 0), the rest ran; a rerun retries only the failed
    unit.``"""
    n = len(failures)
    names = ", ".join(f"{f.stage} {f.name}" for f in failures[:3]) + ", …" * (n > 3)
    units = "unit" if n == 1 else "units"
    return f"{n} {units} failed ({names}), the rest ran; a rerun retries only the failed {units}."


def one_line(err: Exception) -> str:
    return " ".join(str(err).split())
