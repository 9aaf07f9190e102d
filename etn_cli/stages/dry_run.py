"""``etn run --dry-run``: every unit a run would build or find, from the plan alone. Nothing
is loaded, trained or written, and torch is needed only to ask whether the device exists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from etn_cli.datasets.class_check import check_planned_classes
from etn_cli.planning.pipeline import expand_paths, load_pipeline
from etn_cli.planning.plan import make_plan


@dataclass(frozen=True)
class RunOptions:
    """What ``etn run`` was asked beyond the pipeline files: the table's format and metric,
    ``--set`` overrides and the ``--only`` heads."""

    fmt: str = "table"
    metric: str | None = None
    overrides: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    fail_fast: bool = False  # a head refusing its data stops the run (else: the others go on)


def dry_run_report(
    paths: list[Path], data_dir: Path, options: RunOptions, device: str | None = None
) -> str:
    """What ``etn run`` would do: every unit of every pipeline, cached or to build, and the
    totals. Nothing is loaded, trained or written; the device is checked as a run checks it."""
    from etn_cli.stages.status import status

    parts = []
    for path in expand_paths(paths):
        loaded = load_pipeline(path, options.overrides, options.only)
        checked_device(device or loaded.device)  # refused here as a run would refuse it
        plan = make_plan(loaded, data_dir)
        check_planned_classes(plan)  # as run_many checks before any work
        units = status(plan)
        lines = [f"{path} (data directory {plan.data_dir}):"]
        for u in units:
            action = {"done": "cached  ", "failed": "would retry"}.get(u.state, "would build")
            lines.append(f"  {action:<11} {u.kind:<10} {u.name}")
        todo = sum(u.state != "done" for u in units)
        lines.append(f"  {len(units)} units: {len(units) - todo} cached, {todo} to build")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def checked_device(device: str) -> None:
    """Whether this machine has ``device``, as ``etn run`` asks (torch answers); without torch
    nothing can run, and the name was checked already (``etn_cli.cli.options``)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from etn_cli.stages.distributed import resolve_device

    resolve_device(device)
