"""How far a reader walks to follow one stage: ``train(plan)`` on a built data directory and
``extract(plan)`` on a fresh one, for the digits pipeline, traced with ``sys.setprofile``.

Three figures per stage, counting only code under ``etn_cli/``:

* **places**: distinct functions entered (``file:function``), the stage function included;
  comprehensions count as part of the function they are written in;
* **files**: distinct source files those functions live in;
* **climbs back up**: calls from one file into a file that is already on the call stack below
  it (``A -> B -> A``, or ``A -> B -> C -> A``): the reader, having gone down from A, must go
  back up to a file they came from to follow the call. Each distinct (calling file, function
  called) counts once; a file calling its own functions, and returns, do not count.

The plan is made before tracing starts (planning is not the stage). Run it with the code to
measure first on ``PYTHONPATH`` (``PYTHONPATH=/work/main python benchmarks/trips.py``), so
two checkouts can be compared on one machine:

    python benchmarks/trips.py [--data-dir DIR] [--pipeline pipelines/digits.toml]

``--data-dir`` is a data directory the pipeline was run into (``etn run``); without one, it is
built first into a temporary folder. ``extract`` runs twice into a fresh temporary folder: once
holding the digits CNN the built directory trained (as planning left it before planning became
pure: it trained the CNN), and once empty (the CNN is then trained by extract's stage zero, or,
in code where planning trains it, before tracing starts).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import etn_cli

COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")
PACKAGE = str(Path(etn_cli.__file__).resolve().parent)


@dataclass
class Walk:
    """What one traced call visited."""

    places: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    climbed: list[str] = field(default_factory=list)  # distinct (caller file -> place)
    stack: list[str | None] = field(default_factory=list)  # the file of each frame (None: outside)

    def event(self, frame: Any, kind: str, _: Any) -> None:
        if kind == "call":
            file = frame.f_code.co_filename
            mine = file.startswith(PACKAGE)
            short = file[len(PACKAGE) + 1 :] if mine else None
            if short is not None and frame.f_code.co_name in COMPREHENSIONS:
                short = self.stack[-1] if self.stack else None  # a comprehension: its caller's
            elif short is not None:
                self.places.add(f"{short}:{frame.f_code.co_name}")
                self.files.add(short)
                caller = next((f for f in reversed(self.stack) if f is not None), None)
                climb = f"{caller} -> {short}:{frame.f_code.co_name}"
                if caller not in (None, short) and short in self.stack:
                    self.climbed.append(climb) if climb not in self.climbed else None
            self.stack.append(short)
        elif kind == "return" and self.stack:
            self.stack.pop()


def traced(call: Callable[[], Any]) -> Walk:
    walk = Walk()
    sys.setprofile(walk.event)
    try:
        call()
    finally:
        sys.setprofile(None)
    return walk


def plan_of(pipeline: Path, data: Path, extracts: bool = False) -> Any:
    """The plan, made as the command that runs the stage makes it: one that extracts builds
    the backbone's stage zero while planning, where the code has that step."""
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan

    try:
        from etn_cli.stages.prepare import plan_for_extract
    except ImportError:  # older code: extract builds stage zero itself
        plan_for_extract = make_plan
    return (plan_for_extract if extracts else make_plan)(load_pipeline(pipeline), data)


def show(name: str, walk: Walk, verbose: bool) -> None:
    print(
        f"{name}: {len(walk.places)} places over {len(walk.files)} files, "
        f"climbing back up {len(walk.climbed)} times"
    )
    if verbose:
        for file in sorted(walk.files):
            names = sorted(p.split(":")[1] for p in walk.places if p.startswith(f"{file}:"))
            print(f"    {file}: {', '.join(names)}")
        for line in walk.climbed:
            print(f"    climb: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", type=Path, default=Path("pipelines/digits.toml"))
    parser.add_argument("--data-dir", type=Path, default=None, help="a built data directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="list places and climbs")
    args = parser.parse_args()
    from etn_cli.stages.extract import extract
    from etn_cli.stages.train import train

    with tempfile.TemporaryDirectory() as scratch:
        built = args.data_dir
        if built is None:
            built = Path(scratch) / "built"
            etn = Path(sys.executable).with_name("etn")
            command = [str(etn), "run", str(args.pipeline), "-d", str(built), "-q"]
            subprocess.run(command, check=True)
        plan = plan_of(args.pipeline, built)
        show("train(plan)", traced(lambda: train(plan)), args.verbose)
        for name, cached in (("backbone cached", True), ("nothing built", False)):
            fresh = Path(scratch) / "fresh"
            if cached:  # what etn builds of the backbone itself (the digits CNN), no features
                shutil.copytree(built / "backbones", fresh / "backbones")
            plan = plan_of(args.pipeline, fresh, extracts=True)
            show(f"extract(plan), {name}", traced(lambda p=plan: extract(p)), args.verbose)
            shutil.rmtree(fresh, ignore_errors=True)
    print(f"(code measured: {PACKAGE})")


if __name__ == "__main__":
    main()
