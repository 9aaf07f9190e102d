"""Training and inference time of every registered head on CIFAR-shaped cached features.

Method: synthetic features shaped like VGG16 / CIFAR-10 adaptation data (2,500 x 512, C = 10,
class-dependent means, logits from a fixed linear layer that is also handed to the heads that
start from the backbone's classifier, two pooled "layers" for the DMM), each head fitted once
with its defaults (the paper's CIFAR-10 settings; ETN: M = 20, 50 epochs, batch 1024, lr 1e-3)
on the CPU threads torch is given, then asked to predict 10,000 rows. ``name:variant`` entries
time a variant (``etn:matrix``). The reference is a plain softmax over the same logits, timed
in the same run, so the ratio says what a head costs on top of reading the backbone's output.

The first optimizer a process creates imports ``torch._dynamo`` (about 2 s, once per
process, whatever the head); the script imports it up front so that no head is charged for it.

The post-hoc scorers (``etn_cli/heads/scorers``) are timed by ``bench_scorers.py``: with
``--shape imagenet`` this script runs it too, with ``--fit-rows`` (128,000) ID rows.

``--shape imagenet`` (10,000 x 2,048, C = 1,000) and ``--shape llm`` (5,000 x 4,096, C = 4)
use the paper's adaptation settings of that column (ResNet50: batch 64, 50 epochs, ETN prior
mode 5, lambda 1e-3; LLMs: batch 8, 5 epochs, ETN 3 layers of 512, prior mode 100, cosine
schedule with warm-up) for every head that has such a setting.

Each row gives the head's training time over the scalar ETN's (``x etn``, trained first in
the same run) and its prediction time over the softmax's (``x softmax``). ``--epochs`` trains
every head for that many epochs instead (a quick look at a large shape; the ratios to ETN stay
comparable since ETN gets the same epochs). At ImageNet shape SNGP uses the reference code's
shared covariance and DUQ a centroid size of 16 (``SHAPE_HEADS``): the defaults' per-class
covariances (4 GiB) and 512-wide centroids (1 G weights) do not fit.

``--floors`` adds each head's floor on this machine: the matrix-product FLOPs of its fit
(``torch.utils.flop_counter``, counted on 2,000 rows at one and two epochs and scaled to the
run's rows and epochs; elementwise work is not counted) over the float32 product rate of a
64 x 2,048 x 1,000 product measured in the same run. ``x floor`` is the measured time over it:
what overhead is left to remove; a floor above a time goal means the goal needs a faster
machine, not faster code.

    python benchmarks/bench_heads.py [--heads etn etn:vector static] [--shape cifar|imagenet|llm]
        [--epochs 5] [--no-scorers] [--floors]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np
import torch
import torch._dynamo

from etn_cli.errors import EtnError
from etn_cli.heads import heads
from etn_cli.heads.scorers.base import Scorer

SCORERS = [n for n in heads.names() if issubclass(heads.get(n), Scorer)]

VARIANTS = ("etn:vector", "etn:matrix", "static:vector", "static:matrix")
SHAPES = {  # rows, dim, classes, settings of the paper's column (Supp. Table of hyper-parameters)
    "cifar": (2500, 512, 10, {}),
    "imagenet": (
        10_000, 2048, 1000,
        {"batch_size": 64, "epochs": 50, "prior_mode": 5.0, "kl_weight": 1e-3},
    ),
    "llm": (
        5000, 4096, 4,
        {"batch_size": 8, "epochs": 5, "prior_mode": 100.0, "depth": 3, "width": 512,
         "schedule": "cosine", "warmup_fraction": 0.1},
    ),
}  # fmt: skip
SHAPE_HEADS = {  # per-head settings a shape needs to fit in memory (see the docstring)
    "imagenet": {"sngp": {"covariance": "shared"}, "duq": {"centroid_size": 16}},
}


def features(rows: int, dim: int, classes: int, seed: int) -> tuple:
    """hidden (N, D), logits (N, C), labels (N,), classifier, layers; the backbone (class means,
    weights, layer projections) is fixed, ``seed`` draws the rows."""
    rng = np.random.default_rng(0)
    means = rng.normal(size=(classes, dim)) * 0.5
    weight = (means * 4).astype(np.float32)  # (C, D)
    projections = [rng.normal(size=(dim, width)) / np.sqrt(dim) for width in (64, 128)]
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, rows)
    hidden = (means[labels] + rng.normal(size=(rows, dim))).astype(np.float32)
    classifier = {"weight": torch.from_numpy(weight), "bias": torch.zeros(classes)}
    layers = {f"layer{i}": (hidden @ p).astype(np.float32) for i, p in enumerate(projections)}
    return hidden, hidden @ weight.T, labels, classifier, layers


def product_rate(repeats: int = 50) -> float:
    """FLOP/s of a float32 64 x 2,048 by 2,048 x 1,000 product (a batch through a head's widest
    layer at ImageNet shape), the median of ``repeats`` on the threads torch is given."""
    a, b = torch.randn(64, 2048), torch.randn(2048, 1000)
    times = []
    for _ in range(repeats + 5):
        started = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - started)
    return 2 * 64 * 2048 * 1000 / float(np.median(times[5:]))


def counted_flops(make_head, data: tuple, epochs: int | None) -> float:
    """Matrix-product FLOPs of one fit (eager: compiled kernels are elementwise work)."""
    from torch.utils.flop_counter import FlopCounterMode

    h, z, y, classifier, layers = data
    head = make_head({"epochs": epochs} if epochs else {})
    compile_setting = os.environ.get("ETN_COMPILE")
    os.environ["ETN_COMPILE"] = "0"
    try:
        with FlopCounterMode(display=False) as counter:
            head.fit(h, z, y, classifier=classifier, layers=layers)
    finally:
        if compile_setting is None:
            os.environ.pop("ETN_COMPILE")
        else:
            os.environ["ETN_COMPILE"] = compile_setting
    return counter.get_total_flops()


def floor_seconds(make_head, data: tuple, epochs: int | None, rate: float) -> float:
    """The fit's matrix-product FLOPs at ``epochs`` over ``rate``: per epoch and fixed parts
    counted on 2,000 rows (one and two epochs) and scaled to the data's rows."""
    rows = len(data[0])
    if not epochs:  # no epochs: one fit on all rows
        return counted_flops(make_head, data, None) / rate
    part = min(rows, 2000)
    small = (data[0][:part], data[1][:part], data[2][:part], data[3],
             {k: v[:part] for k, v in data[4].items()})  # fmt: skip
    one, two = (counted_flops(make_head, small, e) for e in (1, 2))
    per_epoch, fixed = two - one, 2 * one - two
    return (fixed + epochs * per_epoch) * rows / part / rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    others = [n for n in heads.names() if n not in SCORERS]
    parser.add_argument("--heads", nargs="*", default=[*others, *VARIANTS])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="cifar")
    parser.add_argument("--fit-rows", type=int, default=128_000, help="ID rows for the scorers")
    parser.add_argument("--epochs", type=int, help="train every head this many epochs")
    parser.add_argument("--no-scorers", action="store_true", help="skip bench_scorers")
    parser.add_argument("--floors", action="store_true", help="add each fit's product floor")
    args = parser.parse_args()
    rows, dim, classes, shape_settings = SHAPES[args.shape]
    if args.epochs:
        shape_settings = shape_settings | {"epochs": args.epochs}
    entries = ["etn", *[e for e in args.heads if e != "etn"]]  # the reference first
    h, z, y, classifier, layers = features(rows, dim, classes, 0)
    h_test, z_test, _, _, layers_test = features(10_000, dim, classes, 1)
    started = time.perf_counter()
    torch.softmax(torch.from_numpy(z_test), 1)
    reference = time.perf_counter() - started
    threads = torch.get_num_threads()
    epochs = f", {args.epochs} epochs for every head" if args.epochs else ""
    print(f"{args.shape}: features {rows} x {dim}, C = {classes}, torch threads {threads}{epochs}")
    rate = product_rate() if args.floors else None
    if rate:
        print(f"float32 product rate (64 x 2,048 x 1,000): {rate / 1e9:.0f} GFLOP/s")
    floors = f" {'floor s':>9} {'x floor':>8}" if rate else ""
    print(f"{'head':<16} {'train s':>9} {'x etn':>7} {'predict s':>10} {'us/row':>8} "
          f"{'x softmax':>10}{floors}")  # fmt: skip
    etn_s = None
    for entry in entries:
        name, _, variant = entry.partition(":")
        cls = heads.get(name)
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        settings = {k: v for k, v in shape_settings.items() if k in fields}
        settings |= SHAPE_HEADS.get(args.shape, {}).get(name, {})

        def make_head(extra: dict, cls=cls, settings=settings, variant=variant):
            return cls(**settings | extra, **({"variant": variant} if variant else {}))

        head = make_head({})
        started = time.perf_counter()
        try:
            head.fit(h, z, y, classifier=classifier, layers=layers)
        except EtnError as refusal:  # e.g. the matrix variant's memory check at C = 1,000
            print(f"{entry:<16} refused: {refusal}")
            continue
        fit_s = time.perf_counter() - started
        etn_s = etn_s or fit_s
        started = time.perf_counter()
        head.predict(h_test, z_test, layers=layers_test)
        predict_s = time.perf_counter() - started
        per_row_us, ratio = predict_s / 1e4 * 1e6, predict_s / reference
        floor = ""
        if rate:
            data = (h, z, y, classifier, layers)
            defaults = {f.name: f.default for f in dataclasses.fields(cls.Config)}
            epochs_run = settings.get("epochs", defaults.get("epochs"))
            floor_s = floor_seconds(make_head, data, epochs_run, rate)
            over = f"{fit_s / floor_s:>8.2f}" if floor_s >= 0.01 else f"{'-':>8}"  # ~no products
            floor = f" {floor_s:>9.2f} {over}"
        print(f"{entry:<16} {fit_s:>9.2f} {fit_s / etn_s:>7.2f} {predict_s:>10.3f} "
              f"{per_row_us:>8.1f} {ratio:>10.0f}{floor}", flush=True)  # fmt: skip
    if args.shape == "imagenet" and not args.no_scorers:  # scorers with ImageNet-scale statistics
        import bench_scorers

        shape = dataclasses.replace(bench_scorers.SHAPES["imagenet"], fit_rows=args.fit_rows)
        bench_scorers.run(shape, ["map", "energy", "mahalanobis", *SCORERS])


if __name__ == "__main__":
    main()
