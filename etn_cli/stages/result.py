"""What a stage did: the units it built and the ones it found finished, reported as it goes
(:mod:`etn_cli.progress`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from etn_cli import progress


@dataclass
class StageResult:
    stage: str
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

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
        torchrun rank but 0), then record it as built."""
        if quiet:
            yield
        else:
            with progress.unit(self.stage, name, reason):
                yield
        self.done.append(str(path))

    def summary(self) -> str:
        return f"{self.stage}: {len(self.done)} built, {len(self.skipped)} up to date"
