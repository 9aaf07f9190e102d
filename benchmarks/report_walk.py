"""How many stays a reader makes following ``etn report``: ``report(plan)`` on a data directory
the pipeline was run into, traced with ``sys.setprofile``, counting only code under
``etn_cli/``.

The reader reads each function once, at its first call, depth first: a function's callees
(those first called while it is the innermost function of ``etn_cli`` on the stack) are read
in the order they are first called, each followed by a return to the caller. The walk is the
sequence of modules passed through on the way (down into a callee, back up to its caller),
consecutive repeats merged; **stays** is its length, so a return to a module already left
counts again. The report folder is removed first, so that every figure is drawn (a report
whose metrics are unchanged skips them). Comprehensions and lambdas count as part of the
function they are written in.

    PYTHONPATH=$PWD python benchmarks/report_walk.py --data-dir DIR [--pipeline P] [-v]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import etn_cli

COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>")
PACKAGE = str(Path(etn_cli.__file__).resolve().parent)


@dataclass
class Node:
    file: str
    name: str
    children: list[Node] = field(default_factory=list)


@dataclass
class Reader:
    """The functions first visited, as a tree of first calls."""

    root: Node = field(default_factory=lambda: Node("", ""))
    seen: dict[str, Node] = field(default_factory=dict)
    stack: list[Node | None] = field(default_factory=list)  # None: a frame outside the tree

    def event(self, frame: Any, kind: str, _: Any) -> None:
        if kind == "return":
            if self.stack:
                self.stack.pop()
            return
        if kind != "call":
            return
        file = frame.f_code.co_filename
        name = frame.f_code.co_name
        if not file.startswith(PACKAGE) or name in COMPREHENSIONS:
            self.stack.append(None)
            return
        place = f"{file[len(PACKAGE) + 1 :]}:{name}:{frame.f_code.co_firstlineno}"
        node = self.seen.get(place)
        if node is None:
            node = self.seen[place] = Node(file[len(PACKAGE) + 1 :], name)
            parent = next((n for n in reversed(self.stack) if n is not None), self.root)
            parent.children.append(node)
        self.stack.append(node)


def walk(node: Node) -> list[tuple[str, str]]:
    """The modules passed through reading ``node`` and, depth first, its callees, each with
    the function read on arrival."""
    modules = [(node.file, node.name)]
    for child in node.children:
        modules += walk(child) + [(node.file, node.name)]
    return modules


def merged(modules: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [m for i, m in enumerate(modules) if i == 0 or m[0] != modules[i - 1][0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", type=Path, default=Path("pipelines/digits.toml"))
    parser.add_argument("--data-dir", type=Path, required=True, help="a data directory run into")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the walk")
    args = parser.parse_args()
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan
    from etn_cli.stages.report import report, report_folder

    plan = make_plan(load_pipeline(args.pipeline), args.data_dir)
    shutil.rmtree(report_folder(plan), ignore_errors=True)
    report(plan)  # once untraced, every figure drawn, so that imports are not in the walk
    shutil.rmtree(report_folder(plan))  # and drawn again while traced
    reader = Reader()
    sys.setprofile(reader.event)
    try:
        report(plan)
    finally:
        sys.setprofile(None)
    stays = merged(walk(reader.root.children[0]))
    print(f"report(plan): {len(stays)} stays over {len({m for m, _ in stays})} modules, "
          f"{len(reader.seen)} functions")  # fmt: skip
    if args.verbose:
        print("\n".join(f"    {m} ({name})" for m, name in stays))
    print(f"(code measured: {PACKAGE})")


if __name__ == "__main__":
    main()
