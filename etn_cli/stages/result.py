"""What a stage did: the units it built and the ones it found finished."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StageResult:
    stage: str
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"{self.stage}: {len(self.done)} built, {len(self.skipped)} up to date"
