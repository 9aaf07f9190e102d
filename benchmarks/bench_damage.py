"""How does ``etn run`` treat damage at rest, bit by bit?

Method: one finished digits run (``tests/damage_cases.py``: the digits CNN, its classifier,
shards, a map_edl head, metrics) is damaged one way at a time, and ``etn run`` runs again on the
damaged copy: all 8 single-bit flips of evenly spaced bytes of each artefact (``--bytes`` bytes
per artefact, every byte of the smaller ones), truncations to 0, 1, half and all-but-one bytes,
and deletion. Each case is judged as the CI test judges it: the clean run's exact results with
``etn verify`` finding nothing damaged afterwards (``same``), the same results with a harmless
damaged byte left unread (``left damaged``, shards only: ``etn verify`` still reports it), one
error line and a non-zero exit (``refused``), or a failure: ``changed`` results, a
``traceback``, a process ``killed`` by a signal. The cases run in a worker process (no
interpreter start per case); a worker killed by a case is counted and replaced.

    python benchmarks/bench_damage.py [--bytes 64] [--kinds shard manifest ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from damage_cases import KINDS, Case, finished_run, run_case, target  # noqa: E402

VERDICTS = ("same", "left damaged", "refused", "changed", "traceback", "killed")


def cases(data: Path, kinds: list[str], per_kind: int) -> list[Case]:
    found = []
    for kind in kinds:
        size = target(data, kind).stat().st_size
        step = max(1, size // per_kind)
        found += [Case(kind, "flip", o, b) for o in range(0, size, step) for b in range(8)]
        found += [Case(kind, "truncate", keep) for keep in sorted({0, 1, size // 2, size - 1})]
        found.append(Case(kind, "delete"))
    return found


def worker(root: Path, start: int, per_kind: int, kinds: list[str]) -> None:
    """Run the cases from ``start`` on, one JSON line each on stdout, flushed."""
    pipeline, clean = root / "damage.toml", root / "clean"
    for index, case in enumerate(cases(clean, kinds, per_kind)[start:], start):
        outcome = run_case(case, pipeline, clean, root / "work", in_process=True)
        line = {"index": index, "case": str(case), "kind": case.kind, **outcome.__dict__}
        print(json.dumps(line), flush=True)


def sweep(root: Path, per_kind: int, kinds: list[str]) -> list[dict]:
    total = len(cases(root / "clean", kinds, per_kind))
    done: list[dict] = []
    while len(done) < total:
        command = [sys.executable, __file__, "--worker", str(root), "--start", str(len(done))]
        command += ["--bytes", str(per_kind), "--kinds", *kinds]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            done.append(json.loads(line))
            if len(done) % 500 == 0:
                print(f"  {len(done)}/{total} cases", file=sys.stderr, flush=True)
        if proc.wait() != 0 and len(done) < total:  # the case after the last one killed it
            case = cases(root / "clean", kinds, per_kind)[len(done)]
            done.append({"case": str(case), "kind": case.kind, "verdict": "killed",
                         "detail": f"worker exit {proc.returncode}"})  # fmt: skip
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=64, help="flipped bytes per artefact")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.start, args.bytes, args.kinds)
        return
    root = Path(tempfile.mkdtemp(prefix="etn-damage-"))
    finished_run(root)
    started = time.perf_counter()
    outcomes = sweep(root, args.bytes, args.kinds)
    seconds = time.perf_counter() - started
    counts: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        counts[o["kind"]][o["verdict"]] += 1
    print("| artefact | bytes | cases | " + " | ".join(VERDICTS) + " |")
    print("|---|---:|---:|" + "---:|" * len(VERDICTS))
    for kind in args.kinds:
        size = target(root / "clean", kind).stat().st_size
        row = [counts[kind][v] for v in VERDICTS]
        print(f"| {kind} | {size} | {sum(row)} | " + " | ".join(map(str, row)) + " |")
    total = Counter(o["verdict"] for o in outcomes)
    print(f"| all | | {len(outcomes)} | " + " | ".join(str(total[v]) for v in VERDICTS) + " |")
    print(f"\n{len(outcomes)} cases in {seconds:.0f} s")
    for o in outcomes:
        if o["verdict"] in ("changed", "traceback", "killed"):
            print(f"FAIL {o['case']}: {o['verdict']}: {o['detail']}")


if __name__ == "__main__":
    main()
