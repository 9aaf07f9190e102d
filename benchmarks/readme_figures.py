"""The figures of the README and ``docs/`` from the digits default: one run, then every marked
block rewritten.

The README and the pages of ``docs/`` quote what ``etn run pipelines/digits.toml`` prints and
what its results say (the Quick start table, the run's time, the method and row counts, and the
figures of "Reading the results", "When ETN helps", calibration, selective prediction,
conformal sets, paired comparisons and the scorers' fit footnote). Each such passage sits
between ``<!-- figures: NAME -->`` and ``<!-- /figures -->``, each NAME once over all the
documents, and is rendered here from one run, so after a change that moves results::

    python benchmarks/readme_figures.py              # a fresh run in a temporary data directory
    python benchmarks/readme_figures.py -d DIR       # reuse (or make) a run in DIR
    python benchmarks/readme_figures.py --check      # exit 1 naming each stale block

``tests/test_cli_conventions.py`` renders the same blocks from the Quick start's own run and
compares them with the documents (:func:`stale_blocks` on :func:`documents_text`). The run's
time is measured, not checked. Figures of the studies, sweeps and benchmarks
(``studies/``, ``pipelines/digits_settings.toml``, ``benchmarks/``) come from their own scripts,
say so where they are quoted, and are not rewritten here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = (README, *sorted((ROOT / "docs").glob("*.md")))  # where the blocks may stand
PIPELINE = ROOT / "pipelines" / "digits.toml"
BLOCK = re.compile(r"(<!-- figures: ([\w-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)
COUNTER = re.compile(r"\[ +\d+/\d+\]")  # a progress counter, never broken across lines
NUMBER = re.compile(r"[−+-]?\d[\d,]*\.?\d*")
WIDTH = 96  # the README's prose wraps at about this width
COMPARED = ("etn", "etn_offset", "map", "map_edl", "dmm")  # the methods the paired text names


@dataclass
class Run:
    """One finished run of the digits default: its table, results and what it cost."""

    data_dir: Path
    table: str
    wall_s: float | None = None
    cpu_s: float | None = None
    rerun_s: float | None = None
    results: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)


def etn(*args: object, data_dir: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "etn_cli", *map(str, args), "-d", str(data_dir)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return done


def run_default(data_dir: Path) -> Run:
    """``etn run pipelines/digits.toml`` into ``data_dir`` (timed: wall and CPU seconds), a
    timed rerun, and the paired comparisons the README quotes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    first = etn("run", PIPELINE, data_dir=data_dir)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    started = time.perf_counter()
    etn("run", PIPELINE, data_dir=data_dir)
    run = Run(data_dir, first.stdout, wall, cpu, time.perf_counter() - started)
    return read_results(run)


def read_results(run: Run) -> Run:
    """The run's ``results.json`` and the paired comparisons against ETN of :data:`COMPARED`."""
    results = run.data_dir / "reports" / "digits" / "results.json"
    run.results = json.loads(results.read_text())["results"]
    compared = etn(
        "report", PIPELINE, "--only", ",".join(COMPARED), "--compare", "ETN", "-f", "json",
        "--rows", data_dir=run.data_dir,
    )  # fmt: skip
    run.comparisons = json.loads(compared.stdout)["comparisons"]
    return run


# ---------------------------------------------------------------------------------- figures
def cell(run: Run, label: str, metric: str, eval_set: str, score: str | None = "mp") -> dict:
    """The results.json row of one table cell (mean and half-width as fractions)."""
    rows = [
        r
        for r in run.results
        if r["method_label"] == label
        and r["metric"] == metric
        and r["eval_set"] == eval_set
        and r["score"] == score
    ]
    if len(rows) != 1:
        raise SystemExit(f"expected one {label} {metric} {eval_set} {score} row, got {len(rows)}")
    return rows[0]


def pct(run: Run, label: str, metric: str, eval_set: str, score: str | None = "mp") -> str:
    return f"{100 * cell(run, label, metric, eval_set, score)['mean']:.1f}"


def difference(run: Run, label: str, metric: str) -> str:
    """``+2.8 [+1.5, +4.1]†``: the paired difference against ETN over the OOD mean."""
    (row,) = [
        r
        for r in run.comparisons
        if r["method_label"] == label
        and r["metric"] == metric
        and r["eval_set"] == "digits-OOD"
        and r["score"] == "mp"
        and r["reference_score"] == "mp"
    ]
    scale = 100
    text = (
        f"{scale * row['difference']:+.1f} [{scale * row['ci95_low']:+.1f}, "
        f"{scale * row['ci95_high']:+.1f}]"
    )
    return text.replace("-", "−") + ("†" if row["significant"] else "")


