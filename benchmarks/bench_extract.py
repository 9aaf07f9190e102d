"""What does ``etn extract`` cost over the pure forward pass of a backbone?

``--backbone torchvision`` (default) builds the ``torchvision`` backbone with random weights
(``weights = "none"``) on ``--batches`` batches of random ImageNet-shaped images.
``--backbone llm`` builds the ``hf_causal_lm`` backbone on a Llama with random weights, shaped
like Llama-3.1-8B unless ``--layers/--hidden/--intermediate/--heads/--kv-heads/--vocab`` shrink
it, saved as safetensors into a temporary folder with a word-level tokenizer built on the spot
(``benchmarks/random_llama.py``), on multiple-choice prompts of exactly ``--prompt-tokens``
tokens (an article, a question and four choices drawn from the vocabulary; no padding). Both
time, on the same batches:

1. ``forward``: the model alone, inputs already on the device (inference mode): ``model(x)``
   under autocast with ``--dtype``, or the LM's ``model(**x, logits_to_keep=1)`` (next-token
   logits at the last position only, the part of the output an answer letter needs): the
   reference;
2. ``loader alone``: iterating the backbone's loader (images: stacking the pixels, pinned
   memory on CUDA; LLM: tokenisation and left padding); ``loader, first batch``: the wait for
   its first batch (starting ``--workers`` processes and filling one batch), which a short
   split pays in full and a long one once;
3. ``extract_batch``: what extract runs per batch (host-to-device copy, normalisation on the
   device, the hidden state and letter logits or hooks, float32 copies back to the host),
   inputs already loaded; ``loader + extract_batch, nothing stored``: the two together, as
   extract runs them, with the outputs dropped;
4. ``extract, writer inline`` / ``extract, writer thread``: the loader + ``extract_batch`` +
   the share of a single process, as ``etn extract`` writes it (``open_share``: the batches
   still to run, a resumable ``ShardWriter`` with its journal, fsync and sha256 per shard), fed
   inline or through the writer thread. ``etn extract`` writes inline on the CPU and through
   the thread on a GPU (``shard_sink``); ``(etn)`` marks the one it uses here.

On CUDA a last column gives each step's peak GPU memory, weights included
(``torch.cuda.max_memory_allocated``). With ``--dtype bfloat16`` or ``float16`` a second table
compares the half-precision extraction of the first ``--compare-batches`` batches with a float32
twin of the same weights (torchvision: the same module without autocast; LLM: the saved folder
loaded again in float32): the relative error of the hidden state and of the logits per row
(median and largest), the largest logit difference, and how often the predicted class agrees.
Images are uint8 tensors, as decoded JPEGs are, so the loader only stacks them (the backbone
normalises each batch on the device); JPEG decoding, which dominates real ImageNet extraction
unless ``[data] workers`` is large enough, is left out on purpose.
The LLM prompts are 512 tokens by default, about a RACE article with its question and choices
under the ``default`` template (OBQA's are near 50); batch 16 is ``[data] batch_size`` of
``pipelines/race_llama3.toml``, whose ``layers = ["all"]`` is ``--capture-layers all``.

    # on a GPU: ResNet50 as the ImageNet pipeline runs it
    python benchmarks/bench_extract.py --model resnet50 --image-size 224 --batch 256 \
        --batches 20 --dtype bfloat16
    # on a GPU: Llama-3.1-8B's shape on RACE-length prompts (16 GB of weights, written to and
    # read back from a temporary folder first; add --capture-layers all for race_llama3.toml)
    python benchmarks/bench_extract.py --backbone llm --dtype bfloat16 --batch 16 \
        --batches 16 --prompt-tokens 512
    # on a CPU: small defaults, and a tiny Llama (seconds)
    python benchmarks/bench_extract.py
    python benchmarks/bench_extract.py --backbone llm --layers 2 --hidden 256 \
        --intermediate 512 --heads 4 --kv-heads 2 --vocab 2000 --prompt-tokens 128 \
        --batch 8 --batches 4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from etn_cli.backbones.torchvision_model import Config, TorchvisionBackbone
from etn_cli.datasets.base import Split
from etn_cli.datasets.mcqa import QuestionSet
from etn_cli.planning.plan import FeatureUnit
from etn_cli.stages.distributed import SINGLE
from etn_cli.stages.extract import forward_into
from etn_cli.stages.extract_ranks import open_share
from etn_cli.stages.shard_sink import BackgroundAppender, shard_sink
from etn_cli.store.writing.pieces import Layout

SHARD_ROWS = 8192  # [data] shard_rows' default

try:  # run as a script: benchmarks/ is on sys.path
    from random_llama import LlamaShape, fixed_length_questions, save_random_llama
except ImportError:  # imported as benchmarks.bench_extract
    from benchmarks.random_llama import LlamaShape, fixed_length_questions, save_random_llama


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


@dataclass
class Case:
    """One backbone on one split, with its batches loaded and a reference forward pass."""

    title: str  # the line above the table
    unit: str  # what one row of the split is
    backbone: Any
    split: Split
    batches: list  # the loader's inputs, on the host
    forward: Callable[[], None]  # the model alone on the same batches, already on the device
    float32_twin: Callable[[], Any]  # the same weights computing in float32


def torchvision_case(args: argparse.Namespace, scratch: Path) -> Case:
    """``args.model`` with random weights on random ImageNet-shaped images."""
    device = torch.device(args.device)
    config = Config(model=args.model, weights="none", dtype=args.dtype, crop=0, resize=0)
    backbone = TorchvisionBackbone(config, scratch, args.device)
    n = args.batch * args.batches
    generator = torch.Generator().manual_seed(0)
    size = (n, 3, args.image_size, args.image_size)
    images = torch.randint(0, 256, size, dtype=torch.uint8, generator=generator)  # decoded
    split = Split("random", "test", TensorDataset(images, torch.zeros(n, dtype=torch.int64)),
                  np.arange(n), 1000)  # fmt: skip
    batches = [b for b, _, _ in backbone.loader(split, args.batch)]
    model = backbone.model
    on_device = [backbone.prepare(b) for b in batches]  # normalised, as the model takes them

    def forward() -> None:
        with torch.inference_mode(), backbone.autocast():
            for x in on_device:
                model(x)

    title = (f"{args.model}, {n} images of {args.image_size}x{args.image_size}, batch "
             f"{args.batch}, {args.dtype} on {device}, best of {args.repeats}")  # fmt: skip

    def float32_twin() -> TorchvisionBackbone:
        twin = TorchvisionBackbone(replace(config, dtype="float32"), scratch, args.device)
        twin.model.load_state_dict(model.state_dict())
        return twin

    return Case(title, "images", backbone, split, batches, forward, float32_twin)


def llm_case(args: argparse.Namespace, scratch: Path) -> Case:
    """A Llama of the requested shape with random weights on fixed-length MCQA prompts.

    The reference is the model's own forward with ``logits_to_keep=1`` (the next-token logits
    at the last position only): what scoring the answer letter needs, without the (B, L, V)
    logits of every position that ``etn extract`` never computes either."""
    from etn_cli.backbones.hf_lm import CausalLMBackbone
    from etn_cli.backbones.hf_lm import Config as LMConfig

    shape = LlamaShape(
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.vocab
    )
    folder = scratch / "model"
    layers = ("all",) if args.capture_layers == "all" else ()
    length = max(16, args.prompt_tokens)  # no prompt loses its beginning
    config = LMConfig(model=str(folder), dtype=args.dtype, max_length=length, layers=layers)
    backbone = CausalLMBackbone(config, scratch / "cache", args.device)
    words = save_random_llama(folder, shape, backbone.template, args.dtype, args.device)
    n = args.batch * args.batches
    questions = fixed_length_questions(
        backbone.tokenizer, backbone.template, words, n, args.prompt_tokens
    )
    split = Split("random_mcqa", "test", QuestionSet(questions), np.arange(n), 4)
    batches = [b for b, _, _ in backbone.batches(split, args.batch)]
    device = torch.device(args.device)
    on_device = [{k: v.to(device) for k, v in b.items()} for b in batches]
    model = backbone.model  # loads the saved folder and checks the letter logits once

    def forward() -> None:
        with torch.inference_mode():
            for x in on_device:
                model(**x, use_cache=False, logits_to_keep=1)

    captured = ", every layer captured" if layers else ""
    title = (
        f"Llama with random weights ({shape.layers} layers, hidden {shape.hidden}, "
        f"{shape.heads}/{shape.kv_heads} heads, vocab {shape.vocab}{captured}), {n} prompts "
        f"of {args.prompt_tokens} tokens, batch {args.batch}, {args.dtype} on {device}, "
        f"best of {args.repeats}"
    )

    def float32_twin() -> CausalLMBackbone:
        return CausalLMBackbone(replace(config, dtype="float32"), scratch / "cache", args.device)

    return Case(title, "prompts", backbone, split, batches, forward, float32_twin)


def measure(case: Case, args: argparse.Namespace) -> None:
    """Print the table: each step's best time, throughput and ratio to the forward pass (and
    its peak GPU memory on CUDA)."""
    device = torch.device(args.device)
    backbone, split = case.backbone, case.split
    pin = device.type == "cuda"

    def extract_batches() -> None:
        for x in case.batches:
            backbone.extract_batch(x)

    def loader_alone() -> None:
        for _ in backbone.loader(split, args.batch, workers=args.workers, pin_memory=pin):
            pass

    def first_batch() -> None:
        next(iter(backbone.loader(split, args.batch, workers=args.workers, pin_memory=pin)))

    def no_store() -> None:
        for x, _, _ in backbone.loader(split, args.batch, workers=args.workers, pin_memory=pin):
            backbone.extract_batch(x)

    def extract(threaded: bool) -> Callable[[], None]:
        def run() -> None:
            with tempfile.TemporaryDirectory() as folder:
                unit = FeatureUnit("test", "bench", Path(folder) / "split", "bench", "test", {})
                layout = Layout(len(split.index), args.batch, SHARD_ROWS, world_size=1)
                with open_share(unit, layout, SINGLE, {}, lambda reports: {}) as share:
                    with BackgroundAppender(share.append, threaded=threaded) as sink:
                        loader = backbone.loader(split, args.batch, workers=args.workers,
                                                 pin_memory=pin)  # fmt: skip
                        forward_into(sink, backbone, share.batches(loader))

        return run

    used = shard_sink(print, args.device).threaded
    runs = {
        "forward (reference)": case.forward,
        "loader alone": loader_alone,
        "loader, first batch": first_batch,
        "extract_batch": extract_batches,
        "loader + extract_batch, nothing stored": no_store,
        "extract, writer inline" + ("" if used else " (etn)"): extract(threaded=False),
        "extract, writer thread" + (" (etn)" if used else ""): extract(threaded=True),
    }
    n = len(split.index)
    print(case.title)
    print(f"| step | seconds | {case.unit}/s | × forward |" + (" peak GiB |" if pin else ""))
    print("|---|---:|---:|---:|" + ("---:|" if pin else ""))
    reference = None
    for name, run in runs.items():
        if pin:
            torch.cuda.reset_peak_memory_stats()
        seconds = timed(run, device, args.repeats)
        reference = reference or seconds
        peak = f" {torch.cuda.max_memory_allocated() / 2**30:.1f} |" if pin else ""
        print(f"| {name} | {seconds:.3f} | {n / seconds:.0f} | {seconds / reference:.2f} |{peak}")


def compare_precision(case: Case, args: argparse.Namespace) -> None:
    """Print how far the ``args.dtype`` extraction of the first batches is from float32's."""
    batches = case.batches[: args.compare_batches]
    half = [case.backbone.extract_batch(x)[:2] for x in batches]
    twin = case.float32_twin()
    full = [twin.extract_batch(x)[:2] for x in batches]
    del twin
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    def rows(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.cat([h[i] for h in half]).double(), torch.cat([f[i] for f in full]).double())

    n = sum(len(h[0]) for h in half)
    print(f"\n{args.dtype} against float32 with the same weights, {n} {case.unit}")
    print("| output | median rel. error | largest rel. error | largest abs. difference |")
    print("|---|---:|---:|---:|")
    for i, name in enumerate(("hidden state", "logits")):
        low, ref = rows(i)
        error = (low - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-12)  # (N,)
        print(f"| {name} | {error.median():.2e} | {error.max():.2e} | "
              f"{(low - ref).abs().max():.3g} |")  # fmt: skip
    low, ref = rows(1)
    agree = (low.argmax(1) == ref.argmax(1)).double().mean()
    print(f"predicted class agrees on {100 * agree:.2f}% of the {n} {case.unit}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default="torchvision", choices=["torchvision", "llm"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    vision = parser.add_argument_group("torchvision")
    vision.add_argument("--model", default="resnet18")
    vision.add_argument("--image-size", type=int, default=64)
    llm = parser.add_argument_group("llm (defaults: Llama-3.1-8B's shape)")
    shape = LlamaShape()
    llm.add_argument("--layers", type=int, default=shape.layers)
    llm.add_argument("--hidden", type=int, default=shape.hidden)
    llm.add_argument("--intermediate", type=int, default=shape.intermediate)
    llm.add_argument("--heads", type=int, default=shape.heads)
    llm.add_argument("--kv-heads", type=int, default=shape.kv_heads)
    llm.add_argument("--vocab", type=int, default=shape.vocab)
    llm.add_argument("--prompt-tokens", type=int, default=512)
    llm.add_argument(
        "--capture-layers",
        default="none",
        choices=["none", "all"],
        help="also store every decoder layer at the last token (layers = ['all'], for dmm)",
    )
    parser.add_argument(
        "--compare-batches",
        type=int,
        default=4,
        help="batches compared with a float32 twin when --dtype is half precision (0: none)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="etn-bench-") as scratch:
        case = (llm_case if args.backbone == "llm" else torchvision_case)(args, Path(scratch))
        measure(case, args)
        if args.dtype != "float32" and args.compare_batches > 0:
            compare_precision(case, args)


if __name__ == "__main__":
    main()
