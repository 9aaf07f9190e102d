"""``etn run``: every stage of one or more pipelines, skipping finished work.

Safe to run from cron and to overlap: every unit is built under its own kernel lock, a killed
run leaves nothing a rerun cannot resume or rebuild, and two runs on one data directory build
each unit once between them. Under torchrun every rank extracts its share of each split, then
rank 0 alone trains, evaluates and reports while the other ranks end."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from etn_cli.distributed import rank_device, torchrun_world
from etn_cli.errors import EtnError
from etn_cli.pipeline import load_pipeline
from etn_cli.plan import make_plan
from etn_cli.stages.evaluate import evaluate
from etn_cli.stages.extract import extract
from etn_cli.stages.finetune import finetune
from etn_cli.stages.report import report
from etn_cli.stages.result import StageResult
from etn_cli.stages.train import train
from etn_cli.store.storage import explained_storage_errors


@dataclass
class RunOutcome:
    path: Path
    ok: bool
    seconds: float
    message: str
    table: str = ""

    def line(self) -> str:
        status = "ok    " if self.ok else "FAILED"
        return f"{status} {self.path} ({self.seconds:.1f} s): {self.message}"


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_pipeline(
    path: Path, data_dir: Path, *, device: str | None = None, fmt: str = "md"
) -> RunOutcome:
    started = time.perf_counter()
    pipeline = load_pipeline(path)
    world = torchrun_world()
    with explained_storage_errors():  # a full disk or a read-only folder is one line
        plan = make_plan(pipeline, data_dir)
        dev = resolve_device(device or pipeline.device)
        dev = dev if world is None else rank_device(dev, world)
        results: list[StageResult] = [finetune(plan, device=dev)] if plan.finetune else []
        results.append(extract(plan, device=dev))
        if world is not None and not world.main:  # rank 0 alone goes on after extraction
            message = f"{results[-1].summary()} ({world}: extraction only)"
            return RunOutcome(path, True, time.perf_counter() - started, message)
        results += [train(plan, device=dev), evaluate(plan, device=dev)]
        table, plots = report(plan, fmt=fmt)
    if plots:
        table += "\n\nplots: " + ", ".join(str(p) for p in plots if p.suffix == ".png")
    message = "; ".join(r.summary() for r in results)
    return RunOutcome(path, True, time.perf_counter() - started, message, table)


def expand_paths(paths: list[Path]) -> list[Path]:
    """Pipeline files, with folders replaced by the ``*.toml`` files inside them (sorted)."""
    expanded: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.toml"))
            if not found:
                raise EtnError(f"Folder {path} holds no *.toml pipeline files.")
            expanded += found
        else:
            expanded.append(path)
    return expanded


def run_many(
    paths: list[Path], data_dir: Path, *, device: str | None = None, fmt: str = "md"
) -> list[RunOutcome]:
    """Run each pipeline in turn; a failing pipeline is recorded and the next one still runs."""
    outcomes = []
    for path in expand_paths(paths):
        started = time.perf_counter()
        try:
            outcomes.append(run_pipeline(path, data_dir, device=device, fmt=fmt))
        except EtnError as err:
            outcomes.append(RunOutcome(path, False, time.perf_counter() - started, str(err)))
        except Exception as err:  # a bug in one pipeline must not stop a cron batch
            traceback.print_exc()
            message = f"{type(err).__name__}: {err} (a bug; traceback above)"
            outcomes.append(RunOutcome(path, False, time.perf_counter() - started, message))
    return outcomes