def footnote(run: Run) -> str:
    """The table's last line: where each method was fitted, with row and method counts."""
    return run.table.rstrip().splitlines()[-1]


def method_count(run: Run) -> int:
    return len({r["method_label"] for r in run.results})


def unit_count(run: Run) -> int:
    done = etn("status", PIPELINE, data_dir=run.data_dir).stdout
    return int(re.search(r": (\d+) units", done)[1])


def rows_of(run: Run, eval_set: str) -> int:
    """The rows of an evaluated split, from its feature manifest."""
    name = {"digits": "digits.test", "digits_unseen": "digits_unseen.test"}.get(eval_set, eval_set)
    manifests = run.data_dir.glob(f"features/*/{name}-*/manifest.json")
    return json.loads(next(manifests).read_text())["rows"]


def blocks(run: Run) -> dict[str, str]:
    """Every marked block of the README, rendered from ``run``; prose wrapped as the README."""
    return {name: wrapped(text) for name, text in unwrapped_blocks(run).items()}


def wrapped(text: str) -> str:
    """A paragraph of prose at the README's width; fenced blocks and tables as they are."""
    if text.startswith(("```", "`Fitted")):
        return text
    kept = COUNTER.sub(lambda m: m[0].replace(" ", "\xa0"), text.strip("\n"))  # `[  8/128]`
    lines = textwrap.wrap(kept, WIDTH, break_on_hyphens=False, break_long_words=False)
    return "\n".join(lines).replace("\xa0", " ") + "\n"


def unwrapped_blocks(run: Run) -> dict[str, str]:
    """Every marked block of the README, rendered from ``run`` (prose on one line)."""
    ood_rows = rows_of(run, "digits_unseen") + rows_of(run, "digits_noise.test")
    etn_ece, ts_ece = (
        pct(run, "ETN", "ece", "digits", None),
        pct(run, "ETN + TS", "ece", "digits", None),
    )
    posthoc = sorted(
        (r for r in run.results if r["family"] == "posthoc" and r["metric"] == "auroc"
         and r["eval_set"] == "digits-OOD" and r["score"] not in ("mp", "um", "mi", "de")),
        key=lambda r: -r["mean"],
    )  # fmt: skip
    leaders = ", ".join(r["method_label"].split(" [")[0] for r in posthoc[:3])
    rendered = {
        "quick-start-table": f"```\n{run.table.rstrip()}\n```\n",
        "quick-start-output": quick_start_output(run),
        "reading-results": (
            f"On this small, easy stand-in the backbone's own softmax is already a strong OOD "
            f"score, and the paper's ETN trails it (OOD mean AUPR(MP) "
            f"{pct(run, 'ETN', 'aupr', 'digits-OOD')} against "
            f"{pct(run, 'MAP', 'aupr', 'digits-OOD')}); [When ETN helps](#when-etn-helps) finds "
            f"why — the logits' additive offset — and `ETN (fitted offset)`, a separately named "
            f"variant that is not in the paper, closes the gap "
            f"({pct(run, 'ETN (fitted offset)', 'aupr', 'digits-OOD')}). `ETN + TS` is the same "
            f"ETN with its probabilities temperature-scaled on the adaptation split "
            f"([calibration](docs/results.md#calibration)): ECE {etn_ece}% → {ts_ece}%, every "
            f"ranking column "
            f"unchanged. Among the post-hoc scorers, the feature-space ones ({leaders}) lead on "
            f"AUROC here, as they do on many of OpenOOD's near-OOD benchmarks.\n"
        ),
        "paired": (
            f"The summary's AUROC and FPR95 pair each method's headline score with ETN's; "
            f"elsewhere a score faces the same score. On digits (3 seeds, `--compare ETN`), over "
            f"the OOD mean: `ETN (fitted offset)` "
            f"{difference(run, 'ETN (fitted offset)', 'auroc')} AUROC and "
            f"{difference(run, 'ETN (fitted offset)', 'fpr95')} FPR95; MAP "
            f"{difference(run, 'MAP', 'auroc')}; MAP_EDL "
            f"{difference(run, 'MAP_EDL (last layer)', 'auroc')} and DMM "
            f"{difference(run, 'DMM', 'auroc')} AUROC, on these {rows_of(run, 'digits')} + "
            f"{ood_rows} rows († where the interval excludes 0).\n"
        ),
        "selective": (
            f"On digits MAP's AURC is {aurc(run, 'MAP')}‰ and ETN's {aurc(run, 'ETN')}‰ (ETN "
            f"keeps the accuracy, but its MP ranks some errors differently); `ETN (fitted "
            f"offset)` has {aurc(run, 'ETN (fitted offset)')}‰.\n"
        ),
        "conformal": (
            f"The digits default calibrates RAPS on half of the test split, so its heads keep the "
            f"whole adaptation split: coverage {coverage(run, 'ETN')} for ETN with "
            f"{set_size(run, 'ETN', 'digits')} classes per set and {coverage(run, 'MAP')} for MAP "
            f"with {set_size(run, 'MAP', 'digits')}, within the spread of one calibration set of "
            f"this size; on the unseen digits the sets grow to "
            f"{set_size(run, 'ETN', 'digits_unseen')} (ETN) and "
            f"{set_size(run, 'MAP', 'digits_unseen')} (MAP) classes, DUQ's to "
            f"{set_size(run, 'DUQ (head)', 'digits_unseen')}.\n"
        ),
        "calibration": (
            f"On digits (3 seeds; [the README's table](../README.md#quick-start)): ETN's ECE "
            f"{etn_ece}% → {ts_ece}%, NLL {raw(run, 'ETN', 'nll')} → "
            f"{raw(run, 'ETN + TS', 'nll')}, Brier {raw(run, 'ETN', 'brier')} → "
            f"{raw(run, 'ETN + TS', 'brier')}, with {temperatures(run)}; the plain softmax has "
            f"{pct(run, 'MAP', 'ece', 'digits', None)}%, {raw(run, 'MAP', 'nll')}, "
            f"{raw(run, 'MAP', 'brier')}.\n"
        ),
        "when-etn-helps": (
            f"On the digits default the paper's ETN trails the plain softmax at OOD detection by "
            f"max probability: AUPR(MP) {pct(run, 'ETN', 'aupr', 'digits_unseen')} against "
            f"{pct(run, 'MAP', 'aupr', 'digits_unseen')} on the unseen digits (semantic shift) and "
            f"{pct(run, 'ETN', 'aupr', 'digits_noise')} against "
            f"{pct(run, 'MAP', 'aupr', 'digits_noise')} on noise.\n"
        ),
        "fit-footnote": f"`{footnote(run)}`\n",
    }
    if run.wall_s is not None and run.cpu_s is not None and run.rerun_s is not None:
        rendered["quick-start-time"] = (
            f"The first run of this table took {run.wall_s:.0f} s of wall-clock time "
            f"({run.cpu_s:.0f} s of CPU time) on the 2-core CPU machine this project is built "
            f"on, with other jobs sharing its cores; a rerun, which finds every unit finished "
            f"and does no work, took {run.rerun_s:.1f} s.\n"
        )
    return rendered


