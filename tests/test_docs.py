"""The README and ``docs/`` as a user meets them: every command and snippet runs, every link
resolves, and the README stays short.

Each fenced block is taken from the documents as written:

* ``bash`` blocks run line by line in one scratch folder, on a one-seed digits pipeline that
  stands in for ``pipelines/digits.toml`` (the same backbone, data and conformal sets, heads
  MAP, ETN and ETN + TS), built once for the module. A line ``etn ...`` runs the command line
  in this process (the entry point's own ``app``, so torch is imported once); any other line
  runs in ``bash``.
* ``python`` blocks run each on its own (a fresh namespace) in the same folder and data
  directory.
* ``toml`` blocks must parse.

A block that cannot run here says why in the line just before it: ``<!-- not run: needs … -->``
(a download, a GPU, a cluster), ``installs …``, ``a benchmark …`` or ``CI runs …``, or
``<!-- run by: tests/FILE.py[::TEST] -->``, naming the test that runs it. Both are few and
checked. The figures the documents quote from the digits default are checked against a run by
``tests/test_cli_conventions.py`` (``benchmarks/readme_figures.py``).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCUMENTS = (README, *sorted((REPO / "docs").glob("*.md")))
FENCE = re.compile(
    r"(?:^<!-- (?P<kind>not run|run by): (?P<why>[^\n]*?) -->\n)?"
    r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$",
    re.M | re.S,
)
NOT_RUN_BECAUSE = ("needs ", "installs ", "a benchmark", "CI runs ")  # the only excuses
MAX_EXCEPTIONS = 16


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    body: str
    kind: str | None  # "not run", "run by" or None (runs here)
    why: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start("lang")) + 1
            found.append(Block(path, line, m["lang"], m["body"], m["kind"], m["why"] or ""))
    return found


def runnable(lang: str) -> list[Block]:
    return [b for b in blocks() if b.lang == lang and b.kind is None]


def commands(body: str) -> list[str]:
    """The command lines of a bash block: continuations joined, comments and blanks dropped."""
    lines = body.replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


# --------------------------------------------------------------------------- the scratch run
def small_digits() -> str:
    """``pipelines/digits.toml`` with one seed and three heads (MAP, ETN, ETN + TS)."""
    shipped = (REPO / "pipelines" / "digits.toml").read_text()
    top = shipped[: shipped.index("[[heads]]")].replace("seeds = [0, 1, 2]", "seeds = [0]")
    assert "seeds = [0]" in top
    heads = '\n[[heads]]\nname = "map"\n\n[[heads]]\nname = "etn"\n\n'
    return top + heads + '[[heads]]\nname = "etn"\ncalibrate = "temperature"\n'


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose ``pipelines/digits.toml`` is the small digits pipeline, run once into
    ``data/``; the documents' commands and snippets run here."""
    folder = tmp_path_factory.mktemp("docs")
    (folder / "pipelines").mkdir()
    (folder / "pipelines" / "digits.toml").write_text(small_digits())
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("ETN_DATA_DIR", str(folder / "data"))
        code, output = etn_here("run", "pipelines/digits.toml", "-q")
    assert code == 0, output[-3000:]
    return folder


@pytest.fixture
def in_scratch(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(scratch)
    monkeypatch.setenv("ETN_DATA_DIR", str(scratch / "data"))
    monkeypatch.setenv("COLUMNS", "100")
    return scratch


def etn_here(*args: str) -> tuple[int, str]:
    from cli_runner import etn

    return etn(*args)


# ----------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("block", runnable("bash"), ids=str)
def test_every_command_of_the_documents_runs(block: Block, in_scratch: Path) -> None:
    for line in commands(block.body):
        words = shlex.split(line, comments=True)
        if words[0] == "etn":
            code, output = etn_here(*words[1:])
        else:
            shell = ["bash", "-euo", "pipefail", "-c", line]
            done = subprocess.run(shell, cwd=in_scratch, capture_output=True, text=True)
            code, output = done.returncode, done.stdout + done.stderr
        assert code == 0, f"{block}: {line}\n{output[-3000:]}"


@pytest.mark.parametrize("block", runnable("python"), ids=str)
def test_every_python_snippet_of_the_documents_runs(block: Block, in_scratch: Path) -> None:
    code = compile(block.body, str(block), "exec")
    exec(code, {"__name__": "__main__"})


@pytest.mark.parametrize("block", [b for b in blocks() if b.lang == "toml"], ids=str)
def test_every_toml_block_of_the_documents_parses(block: Block) -> None:
    tomllib.loads(block.body)


def test_every_block_that_does_not_run_here_says_why() -> None:
    exceptions = [b for b in blocks() if b.kind]
    assert 0 < len(exceptions) <= MAX_EXCEPTIONS, [str(b) for b in exceptions]
    for block in exceptions:
        assert block.lang in ("bash", "python"), f"{block}: a {block.lang} block needs no excuse"
        if block.kind == "not run":
            assert block.why.startswith(NOT_RUN_BECAUSE), f"{block}: {block.why}"
            continue
        file, _, test = block.why.partition("::")
        source = (REPO / file).read_text()  # the named test file exists
        assert file.startswith("tests/test_"), block
        assert not test or f"def {test}(" in source, f"{block}: no {test} in {file}"
    langs = {b.lang for b in blocks()}
    assert langs <= {"", "bash", "python", "toml", "text", "json"}, langs


def test_the_quick_start_is_two_commands_run_by_the_quick_start_test() -> None:
    first = next(b for b in blocks() if b.path == README and b.lang == "bash")
    assert commands(first.body) == [
        "pip install -e . && etn run pipelines/digits.toml",
        "pip install -e '.[test]' && python -m pytest -q",
    ]
    assert first.why == (
        "tests/test_cli_conventions.py::test_the_quick_start_prints_the_table_the_readme_shows"
    )


def test_the_readme_reads_in_ten_minutes_and_links_every_page_of_the_docs() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 450
    for page in DOCUMENTS[1:]:
        assert f"](docs/{page.name})" in text, page.name


# ----------------------------------------------------------------------------- the links
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
ANCHOR = re.compile(r'<a id="([^"]+)">')


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.M | re.S)
    found, seen = set(ANCHOR.findall(text)), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return LINK.findall(text)


@pytest.mark.parametrize("path", [*DOCUMENTS, REPO / "data" / "README.md"], ids=str)
def test_every_link_of_the_documents_resolves(path: Path) -> None:
    for target in links(path):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        assert resolved.exists(), f"{path.name}: {target}"
        if anchor:
            assert anchor in anchors(resolved), f"{path.name}: {target}"


def test_the_slugs_follow_github() -> None:
    assert slug("Is a method better than another? Paired comparisons") == (
        "is-a-method-better-than-another-paired-comparisons"
    )
    assert slug("`etn predict`") == "etn-predict"
    assert slug("map_edl") == "map_edl"
    assert slug("Sweeps and the paper's ablation plots") == "sweeps-and-the-papers-ablation-plots"
