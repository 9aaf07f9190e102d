"""The shape of the package: no import cycles inside ``etn_cli``, between its modules or between
its parts (the sub-packages and top-level modules the README's package map lists), and a store
that knows nothing above it.

Every ``import`` and ``from ... import`` statement counts, wherever it stands: at module level,
inside a function (the lazy imports that keep ``etn --help`` fast) or under ``TYPE_CHECKING``,
since each means that one module knows the other and a change to either can break the other.
An import names a module (``from etn_cli.store.writing import writer``) or, for a name that is
not a submodule (``from etn_cli.store import read_split``), the package's ``__init__``. That
importing ``etn_cli.store.atomic`` first runs ``etn_cli/store/__init__.py`` is not counted, or
every package that re-exports its modules would be a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "etn_cli"


def module_names() -> dict[str, Path]:
    """``etn_cli.store.atomic`` -> its file, for every module and package of etn_cli."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of etn_cli that ``name`` (in ``path``) imports anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..store import y
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {target for target in found if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each back edge a depth-first search meets, as ``[a, b, ..., a]``."""
    found, state, stack = [], dict.fromkeys(graph, "new"), []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state[target] == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif state[target] == "new":
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if state[node] == "new":
            visit(node)
    return found


def part_of(module: str) -> str:
    """The part of the package a module belongs to: ``etn_cli.store.atomic`` -> ``store``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "etn_cli"


def test_no_module_of_etn_cli_imports_itself_through_others() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_parts_of_the_package_import_each_other_in_one_direction() -> None:
    parts: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        own = part_of(module)
        parts.setdefault(own, set()).update(part_of(t) for t in targets if part_of(t) != own)
    found = cycles(parts)
    assert not found, "cycles between parts: " + "; ".join(" -> ".join(c) for c in found)


def test_the_store_imports_nothing_above_it() -> None:
    """Everything writes and reads through the store; it needs only errors and provenance."""
    allowed = {"store", "errors", "provenance"}
    outside = {
        (module, target)
        for module, targets in import_graph().items()
        if part_of(module) == "store"
        for target in targets
        if part_of(target) not in allowed
    }
    assert not outside, sorted(outside)


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """The graph is built from the source: an import inside a function and a relative one are
    edges, and a two-module cycle made of them is reported."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from pkg.b import g\n")
    (tmp_path / "pkg" / "b.py").write_text("from . import a\n")
    modules = {"pkg": tmp_path / "pkg" / "__init__.py"}
    modules |= {f"pkg.{n}": tmp_path / "pkg" / f"{n}.py" for n in "ab"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
