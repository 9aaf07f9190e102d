"""Does any input of yours give stale or wrong results, or crash etn? The attack of issue 31.

Method: two groups of cases, each run through ``etn``'s entry point in a worker process (a
worker killed by a case is counted and replaced), for each checkout given with ``--code``
(the main branch before, this one after), in one run:

* **named** cases, one per finding of the issue's attack: another unit's head, image or list
  changed in place, a symbolic link loop, bit rot in your own shards, overrides in two orders,
  hidden states of width 0, a hostile ``plots.json``, absurd seeds and sizes, a full disk while
  weights are written, ``etn import`` onto a file or after a kill, single-class inputs found
  late. Each says whether etn held (a correct result, or one ``error:`` line with exit 2 and
  nothing written; for ``etn run``, its one ``FAILED`` line with exit 1), gave a stale or
  wrong result with exit 0, printed a traceback, or left files behind on a refusal;
* **formats**: the seeded corruptions of :mod:`fuzz_inputs` (``tests/``), ``--per-format``
  generic ones per format plus every hostile file.

    python benchmarks/bench_bad_inputs.py --code /path/to/before /path/to/after [--per-format 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from tiny_pipeline import tiny_pipeline  # noqa: E402

VERDICTS = ("held", "silent wrong", "traceback", "files written", "other")

DIGITS = tiny_pipeline("attack", seeds=(0, 1), heads=({"name": "etn", "epochs": 2},))


# ------------------------------------------------------------------------ helpers
def verdict_of(code: int, err: str, escaped: str, written: bool, wrong: bool = False) -> str:
    """held / silent wrong / traceback / files written / other, for one run."""
    if escaped or "Traceback" in err:
        return "traceback"
    if code == 0:
        return "silent wrong" if wrong else "held"
    refused = code == 2 and err.startswith("error: ")
    failed = code == 1 and err.startswith("FAILED ")  # etn run: one line per failed pipeline
    if (refused or failed) and err.count("\n") == 1:
        return "files written" if written else "held"
    return "other"


def run(args: list[str]) -> tuple[int, str, str]:
    from fuzz_inputs import run_etn

    return run_etn([str(a) for a in args])


def files(folder: Path) -> dict[str, tuple[int, int]]:
    from fuzz_inputs import snapshot

    return snapshot(folder)


def results(data: Path, name: str = "attack") -> list:
    record = json.loads((data / "reports" / name / "results.json").read_text())
    return [r for r in record["results"] if not r["metric"].startswith("runtime")]


def finished_digits(root: Path) -> tuple[Path, Path]:
    """One finished digits run with two seeds, built once per worker and copied per case."""
    clean = root / "clean"
    pipeline = root / "attack.toml"
    if not clean.exists():
        pipeline.write_text(DIGITS)
        code, err, escaped = run(["run", pipeline, "-d", clean])
        assert code == 0, err + escaped
    return pipeline, clean


def copy_of(root: Path, case: Path) -> tuple[Path, Path]:
    pipeline, clean = finished_digits(root)
    shutil.copytree(clean, case / "data")
    return pipeline, case / "data"


def swap(a: Path, b: Path) -> None:
    aside = a.with_name("aside")
    a.rename(aside)
    b.rename(a)
    aside.rename(b)


def keep_time(path: Path, change: Callable[[bytes], bytes]) -> None:
    stat = path.stat()
    path.write_bytes(change(path.read_bytes()))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# ------------------------------------------------------------------------ named cases
def swapped_heads_predict(root: Path, case: Path) -> str:
    pipeline, data = copy_of(root, case)
    first, second = sorted(p for p in (data / "heads").iterdir() if p.is_dir())
    swap(first, second)
    out = case / "p.csv"
    code, err, escaped = run(
        ["predict", pipeline, "digits:test", "--seed", "0", "-d", data, "-o", out]
    )
    return verdict_of(code, err, escaped, out.exists(), wrong=True)


def swapped_heads_evaluate(root: Path, case: Path) -> str:
    pipeline, data = copy_of(root, case)
    clean = results(data)
    first, second = sorted(p for p in (data / "heads").iterdir() if p.is_dir())
    swap(first, second)
    code, err, escaped = run(["evaluate", pipeline, "-d", data, "--force"])
    if code == 0:
        code, err, escaped = run(["report", pipeline, "-d", data])
        return verdict_of(code, err, escaped, False, wrong=code == 0 and results(data) != clean)
    return verdict_of(code, err, escaped, False)


def new_test_split(data: Path) -> int:
    return len({p.name for p in data.glob("features/*/image_folder.test-*") if p.is_dir()})


def inverted_images(root: Path, case: Path) -> str:
    """Every test image inverted (same names, sizes and times): must be extracted again."""
    import io

    import numpy as np
    from fuzz_inputs import image_project
    from PIL import Image

    found = image_project(case, ".png")
    assert run(found.args)[0] == 0
    for path in sorted((case / "images" / "test").rglob("*.png")):
        pixels = 255 - np.asarray(Image.open(path).convert("RGB"))
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        inverted = buffer.getvalue()
        keep_time(path, lambda _: inverted)  # noqa: B023 - used at once
    code, err, escaped = run(found.args)
    return verdict_of(code, err, escaped, False, wrong=new_test_split(found.data) < 2)


def listed_images_replaced(root: Path, case: Path) -> str:
    """The images an image list names replaced (new pixels, new sizes): extracted again."""
    import numpy as np
    from fuzz_inputs import image_project
    from PIL import Image

    found = image_project(case, ".png", listed=True)
    assert run(found.args)[0] == 0
    rng = np.random.default_rng(1)
    for path in sorted((case / "images" / "adapt").rglob("*.png")):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
            path, compress_level=0
        )
    code, err, escaped = run(found.args)
    adapt = {p.name for p in found.data.glob("features/*/image_folder.adapt.txt-*") if p.is_dir()}
    return verdict_of(code, err, escaped, False, wrong=len(adapt) < 2)


def symlink_loop(root: Path, case: Path) -> str:
    from fuzz_inputs import image_project

    found = image_project(case, ".png")
    (case / "images" / "test" / "a" / "loop").symlink_to(".")
    before = files(found.data)
    code, err, escaped = run(found.args)
    return verdict_of(code, err, escaped, files(found.data) != before, wrong=True)


def own_shard_bit_rot(root: Path, case: Path) -> str:
    """100 logits of your own shard folder flipped in place (finite, time kept)."""
    import h5py
    from test_bad_inputs import byof_pipeline

    pipeline = byof_pipeline(case)
    data = case / "data"
    assert run(["run", pipeline, "-d", data])[0] == 0
    clean = results(data, "byof")
    shard = case / "mine" / "test" / "shard-00000.h5"
    with h5py.File(shard, "r") as handle:
        offset = handle["logits"].id.get_offset()

    def rot(raw: bytes) -> bytes:
        flipped = bytearray(raw)
        for i in range(100):
            flipped[offset + 4 * i] ^= 0x01  # the lowest mantissa bit of a float32
        return bytes(flipped)

    keep_time(shard, rot)
    code, err, escaped = run(["run", pipeline, "-d", data])
    wrong = code == 0 and results(data, "byof") != clean
    return verdict_of(code, err, escaped, False, wrong=wrong or code == 0)


def overrides_in_two_orders(root: Path, case: Path) -> str:
    from test_bad_inputs import byof_pipeline

    pipeline = byof_pipeline(case)
    data = case / "data"
    one = ["--set", "heads.etn.epochs=1", "--set", "heads.etn.epochs=3"]
    two = ["--set", "heads.etn.epochs=3", "--set", "heads.etn.epochs=1"]
    for options in (one, two):
        code, err, escaped = run(["run", pipeline, "-d", data, *options])
        if code != 0:
            return verdict_of(code, err, escaped, False)
    folders = [p for p in (data / "reports").iterdir() if "+" in p.name]
    return "held" if len(folders) == 2 else "silent wrong"


def hidden_of_width_zero(root: Path, case: Path) -> str:
    import numpy as np
    from test_bad_inputs import byof_pipeline

    pipeline = byof_pipeline(case, far={"hidden": np.zeros((40, 0), np.float32)})
    code, err, escaped = run(["run", pipeline, "-d", case / "data"])
    return verdict_of(code, err, escaped, False, wrong=True)


def plot_record(text: str) -> Callable[[Path, Path], str]:
    def attack(root: Path, case: Path) -> str:
        from test_bad_inputs import byof_pipeline

        pipeline = byof_pipeline(case)
        data = case / "data"
        assert run(["run", pipeline, "-d", data])[0] == 0
        victim = case / "victim.txt"
        victim.write_text("keep")
        (data / "reports" / "byof" / "plots.json").write_text(text)
        verdicts = []
        for command in ("report", "run"):
            code, err, escaped = run([command, pipeline, "-d", data])
            verdicts.append(verdict_of(code, err, escaped, False, wrong=not victim.exists()))
        return next((v for v in verdicts if v != "held"), "held")

    return attack


def refused_before_work(args: Callable[[Path, Path], list]) -> Callable[[Path, Path], str]:
    """A pipeline that must be refused in one line with nothing written."""

    def attack(root: Path, case: Path) -> str:
        data = case / "data"
        code, err, escaped = run(args(root, case))
        return verdict_of(code, err, escaped, bool(files(data)), wrong=True)

    return attack


def digits_file(case: Path, text: str) -> Path:
    path = case / "p.toml"
    path.write_text(text)
    return path


def huge_seed(root: Path, case: Path) -> list:
    pipeline = digits_file(case, DIGITS.replace("seeds = [0, 1]", "seeds = [18446744073709551616]"))
    return ["run", pipeline, "-d", case / "data"]


def dry_run_with(*options: str) -> Callable[[Path, Path], list]:
    """Planning only: an absurd size would allocate gigabytes in ``etn train`` before."""

    def args(root: Path, case: Path) -> list:
        text = DIGITS + '[[heads]]\nname = "sngp"\n[[heads]]\nname = "duq"\n'
        return ["run", digits_file(case, text), "-d", case / "data", "--dry-run", *options]

    return args


def disk_full_in_weights(root: Path, case: Path) -> str:
    pipeline, clean = finished_digits(root)
    data = case / "data"
    shutil.copytree(clean, data, ignore=shutil.ignore_patterns("heads", "metrics", "reports"))
    command = f"ulimit -f 16; exec {sys.executable} -m etn_cli train {pipeline} -d {data}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=case)
    from cli_runner import without_progress

    err = without_progress(done.stderr)
    return verdict_of(done.returncode, err, "", False)


def import_onto_a_file(root: Path, case: Path) -> str:
    from test_own_data_inputs import feature_files

    feature_files(case)
    (case / "taken").write_text("mine")
    paths = [case / "mine" / f"{n}.npz" for n in ("adapt", "test", "ood")]
    code, err, escaped = run(["import", *paths, "-o", case / "taken"])
    return verdict_of(code, err, escaped, (case / "taken").read_text() != "mine")


def import_after_a_kill(root: Path, case: Path) -> str:
    from test_own_data_inputs import feature_files

    feature_files(case)
    paths = [case / "mine" / f"{n}.npz" for n in ("adapt", "test", "ood")]
    out = case / "out"
    assert run(["import", paths[0], "-o", out])[0] == 0  # the first split finished
    (out / "test.partial-0badf00d").mkdir()  # the second one killed half way
    code, err, escaped = run(["import", *paths, "-o", out])
    whole = sorted(p.name for p in out.iterdir() if p.is_dir()) == ["adapt", "ood", "test"]
    return verdict_of(code, err, escaped, False) if whole or code != 0 else "other"


def features_of_one_test_class(root: Path, case: Path) -> str:
    import numpy as np
    from test_own_data_inputs import feature_files

    pipeline = feature_files(case, test={"labels": np.ones(30, np.int64)})
    data = case / "data"
    code, err, escaped = run(["run", pipeline, "-d", data])
    return verdict_of(code, err, escaped, bool(files(data)), wrong=True)


def questions_of_one_test_class(root: Path, case: Path) -> str:
    from fuzz_inputs import question_project
    from llm_fixtures import make_llama

    llama = root / "llama"
    if not llama.exists():
        make_llama(llama)
    found = question_project(case, ".jsonl", llama)
    lines = found.target.read_text().splitlines()
    found.target.write_text(
        "".join(json.dumps({**json.loads(x), "answer": 0}) + "\n" for x in lines)
    )
    code, err, escaped = run(["run", found.args[1], "-d", found.data])
    return verdict_of(code, err, escaped, bool(files(found.data)), wrong=True)


NAMED: dict[str, Callable[[Path, Path], str]] = {
    "swapped seed heads: predict": swapped_heads_predict,
    "swapped seed heads: evaluate --force": swapped_heads_evaluate,
    "test images inverted, same sizes": inverted_images,
    "images of an image list replaced": listed_images_replaced,
    "symbolic link loop in an image folder": symlink_loop,
    "bit rot in your own shard folder": own_shard_bit_rot,
    "--set k=1 --set k=3 and the reverse": overrides_in_two_orders,
    "hidden states of width 0": hidden_of_width_zero,
    "plots.json naming ../../../victim.txt": plot_record('{"files": ["../../../victim.txt"]}'),
    "empty plots.json": plot_record(""),
    "plots.json holding a list": plot_record("[]"),
    "seeds = [2**64]": refused_before_work(huge_seed),
    "etn width=100000, depth=50": refused_before_work(
        dry_run_with("--set", "heads.etn.width=100000", "--set", "heads.etn.depth=50")
    ),
    "sngp mean_field_factor=-1": refused_before_work(
        dry_run_with("--set", "heads.sngp.mean_field_factor=-1")
    ),
    "duq lr_milestones=[-5, 1000]": refused_before_work(
        dry_run_with("--set", "heads.duq.lr_milestones=[-5, 1000]")
    ),
    "disk full while head weights are written": disk_full_in_weights,
    "etn import -o an existing file": import_onto_a_file,
    "etn import after a kill": import_after_a_kill,
    "[features] test file of one class": features_of_one_test_class,
    "JSONL test split of one class": questions_of_one_test_class,
}


# ------------------------------------------------------------------------ the sweep
def cases(per_format: int) -> list[tuple[str, str]]:
    from fuzz_inputs import sample

    found = [("named", name) for name in NAMED]
    found += [("formats", json.dumps([c.fmt, c.corruption, c.seed])) for c in sample(per_format, 7)]
    return found


def run_one(group: str, spec: str, root: Path) -> tuple[str, str]:
    case = Path(tempfile.mkdtemp(dir=root))
    try:
        if group == "named":
            return NAMED[spec](root, case), ""
        from fuzz_inputs import HELD, Case, run_case

        llama = root / "llama"
        if not llama.exists():
            from llm_fixtures import make_llama

            make_llama(llama)
        verdict, detail = run_case(Case(*json.loads(spec)), case, llama)
        mapped = {"accepted": "held", "refused": "held", "traceback": "traceback",
                  "files written": "files written"}  # fmt: skip
        return mapped.get(verdict, "held" if verdict in HELD else "other"), detail
    except Exception as err:  # the harness's own failure is reported, not hidden
        return "other", f"harness: {type(err).__name__}: {err}"
    finally:
        shutil.rmtree(case, ignore_errors=True)


def worker(root: Path, start: int, per_format: int) -> None:
    for index, (group, spec) in enumerate(cases(per_format)[start:], start):
        verdict, detail = run_one(group, spec, root)
        print(json.dumps({"index": index, "group": group, "case": spec, "verdict": verdict,
                          "detail": detail[:300]}), flush=True)  # fmt: skip


def sweep(code: Path, per_format: int) -> list[dict]:
    """Every case against the checkout ``code``, in workers that import it."""
    root = Path(tempfile.mkdtemp(prefix="etn-attack-"))
    total = len(cases(per_format))
    done: list[dict] = []
    env = {**os.environ, "PYTHONPATH": str(code)}
    while len(done) < total:
        command = [sys.executable, __file__, "--worker", str(root), "--start", str(len(done))]
        command += ["--per-format", str(per_format)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        assert proc.stdout is not None
        for line in proc.stdout:
            done.append(json.loads(line))
        if proc.wait() != 0 and len(done) < total:  # the next case killed the worker
            group, spec = cases(per_format)[len(done)]
            done.append({"group": group, "case": spec, "verdict": "traceback",
                         "detail": f"worker killed (exit {proc.returncode})"})  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--per-format", type=int, default=20)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.start, args.per_format)
        return
    random.seed(0)
    print(
        f"{date.today()}: | checkout | group | tried | held | failed | "
        + " | ".join(VERDICTS[1:])
        + " |"
    )
    print("|---|---|---:|---:|---:|" + "---:|" * (len(VERDICTS) - 1))
    failures = []
    for code in args.code:
        outcomes = sweep(code, args.per_format)
        for group in ("named", "formats", "all"):
            mine = [o for o in outcomes if group in (o["group"], "all")]
            count = Counter(o["verdict"] for o in mine)
            row = [len(mine), count["held"], len(mine) - count["held"]]
            row += [count[v] for v in VERDICTS[1:]]
            print(f"| {code} | {group} | " + " | ".join(map(str, row)) + " |", flush=True)
        failures += [(code, o) for o in outcomes if o["verdict"] != "held"]
    for code, o in failures:
        print(f"FAIL {code.name}: {o['case']}: {o['verdict']}: {o['detail']}")


if __name__ == "__main__":
    main()
