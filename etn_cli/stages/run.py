"""``etn run``: every stage of one or more pipelines, skipping finished work.

Safe to run from cron and to overlap: every unit is built under its own kernel lock, a killed
run leaves nothing a rerun cannot resume or rebuild, and two runs on one data directory build
each unit once between them. Under torchrun every rank extracts its share of each split, then
rank 0 alone trains, evaluates and reports while the other ranks end."""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from etn_cli import progress
from etn_cli.datasets.class_check import check_planned_classes
from etn_cli.errors import EtnError
from etn_cli.planning.pipeline import expand_paths, load_pipeline
from etn_cli.planning.plan import FeatureUnit, Plan, make_plan
from etn_cli.stages.distributed import rank_device, resolve_device, torchrun_world
from etn_cli.stages.dry_run import RunOptions
from etn_cli.stages.evaluate import evaluate
from etn_cli.stages.extract import extract
from etn_cli.stages.finetune import finetune
from etn_cli.stages.input_checks import check_planned_inputs
from etn_cli.stages.prepare import plan_for_extract
from etn_cli.stages.report import report, written_lines
from etn_cli.stages.result import StageResult, UnitFailure, failures_line
from etn_cli.stages.train import train
from etn_cli.stages.units import repairing
from etn_cli.store.storage import explained_storage_errors


@dataclass
class RunOutcome:
    """How one pipeline of ``etn run`` ended: ``ok``, a user error (``bug`` False: one
    ``error:`` line, exit status 2) or a bug (``FAILED`` after its traceback, exit status 1).
    An ``ok`` run with ``failures`` (units whose method refused its data) exits 1 too."""

    path: Path
    ok: bool
    seconds: float
    message: str
    table: str = ""
    bug: bool = False
    stages: tuple[str, ...] = ()  # each stage's summary ("train: 61 built, 0 up to date")
    failures: tuple[UnitFailure, ...] = ()
    written: tuple[str, ...] = ()  # what it says of its report: ``wrote /abs/path`` lines

    def line(self) -> str:
        """The pipeline's closing line, kept within 100 columns for a usual path when ok."""
        if self.ok and self.failures:
            head = f"FAILED {self.path} ({self.seconds:.1f} s): {self.message}"
            return f"{head}; {failures_line(self.failures)}"
        if self.ok:
            return f"ok {self.path} ({self.seconds:.1f} s): {self.message}"
        if not self.bug:
            return f"error: {self.path}: {self.message}"
        return f"FAILED {self.path} ({self.seconds:.1f} s): {self.message}"


def run_summary(results: list[StageResult]) -> str:
    """``128 built, 0 up to date``: every unit of the run's ``[k/N]``, as ``etn status``
    lists them."""
    built = sum(len(r.done) for r in results)
    kept = sum(len(r.skipped) for r in results)
    return f"{built} built, {kept} up to date"


def ensure_data_dir(data_dir: Path) -> Path:
    """Create the data directory of a command that builds, or refuse in one line when it cannot
    be (a parent that is a file, no permission, a read-only or virtual file system)."""
    try:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EtnError(
            f"Cannot create the data directory {data_dir}: {err.strerror or err}. Pass --data-dir "
            "(or set ETN_DATA_DIR) with a folder you can write to."
        ) from None
    return Path(data_dir)


def unit_count(plan) -> int:
    """How many units ``etn run`` goes through for ``plan`` (the ``[k/N]`` of its lines), the
    same units ``etn status`` and ``--dry-run`` list: the fine-tuned backbone, the feature
    splits, the classifier (the backbone's, or your own features'), the heads and their
    metrics."""
    finetuned = plan.finetune is not None
    return finetuned + len(plan.feature_units) + plan.stores_classifier + 2 * len(plan.heads)