def quick_start_output(run: Run) -> str:
    """What the Quick start's run prints, with the run's own counts: its ``[k/N]`` total is
    ``etn status``'s count of units, and the closing line counts the same units."""
    units = unit_count(run)
    eighth = f"[{8:>{len(str(units))}}/{units}]"  # as etn pads the counter
    return (
        f"It builds {units} units of work. On a terminal it prints one line on stderr per unit "
        f"it finishes (`{eighth} train    ETN seed 0: done in 0.3 s`; a unit still running "
        f"after 2 s says that it started, and tqdm bars follow long steps; units found done are "
        f"counted, not listed), the full paths of the report's main files (`wrote "
        f"…/reports/digits/summary.txt`), a closing line (`ok pipelines/digits.toml (…): "
        f"{units} built, 0 up to date`) and this table on stdout: {method_count(run)} "
        f"methods, 3 seeds where a method has a random seed. Off a terminal (cron, `| tee`) "
        f"every line starts with the local time in ISO 8601, each unit has a started and a done "
        f"line, and a rerun lists every unit it found done (`2026-11-27T05:16:42+00:00 "
        f"{eighth} train    ETN seed 0: skipped, up to date`); `-q` prints only errors and "
        f"the table, `-v` adds why each unit runs:\n"
    )


def temperatures(run: Run) -> str:
    """``T = 0.207 (0.206–0.208 over the seeds; the adaptation NLL falls from 0.68 to 0.11)``
    from the ``calibration`` records of the ETN + TS heads' ``train.json``."""
    records = []
    for path in sorted(run.data_dir.glob("heads/etn-*/train.json")):
        calibration = json.loads(path.read_text()).get("calibration")
        if calibration:
            records.append(calibration)
    if not records:
        raise SystemExit(f"no calibrated ETN head under {run.data_dir / 'heads'}")
    ts = [r["temperature"] for r in records]
    before = sum(r["adapt_nll_before"] for r in records) / len(records)
    after = sum(r["adapt_nll_after"] for r in records) / len(records)
    return (
        f"`T = {sum(ts) / len(ts):.3f}` ({min(ts):.3f}–{max(ts):.3f} over the seeds; the "
        f"adaptation NLL falls from {before:.2f} to {after:.2f})"
    )


def aurc(run: Run, label: str) -> str:
    return f"{1000 * cell(run, label, 'aurc', 'digits')['mean']:.1f}"


