"""What does ``etn extract`` cost over the pure forward pass of a torchvision model?

Builds the ``torchvision`` backbone with random weights (``weights = "none"``), makes
``--batches`` batches of random ImageNet-shaped images, and times on the same batches:

1. ``forward``: ``model(x)`` alone, inputs already on the device (inference mode, autocast
   with ``--dtype``): the reference;
2. ``loader alone``: iterating the backbone's loader (normalisation, pinned memory on CUDA);
3. ``extract_batch``: what extract runs per batch (host-to-device copy, hooks for the hidden
   state, float32 copies back to the host), inputs already loaded;
4. ``extract, writer inline`` / ``extract, writer thread``: the loader + ``extract_batch`` +
   a resumable ``ShardWriter`` (journal, fsync and sha256 per shard, as ``etn extract``
   writes) fed inline or through the writer thread. ``etn extract`` writes inline on the CPU
   and through the thread on a GPU (``shard_sink``); ``(etn)`` marks the one it uses here.

Images are float tensors, so the loader only normalises them; JPEG decoding, which dominates
real ImageNet extraction unless ``[data] workers`` is large enough, is left out on purpose.

    python benchmarks/bench_extract.py --model resnet50 --image-size 224 --batch 256 \
        --batches 20 --dtype bfloat16            # on a GPU, as the issue asks
    python benchmarks/bench_extract.py           # a small CPU default
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from etn_cli.backbones.torchvision_model import Config, TorchvisionBackbone
from etn_cli.datasets.base import Split
from etn_cli.stages.extract import BackgroundAppender, forward_into, shard_sink
from etn_cli.store import ShardWriter


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(run: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Best wall time of ``repeats`` runs, after one warm-up run."""
    run()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    device = torch.device(args.device)
    config = Config(model=args.model, weights="none", dtype=args.dtype, crop=0, resize=0)
    backbone = TorchvisionBackbone(config, Path(tempfile.mkdtemp()), args.device)
    n = args.batch * args.batches
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(n, 3, args.image_size, args.image_size, generator=generator)
    split = Split("random", "test", TensorDataset(images, torch.zeros(n, dtype=torch.int64)),
                  np.arange(n), 1000)  # fmt: skip
    batches = [b for b, _, _ in backbone.loader(split, args.batch)]
    on_device = [b.to(device) for b in batches]
    model = backbone.model

    def forward() -> None:
        with torch.inference_mode(), backbone.autocast():
            for x in on_device:
                model(x)

    def extract_batches() -> None:
        for x in batches:
            backbone.extract_batch(x)

    pin = device.type == "cuda"

    def loader_alone() -> None:
        for _ in backbone.loader(split, args.batch, workers=args.workers, pin_memory=pin):
            pass

    def extract(threaded: bool) -> Callable[[], None]:
        def run() -> None:
            with tempfile.TemporaryDirectory() as folder:
                resume = {"batch_size": args.batch}  # journaled shards, as etn extract writes
                with ShardWriter(Path(folder) / "split", {"bench": True}, resume=resume) as writer:
                    with BackgroundAppender(writer.append, threaded=threaded) as sink:
                        loader = backbone.loader(split, args.batch, workers=args.workers,
                                                 pin_memory=pin)  # fmt: skip
                        forward_into(sink, backbone, loader)

        return run

    used = shard_sink(print, args.device).threaded
    runs = {
        "forward (reference)": forward,
        "loader alone": loader_alone,
        "extract_batch": extract_batches,
        "extract, writer inline" + ("" if used else " (etn)"): extract(threaded=False),
        "extract, writer thread" + (" (etn)" if used else ""): extract(threaded=True),
    }
    print(f"{args.model}, {n} images of {args.image_size}x{args.image_size}, batch "
          f"{args.batch}, {args.dtype} on {device}, best of {args.repeats}")  # fmt: skip
    print("| step | seconds | images/s | × forward |\n|---|---:|---:|---:|")
    reference = None
    for name, run in runs.items():
        seconds = timed(run, device, args.repeats)
        reference = reference or seconds
        print(f"| {name} | {seconds:.3f} | {n / seconds:.0f} | {seconds / reference:.2f} |")


if __name__ == "__main__":
    main()
