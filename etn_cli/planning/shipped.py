"""The pipelines and examples shipped inside the package, and what a PIPELINE argument names.

``etn_cli/pipelines/*.toml`` and ``etn_cli/examples/`` are package data, so an installed etn
has them too; in a clone, ``pipelines/`` and ``examples/`` at the top are links to them. A
PIPELINE argument is a file when one exists at that path; otherwise a bare name (``digits``:
no folder, no ``.toml``) names a shipped pipeline. Every command and the Python API go
through :func:`find_pipeline` (called by :func:`etn_cli.planning.pipeline.load_pipeline`).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from etn_cli.errors import EtnError, UsageError, choose

PACKAGE = Path(__file__).resolve().parents[1]
PIPELINES = PACKAGE / "pipelines"
EXAMPLES = PACKAGE / "examples"


def shipped_pipelines() -> dict[str, Path]:
    """Name -> file of every shipped pipeline (``digits`` -> ``.../pipelines/digits.toml``)."""
    return {path.stem: path for path in sorted(PIPELINES.glob("*.toml"))}


def find_pipeline(path: str | Path) -> Path:
    """The pipeline file ``path`` names: an existing file as given (a path always means a
    file), else the shipped pipeline of a bare name. A missing path or an unknown name is one
    line: the shipped pipeline of the same name, or the nearest names."""
    path = Path(path)
    if path.is_file():
        return path
    shipped = shipped_pipelines()
    bare = len(path.parts) == 1 and path.suffix != ".toml"
    if bare and path.name in shipped:
        return shipped[path.name]
    if path.stem in shipped:
        raise EtnError(
            f"Pipeline file {path} does not exist here; the shipped pipeline {path.stem!r} runs "
            f"with `etn run {path.stem}`."
        )
    if bare:
        try:
            choose(path.name, tuple(shipped), "pipeline")
        except UsageError as err:
            raise EtnError(f"{err} (No file {path} here either: a path names a file.)") from None
    raise EtnError(
        f"Pipeline file {path} does not exist. List shipped ones with `etn ls pipelines`."
    )


def shown(path: Path) -> str:
    """How a person names the pipeline file ``path`` on the command line: relative to the
    working directory when below it, else the shipped name, else the path."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        pass
    shipped = shipped_pipelines().get(path.stem)
    return path.stem if shipped is not None and shipped.resolve() == path.resolve() else str(path)


def shipped_examples() -> list[Path]:
    """The example pipelines and scripts, for a person to copy next to their own files."""
    return sorted([*EXAMPLES.glob("*.toml"), *EXAMPLES.glob("*.py")])


def description(path: Path) -> str:
    """A pipeline file's ``description``, else the first sentence of its leading comment less
    a leading ``examples/x.toml:`` (the examples name themselves); a script's docstring's first
    sentence; empty when it has neither."""
    text = path.read_text(errors="replace")  # a listing shows what it can of any file
    if path.suffix == ".py":
        return first_sentence(ast.get_docstring(ast.parse(text)) or "")
    try:
        given = tomllib.loads(text).get("description")
    except tomllib.TOMLDecodeError:
        given = None
    if isinstance(given, str):
        return given.strip()
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    return first_sentence(" ".join(comment).removeprefix(f"examples/{path.name}:"))


# a sentence ends at a full stop before a capital or code, not after the paper's "Sec." etc.
SENTENCE_END = re.compile(r"(?<!Sec)(?<!Supp)(?<!Fig)(?<!Eq)(?<!vs)\.\s+(?=[A-Z`])")


def first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = SENTENCE_END.search(text)
    return text[: end.start() + 1] if end else text
