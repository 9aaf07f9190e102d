"""The GPU check: does etn give the CPU's results on a GPU, and how fast? One script, one go.

Parts (``--parts``, all by default; about 6 minutes on one H100 or H200):

``digits``
    ``etn run pipelines/digits.toml`` with ``--device cpu`` and with ``--device cuda`` (the CPU
    run goes on in a background process while the other parts use the GPU; both share the
    digits CNN, trained once), then every row of the two results tables side by side: accuracy
    must agree to 0.1 point, every other metric within the CPU run's 95% CI half-width over
    seeds (or 0.5 point for a method with one seed, whose half-width is 0).
``examples``
    The same for ``examples/*.toml`` on the stand-ins of ``examples/standins.py``.
``heads``
    Every trainable head fitted on the device at ImageNet shape (10,000 x 2,048, C = 1,000,
    50 epochs, the paper's settings of that column as ``bench_heads.py`` gives them) and at
    the LLM shape (5,000 x 4,096, C = 4, 5 epochs): train seconds, train seconds over the
    scalar ETN's, how the steps ran (a CUDA graph or eagerly), predict seconds on 10,000 rows,
    peak GPU memory, accuracy, and agreement with the classifier's argmax.
``extract``
    ``bench_extract.py``'s table for ResNet-50 (bfloat16, 224 x 224, batch 256, 8 loader
    workers) and for the Llama-3.1-8B shape (bfloat16, 512-token prompts, batch 16): each
    step's time over the pure forward pass.

Run it as a person would, from the repository root, with its output on the terminal and in
a file; it needs etn's dependencies and a CUDA device::

    python benchmarks/gpu_check.py 2>&1 | tee gpu_check.md

The tables are Markdown; ``benchmarks/README.md`` keeps them with the date and the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # etn_cli and the scripts beside

TRAINABLE = (
    "etn", "etn:vector", "etn_offset", "static", "adats", "dmm", "ib_edl", "map_edl",
    "ensemble", "duq", "sngp", "laplace",
)  # fmt: skip
PARTS = ("digits", "examples", "heads", "extract")


def with_repo_path() -> dict[str, str]:
    """The environment of a child process that imports etn_cli from this checkout."""
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def etn_run(pipeline: Path, data: Path, device: str, threads: int = 0) -> subprocess.Popen:
    """``etn run PIPELINE`` in a process of its own, its JSON table kept in ``data``. A
    backbone computes in float32 on every device (``dtype = "auto"`` is bfloat16 on a GPU,
    a backbone's precision, which ``bench_extract.py`` measures apart)."""
    env = with_repo_path()
    if threads:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    data.mkdir(parents=True, exist_ok=True)
    out = (data / "table.json").open("w")
    log = (data / "run.log").open("w")
    command = [sys.executable, "-m", "etn_cli", "run", str(pipeline), "-d", str(data)]
    command += ["--device", device, "--format", "json", "-q"]
    if "[backbone]" in pipeline.read_text() and "digits_cnn" not in pipeline.read_text():
        command += ["--set", "backbone.dtype=float32"]
    return subprocess.Popen(command, stdout=out, stderr=log, env=env, cwd=REPO)


def finished(process: subprocess.Popen, data: Path, what: str) -> dict | None:
    """The results of a run started by :func:`etn_run`, or None (its log's end printed)."""
    started = time.perf_counter()
    code = process.wait()
    if code != 0:
        tail = (data / "run.log").read_text().splitlines()[-15:]
        print(f"**{what} FAILED** (exit {code}):\n```\n" + "\n".join(tail) + "\n```")
        return None
    waited = time.perf_counter() - started
    (results,) = (data / "reports").glob("*/results.json")  # every row (stdout: the table's)
    rows = json.loads(results.read_text())["results"]
    return {"rows": rows, "waited": waited}


def row_key(row: dict) -> tuple:
    return (row["method_label"], row["eval_set"], row["task"], row["metric"], row["score"])


def compare(cpu: dict, gpu: dict, title: str) -> bool:
    """Print how far the GPU run's table is from the CPU run's; True when within tolerance."""
    reference = {row_key(r): r for r in cpu["rows"]}
    worst: dict[str, tuple[float, float, tuple]] = {}
    outside = []
    for row in gpu["rows"]:
        ref = reference.get(row_key(row))
        if ref is None or ref["mean"] is None or row["mean"] is None:
            continue
        if row["metric"].startswith("runtime"):  # timings: the devices differ, as they should
            continue
        diff = abs(row["mean"] - ref["mean"])
        allowed = 0.001 if row["metric"] == "acc" else max(ref["ci95_half_width"] or 0, 0.005)
        if diff > allowed + 1e-12:
            outside.append((row_key(row), ref["mean"], row["mean"], allowed))
        if diff > worst.get(row["metric"], (-1.0,))[0]:
            worst[row["metric"]] = (diff, allowed, row_key(row))
    missing = set(reference) - {row_key(r) for r in gpu["rows"]}
    print(f"\n### {title}: CUDA against CPU ({len(gpu['rows'])} rows)\n")
    print("| metric | largest difference (points) | allowed there | where |")
    print("|---|---:|---:|---|")
    for metric, (diff, allowed, key) in sorted(worst.items()):
        print(f"| {metric} | {100 * diff:.2f} | {100 * allowed:.2f} | {key[0]}, {key[1]} |")
    print(f"\nrows beyond tolerance: {len(outside)}; rows missing on CUDA: {len(missing)}")
    for key, a, b, allowed in outside[:12]:
        print(f"- {key}: CPU {100 * a:.2f}, CUDA {100 * b:.2f} (allowed {100 * allowed:.2f})")
    return not outside and not missing


def reference_runs(scratch: Path, parts: list[str]) -> dict[Path, tuple]:
    """Start the CPU runs of the pipelines the check compares, in processes of their own that
    run while the GPU parts do; each GPU run later reuses its digits CNN (trained once)."""
    pipelines = [REPO / "pipelines" / "digits.toml"] if "digits" in parts else []
    if "examples" in parts:
        done = subprocess.run([sys.executable, str(REPO / "examples" / "standins.py")],
                              cwd=REPO, capture_output=True, text=True,
                              env=with_repo_path())  # fmt: skip
        if done.returncode != 0:
            print(f"**standins.py FAILED**:\n```\n{done.stderr[-2000:]}\n```")
        else:
            pipelines += sorted((REPO / "examples").glob("*.toml"))
    runs = {}
    for pipeline in pipelines:
        cpu_dir = scratch / f"{pipeline.stem}-cpu"
        runs[pipeline] = (etn_run(pipeline, cpu_dir, "cpu", threads=4), cpu_dir)
    return runs


def check_pipeline(pipeline: Path, reference: tuple, scratch: Path, device: str) -> bool:
    """The pipeline on ``device`` against its CPU run."""
    process, cpu_dir = reference
    name = pipeline.relative_to(REPO)
    print(f"\n## `etn run {name}`, cpu and {device}")
    cpu = finished(process, cpu_dir, f"the CPU run of {name}")
    if cpu is None:
        return False
    gpu_dir = scratch / f"{pipeline.stem}-{device}-run"
    if (cpu_dir / "backbones").exists():  # the same digits CNN
        shutil.copytree(cpu_dir / "backbones", gpu_dir / "backbones")
    started = time.perf_counter()
    gpu = finished(etn_run(pipeline, gpu_dir, device), gpu_dir, f"the {device} run of {name}")
    if gpu is None:
        return False
    print(f"{device} run {time.perf_counter() - started:.1f} s")
    return compare(cpu, gpu, str(name))


def fit_heads(shape: str, device: str, entries: tuple[str, ...], epochs: int | None) -> None:
    """Fit each trainable head at ``shape`` on ``device`` and print the table."""
    from bench_heads import SHAPE_HEADS, SHAPES, features

    from etn_cli.errors import EtnError
    from etn_cli.heads import heads

    rows, dim, classes, shape_settings = SHAPES[shape]
    shape_settings = shape_settings | ({"epochs": epochs} if epochs else {})
    h, z, y, classifier, layers = features(rows, dim, classes, 0)
    h_test, z_test, y_test, _, layers_test = features(10_000, dim, classes, 1)
    classifier_acc = float((z_test.argmax(1) == y_test).mean())
    epochs = shape_settings.get("epochs")
    print(f"\n## heads at {shape} shape: {rows} x {dim}, C = {classes}, {epochs} epochs, "
          f"on {torch.cuda.get_device_name() if device == 'cuda' else device}")  # fmt: skip
    print(f"classifier accuracy on the 10,000 test rows: {100 * classifier_acc:.2f}%\n")
    print(
        "| head | train s | × scalar ETN | steps | predict s | peak GiB | acc % | = classifier % |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    etn_s = None
    for entry in entries:
        name, _, variant = entry.partition(":")
        cls = heads.get(name)
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        settings = {k: v for k, v in shape_settings.items() if k in fields}
        settings |= SHAPE_HEADS.get(shape, {}).get(name, {})
        head = cls(**settings, **({"variant": variant} if variant else {}))
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            head.fit(h, z, y, classifier=classifier, layers=layers, device=device)
        except EtnError as refusal:
            print(f"| {entry} | refused: {refusal} |||||||")
            continue
        if device == "cuda":
            torch.cuda.synchronize()
        fit_s = time.perf_counter() - started
        etn_s = etn_s or fit_s
        started = time.perf_counter()
        pred = head.predict(h_test, z_test, layers=layers_test, device=device)
        predict_s = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        steps = steps_of(head.selection_) if "epochs" in fields else "-"
        acc = 100 * float((pred.predictions == y_test).mean())
        same = 100 * float((pred.predictions == z_test.argmax(1)).mean())
        print(f"| {entry} | {fit_s:.1f} | {fit_s / etn_s:.2f} | {steps} | {predict_s:.2f} "
              f"| {peak:.2f} | {acc:.2f} | {same:.2f} |", flush=True)  # fmt: skip
        del head, pred


def steps_of(selection: dict | list | None) -> str:
    """How a trained head's steps ran (its record's ``steps``; the ensemble's members')."""
    records = selection if isinstance(selection, list) else [selection or {}]
    return "/".join(sorted({r.get("steps", "eager") for r in records}))


def check_extract(device: str) -> None:
    """``bench_extract.py``'s tables for ResNet-50 and the Llama-3.1-8B shape."""
    import bench_extract

    runs = [
        ["--model", "resnet50", "--image-size", "224", "--batch", "256", "--batches", "60",
         "--dtype", "bfloat16", "--workers", "8", "--compare-batches", "0"],
        ["--backbone", "llm", "--dtype", "bfloat16", "--batch", "16", "--batches", "8",
         "--prompt-tokens", "512", "--repeats", "1", "--compare-batches", "0"],
    ]  # fmt: skip
    for args in runs:
        print(f"\n## extraction: bench_extract.py {' '.join(args)}\n")
        sys.argv = ["bench_extract.py", *args, "--device", device]
        started = time.perf_counter()
        bench_extract.main()
        print(f"({time.perf_counter() - started:.0f} s with set-up)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS))
    parser.add_argument("--device", default="cuda", help="cpu: a rehearsal of the script")
    parser.add_argument("--heads", nargs="*", default=list(TRAINABLE))
    parser.add_argument("--shapes", nargs="*", default=["imagenet", "llm"])
    parser.add_argument("--epochs", type=int, help="train the heads this many epochs instead")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device here; the GPU check needs one (--device cpu rehearses).")
    began = time.perf_counter()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"# etn GPU check, {time.strftime('%Y-%m-%d')}, {name}, torch {torch.__version__}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="etn-gpu-check-") as folder:
        scratch = Path(folder)
        references = reference_runs(scratch, args.parts)
        if "heads" in args.parts:
            for shape in args.shapes:
                fit_heads(shape, args.device, tuple(args.heads), args.epochs)
        for pipeline, reference in references.items():
            ok = check_pipeline(pipeline, reference, scratch, args.device) and ok
        if "examples" in args.parts and not any(p.parent.name == "examples" for p in references):
            ok = False  # the stand-ins failed (printed above)
        if "extract" in args.parts:
            check_extract(args.device)
    print(
        f"\n{'all results agree' if ok else 'RESULTS DIFFER (see above)'}; "
        f"{time.perf_counter() - began:.0f} s in all"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