def coverage(run: Run, label: str) -> str:
    row = cell(run, label, "coverage", "digits", None)
    spread = f" ± {100 * row['ci95_half_width']:.1f}" if row["n_seeds"] > 1 else ""
    return f"{100 * row['mean']:.1f}%{spread}"


def set_size(run: Run, label: str, eval_set: str) -> str:
    return f"{cell(run, label, 'set_size', eval_set, None)['mean']:.2f}"


def raw(run: Run, label: str, metric: str) -> str:
    return f"{cell(run, label, metric, 'digits', None)['mean']:.3f}"


# ---------------------------------------------------------------------------- the README
KEPT = ("quick-start-time",)  # measured, not derived: kept as it is unless the run was timed


def rewrite(text: str, rendered: dict[str, str], complete: bool = True) -> str:
    """``text`` with each marked block replaced by its rendering; every block must be known
    and, when ``complete``, every rendering must have its block in ``text``."""
    names = [m[2] for m in BLOCK.finditer(text)]
    unknown = set(names) - set(rendered) - set(KEPT)
    missing = set(rendered) - set(names) if complete else set()
    if unknown or missing:
        raise SystemExit(
            f"README blocks unknown here: {sorted(unknown) or '-'}; rendered but not in the "
            f"README: {sorted(missing) or '-'}"
        )
    return BLOCK.sub(lambda m: m[1] + rendered.get(m[2], m[3]) + m[4], text)


def documents_text() -> str:
    """The README and every page of ``docs/``, one after the other: every marked block."""
    return "\n".join(path.read_text() for path in DOCUMENTS)


def rewrite_documents(rendered: dict[str, str]) -> list[Path]:
    """Every document rewritten with its blocks' renderings; each block name must stand once
    over all of them, and every rendering must have its block somewhere."""
    names = [m[2] for m in BLOCK.finditer(documents_text())]
    twice = sorted({name for name in names if names.count(name) > 1})
    missing = sorted(set(rendered) - set(names))
    if twice or missing:
        raise SystemExit(f"blocks named twice: {twice or '-'}; in no document: {missing or '-'}")
    changed = []
    for path in DOCUMENTS:
        text = path.read_text()
        new = rewrite(text, rendered, complete=False)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def readme_blocks(text: str) -> dict[str, str]:
    return {m[2]: m[3] for m in BLOCK.finditer(text)}


def printed_numbers(text: str) -> list[tuple[float, float]]:
    """Each number of ``text`` with one unit of its last printed digit (97.5 -> 0.1)."""
    found = []
    for token in NUMBER.findall(text.replace("−", "-")):
        token = token.rstrip(".").replace(",", "")
        digits = len(token.split(".")[1]) if "." in token else 0
        found.append((float(token), 10.0**-digits))
    return found


def stale_blocks(text: str, rendered: dict[str, str], last_digits: int = 0) -> list[str]:
    """The blocks of ``text`` whose words differ from ``rendered``, or any of whose numbers
    differs by more than ``last_digits`` units of its last printed digit (0: exactly as
    printed; 1 lets a value that sits on a rounding boundary round the other way). The
    measured time is not compared."""
    stale = []
    for name, shown in readme_blocks(text).items():
        if name in KEPT:
            continue
        fresh = rendered.get(name, "")
        words = [NUMBER.sub("#", t.replace("−", "-")).split() for t in (shown, fresh)]
        ours, theirs = printed_numbers(fresh), printed_numbers(shown)
        close = len(ours) == len(theirs) and all(
            abs(a - b) <= last_digits * unit + 1e-9
            for (a, _), (b, unit) in zip(ours, theirs, strict=True)
        )
        if words[0] != words[1] or not close:
            stale.append(name)
    return stale


def finished_run(data: Path) -> Run | None:
    """The run already in ``data`` (its table printed again by a rerun), or None."""
    if not (data / "reports" / "digits" / "results.json").is_file():
        return None
    return read_results(Run(data, etn("run", PIPELINE, data_dir=data).stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-d", "--data-dir", type=Path, help="reuse or make the run here")
    parser.add_argument("--check", action="store_true", help="only say which blocks are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="etn-readme-") as scratch:
        data = args.data_dir or Path(scratch)
        run = finished_run(data) or run_default(data)
        rendered = blocks(run)
    if args.check:
        stale = stale_blocks(documents_text(), rendered)
        print("stale: " + ", ".join(stale) if stale else "every block is up to date")
        raise SystemExit(1 if stale else 0)
    changed = rewrite_documents(rendered)
    print(f"rendered {len(rendered)} blocks; rewrote {', '.join(map(str, changed)) or 'nothing'}")


if __name__ == "__main__":
    main()
