"""How a unit's failure is remembered between commands: ``<artefact>.failed.json`` beside where
the unit would be (``heads/mahalanobis-<key>.failed.json``, ``metrics/<p>/<file>.parquet
.failed.json``), written by the unit driver (:func:`~etn_cli.stages.units.build_unit`) when the
unit's method refused its data and removed when the unit later builds.

``etn evaluate``, ``etn report`` and ``etn status`` read it to tell a head that failed (and
why) from one that was never trained. It is no artefact: it holds no result and is not sealed,
and a unit whose artefact exists is never taken for failed, whatever record lies beside it.
A record that cannot be read is taken as none: the unit is then merely missing, which the
next run retries as it retries a failed one."""

from __future__ import annotations

import json
from pathlib import Path

from etn_cli.planning.plan import MetricsUnit, Plan
from etn_cli.provenance import etn_version, now
from etn_cli.stages.result import UnitFailure
from etn_cli.store.atomic import atomic_write_text

SUFFIX = ".failed.json"


def failure_path(path: Path) -> Path:
    """Where the failure of the unit published at ``path`` is recorded."""
    return path.with_name(path.name + SUFFIX)


def remember_failure(failure: UnitFailure) -> None:
    """Record ``failure`` beside its unit (replacing an earlier record of it)."""
    record = {
        "stage": failure.stage,
        "name": failure.name,
        "path": failure.path,
        "reason": failure.reason,
        "created_at": now(),
        "etn_version": etn_version(),
    }
    atomic_write_text(failure_path(Path(failure.path)), json.dumps(record, indent=1) + "\n")


def forget_failure(path: Path) -> None:
    """Remove the failure record of the unit at ``path``, if any (it has just been built)."""
    failure_path(path).unlink(missing_ok=True)


def recorded_failure(path: Path) -> UnitFailure | None:
    """The failure recorded for the unit at ``path`` while it has no artefact there; None when
    it has one, or no readable record."""
    record = failure_path(path)
    if path.exists() or not record.is_file():
        return None
    try:
        found = json.loads(record.read_text(encoding="utf-8"))
        return UnitFailure(found["stage"], found["name"], str(path), found["reason"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def metrics_failure(unit: MetricsUnit) -> UnitFailure | None:
    """Why ``unit`` has no metrics file, when a failure is recorded: its head's (the head
    refused its fit data in ``train``) or its own (a scorer refused the test data)."""
    if unit.path.exists():
        return None
    return recorded_failure(unit.head.path) or recorded_failure(unit.path)


def plan_failures(plan: Plan) -> dict[str, UnitFailure]:
    """Per metrics key of ``plan``, the recorded failure that leaves it without metrics."""
    found = {unit.key: metrics_failure(unit) for unit in plan.metrics}
    return {key: failure for key, failure in found.items() if failure is not None}
