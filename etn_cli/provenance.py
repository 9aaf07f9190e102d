"""How an artefact was made: versions, code revision, host, time and command line."""

from __future__ import annotations

import functools
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent


def etn_version() -> str:
    try:
        return metadata.version("etn-cli")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@functools.cache
def git_revision() -> str | None:
    """The commit of the etn source tree (with ``+dirty`` for local edits), if it is a checkout."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def code_version() -> str:
    return f"{etn_version()}@{git_revision() or 'nogit'}"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def provenance() -> dict[str, Any]:
    versions = {}
    for package in ("torch", "numpy", "h5py", "polars", "scikit-learn"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return {
        "etn_version": etn_version(),
        "code_version": code_version(),
        "python": platform.python_version(),
        "packages": versions,
        "host": platform.node(),
        "created_at": now(),
        "command": " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:]),
    }
