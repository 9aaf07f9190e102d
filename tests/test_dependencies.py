"""The declared dependency floors are the tested ones: every ``name>=X`` in pyproject.toml is
pinned at ``X`` in .ci/minimum-versions.txt, which CI installs into a second environment."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UNPINNED = {"torch", "torchvision", "pytest", "pytest-xdist", "ruff", "pytorch-ood"}  # see the pins


def floors() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for group in project["optional-dependencies"].values()
                                       for s in group]  # fmt: skip
    found = {}
    for spec in specs:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", spec)
        assert match, f"{spec!r} has no lower bound: declare the lowest version that works"
        found[match.group(1).lower()] = match.group(2)
    return found


def pins() -> dict[str, str]:
    lines = (REPO / ".ci" / "minimum-versions.txt").read_text().splitlines()
    pairs = (line.split("==") for line in lines if line and not line.startswith("#"))
    return {name.strip().lower(): version.strip() for name, version in pairs}


def release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in version.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def test_every_declared_floor_is_the_version_ci_tests() -> None:
    declared, tested = floors(), pins()
    untested = sorted(set(declared) - set(tested) - UNPINNED)
    assert not untested, f"floors without a pin in .ci/minimum-versions.txt: {untested}"
    for name, version in tested.items():
        assert name in declared, f"{name} is pinned but not a dependency"
        assert release(declared[name]) == release(version), (name, declared[name], version)