def run_pipeline(
    path: Path, data_dir: Path, *, device: str | None = None, options: RunOptions | None = None
) -> RunOutcome:
    options = options or RunOptions()
    started = time.perf_counter()
    pipeline = load_pipeline(path, options.overrides, options.only)
    if device:  # the plan resolves dtype = "auto" for the device the run uses
        pipeline = dataclasses.replace(pipeline, device=device)
    world = torchrun_world()
    with explained_storage_errors():  # a full disk or a read-only folder is one line
        plan = plan_for_extract(pipeline, data_dir)  # stage zero, then the units' keys
        dev = resolve_device(device or pipeline.device)
        dev = dev if world is None else rank_device(dev, world)

        def attempt() -> tuple[list[StageResult], tuple | None]:
            results = run_stages(plan, dev, world is not None and not world.main, options.fail_fast)
            if world is not None and not world.main:  # rank 0 alone goes on after extract
                return results, None
            return results, report(plan, fmt=options.fmt, metric=options.metric)

        def discarded(path: Path) -> None:
            nonlocal plan
            if plan.backbone is not None and path == plan.backbone.cache_folder:
                plan = plan_for_extract(pipeline, data_dir)  # stage zero built again

        results, reported = repairing(attempt, lambda p: is_derived(plan, p), discarded)
        if reported is None:
            message = f"{results[-1].summary()} ({world}: extraction only)"
            return RunOutcome(path, True, time.perf_counter() - started, message)
        failures = tuple(f for r in results for f in r.failed)
        table, written, _ = reported
    message, stages = run_summary(results), tuple(r.summary() for r in results)
    seconds = time.perf_counter() - started
    lines = tuple(written_lines(written))
    return RunOutcome(
        path, True, seconds, message, table, stages=stages, failures=failures, written=lines
    )


def run_stages(
    plan: Plan, dev: str, extract_only: bool, fail_fast: bool = True
) -> list[StageResult]:
    """Finetune (if asked), extract (saving the classifier),
    then (on rank 0) train and evaluate; units already built are skipped, so calling it again
    after a repair redoes only what is missing. Unless ``fail_fast``, a head that refuses its
    data fails alone: the other heads are trained and scored, its evaluation skipped."""
    if plan.backbone is not None and not extract_only:  # rank 0 (or alone): every split's
        check_planned_inputs(plan, every_class=True)  # files and the classes the heads need
    with progress.counting(unit_count(plan)):
        results: list[StageResult] = [finetune(plan, device=dev)] if plan.finetune else []
        results.append(extract(plan, device=dev))
        if not extract_only:
            trained = train(plan, device=dev, fail_fast=fail_fast)
            results += [trained, evaluate(plan, device=dev, fail_fast=fail_fast)]
    return results


def is_derived(plan: Plan, path: Path) -> bool:
    """Whether etn built ``path`` from other things and can build it again: anything under the
    data directory except the user's own shard folders, which are read where they are."""
    path = Path(path).resolve()
    own = [u.path.resolve() for u in plan.feature_units if not is_built(plan, u)]
    inside = path.is_relative_to(Path(plan.data_dir).resolve())
    return inside and not any(path == p or path.is_relative_to(p) for p in own)


def is_built(plan: Plan, unit: FeatureUnit) -> bool:
    """A feature unit etn writes: extracted by the backbone, or imported from the user's file."""
    return plan.backbone is not None or bool((unit.fingerprint or {}).get("file"))


def run_many(
    paths: list[Path],
    data_dir: Path,
    *,
    device: str | None = None,
    options: RunOptions | None = None,
) -> list[RunOutcome]:
    """Check every pipeline first (a bad file, key or value refuses the whole batch before any
    work); then run each in turn: a pipeline failing at run time is recorded and the next one
    still runs (a cron batch)."""
    options = options or RunOptions()
    files = expand_paths(paths)
    errors = []
    for path in files:
        try:
            loaded = load_pipeline(path, options.overrides, options.only)
            resolve_device(device or loaded.device)  # a missing GPU stops the batch up front
            check_planned_classes(make_plan(loaded, data_dir))  # planning builds nothing
        except EtnError as err:
            errors.append(str(err))
    if errors:
        raise EtnError(" | ".join(errors) if len(errors) > 1 else errors[0])
    progress.say(f"etn: data directory {ensure_data_dir(data_dir).resolve()}")
    outcomes = []
    for path in files:
        started = time.perf_counter()
        try:
            outcomes.append(run_pipeline(path, data_dir, device=device, options=options))
        except EtnError as err:
            outcomes.append(RunOutcome(path, False, time.perf_counter() - started, str(err)))
        except Exception as err:  # a bug in one pipeline must not stop a cron batch
            traceback.print_exc()
            message = f"{type(err).__name__}: {err} (a bug; traceback above)"
            seconds = time.perf_counter() - started
            outcomes.append(RunOutcome(path, False, seconds, message, bug=True))
    return outcomes
