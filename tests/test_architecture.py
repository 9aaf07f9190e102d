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

The layering rules below name modules by prefix in the tables at the top (``STORE_PUBLIC``,
``STORE_FOR``, ``REGISTRIES``, ``NO_REGISTRY``): when the package is regrouped, update the
tables, not the tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "etn_cli"

# The store's modules that code outside it may import (``etn_cli.store.`` left out): its ground
# rules, reading and writing a split, the other artefacts and maintenance. The rest (the shard
# file format, its value checksums, the extraction journal) only the store itself reads.
STORE = "etn_cli.store"
STORE_PUBLIC = {
    *("fingerprint", "atomic", "storage", "content", "notes", "sizes"),
    *("reading.reader", "reading.consistency", "reading.parquet"),
    *("writing.writer", "writing.manifest", "writing.pieces", "writing.merge", "writing.checks"),
    *("artefacts.classifier", "artefacts.headfiles", "artefacts.predictions", "artefacts.damage"),
    *("artefacts.sealed", "artefacts.records", "artefacts.unitkey", "maintenance.leftovers"),
}
# Parts below the stages that may use only some of those: they read and key their own inputs
# but build no unit (the heads' and the digits CNN's sealing is the stages' to take over).
STORE_FOR = {
    "etn_cli.metrics": set(),
    "etn_cli.datasets": {"fingerprint", "content", "reading.parquet"},
    "etn_cli.heads": {"artefacts.headfiles"},
    "etn_cli.backbones": {"fingerprint", "content", "atomic", "artefacts.headfiles"},
    "etn_cli.report": {
        *("fingerprint", "atomic", "notes", "reading.parquet"),
        *("artefacts.predictions", "artefacts.sealed", "artefacts.unitkey"),
    },
}
# The registries (a name -> a head, backbone or dataset) and the packages that hold them;
# importing any module of those packages runs the package's table of names.
REGISTRIES = ("etn_cli.registry", "etn_cli.heads", "etn_cli.backbones", "etn_cli.datasets")
NO_REGISTRY = ("etn_cli.report",)  # they are handed what they show


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


def within(module: str, prefix: str) -> bool:
    """``module`` is ``prefix`` or a module inside it."""
    return module == prefix or module.startswith(prefix + ".")


def store_imports() -> set[tuple[str, str]]:
    """(importer, store module without the ``etn_cli.store.`` prefix) for every import of the
    store from outside it."""
    return {
        (module, target.removeprefix(STORE + "."))
        for module, targets in import_graph().items()
        if not within(module, STORE)
        for target in targets
        if within(target, STORE) and target != STORE
    }


def test_code_outside_the_store_imports_only_its_public_modules() -> None:
    inside = sorted((m, t) for m, t in store_imports() if t not in STORE_PUBLIC)
    assert not inside, f"imports of the store's internals (or add to STORE_PUBLIC): {inside}"


def test_the_parts_below_the_stages_use_only_their_share_of_the_store() -> None:
    found = sorted(
        (module, target)
        for module, target in store_imports()
        for part, allowed in STORE_FOR.items()
        if within(module, part) and target not in allowed
    )
    assert not found, f"store modules outside each part's share in STORE_FOR: {found}"


def test_the_report_imports_no_registry() -> None:
    """The report shows what it is handed (results, names read from records); which heads,
    backbones and datasets exist is for the command line and the planning to know."""
    found = sorted(
        (module, target)
        for module, targets in import_graph().items()
        if any(within(module, part) for part in NO_REGISTRY)
        for target in targets
        if any(within(target, registry) for registry in REGISTRIES)
    )
    assert not found, found


def private_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """``module._name`` for every private name (one leading underscore) that ``name`` takes
    from another module of etn_cli: ``from m import _x``, or ``m._x`` on an imported module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound: dict[str, str] = {}  # local name -> the etn_cli module it is
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("etn_cli"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target in modules:
                    bound[alias.asname or alias.name] = target
                elif is_private(alias.name) and node.module != name:
                    found.add(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = bound.get(node.value.id)
            if target is not None and target != name and is_private(node.attr):
                found.add(f"{target}.{node.attr}")
    return found


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_takes_another_modules_private_names() -> None:
    modules = module_names()
    found = {
        name: sorted(private)
        for name, path in modules.items()
        if (private := private_imports(name, path, modules))
    }
    assert not found, f"private names used outside their module (make them public): {found}"


def test_the_private_name_checker_sees_from_imports_and_module_attributes(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from etn_cli.m import _x, y\nimport etn_cli.m as m\nm._z\n")
    modules = {"etn_cli.m": tmp_path / "m.py", "etn_cli.a": tmp_path / "a.py"}
    assert private_imports("etn_cli.a", tmp_path / "a.py", modules) == {
        "etn_cli.m._x",
        "etn_cli.m._z",
    }


def test_every_did_you_mean_goes_through_one_helper() -> None:
    """One ranking of suggestions (``etn_cli.errors.suggest``), not a difflib call per message
    with its own cutoff and order."""
    users = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            and "difflib" in [getattr(node, "module", None), *(a.name for a in node.names)]
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )
    assert users == ["errors.py"], users


# The unit driver: the one module outside the store that takes a unit's lock or discards one.
DRIVER = "stages/units.py"
DRIVER_ONLY = {"unit_lock", "discard"}


def names_taken(path: Path, names: set[str]) -> set[str]:
    """Which of ``names`` the module at ``path`` imports or reads as an attribute."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found |= {a.name for a in node.names} & names
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.add(node.attr)
    return found


def test_only_the_unit_driver_locks_and_discards_units() -> None:
    """Every writer (the stages, a run's repair, ``etn verify --repair``, ``etn import``) goes
    through the driver for a unit's lock and for discarding a damaged unit."""
    users = {
        str(path.relative_to(PACKAGE)): taken
        for path in PACKAGE.rglob("*.py")
        if not within(".".join(path.relative_to(PACKAGE).parts), "store")
        and (taken := names_taken(path, DRIVER_ONLY))
    }
    assert users == {DRIVER: DRIVER_ONLY}, users


def test_the_driver_check_sees_imports_and_attributes(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from x import unit_lock\nimport s\ns.discard(p)\n")
    assert names_taken(tmp_path / "a.py", DRIVER_ONLY) == DRIVER_ONLY
