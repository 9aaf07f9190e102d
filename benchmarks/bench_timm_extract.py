"""What does extracting a timm ViT-B/16 through etn cost per image on the CPU, beside the pure
forward pass of the same model?

Method: ``vit_base_patch16_224`` with random weights (``weights = "none"``, 1000 classes),
``--images`` random 256 x 256 RGB images. etn: the ``timm`` backbone's own loader (timm's
eval transform, resize 248 + centre crop 224, uint8) and ``extract_batch`` (normalisation, the
hooked forward pass, the logits check), batches of ``--batch``. Reference in the same run:
``model(x)`` under ``torch.inference_mode`` on the same batches, preprocessed beforehand.
Best of ``--repeats``, the two alternating, so a busy machine slows both alike.

    python benchmarks/bench_timm_extract.py [--images 32] [--batch 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image


class Images(torch.utils.data.Dataset):
    def __init__(self, count: int) -> None:
        rng = np.random.default_rng(0)
        self.images = [
            Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8))
            for _ in range(count)
        ]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from etn_cli.backbones.settings import TimmConfig
    from etn_cli.backbones.timm_model import TimmBackbone
    from etn_cli.datasets.base import Split

    config = TimmConfig(model="vit_base_patch16_224", weights="none")
    backbone = TimmBackbone(config, Path(tempfile.mkdtemp(prefix="bb-bench-")))
    data = Images(args.images)
    split = Split("bench", "test", data, np.arange(len(data)), num_classes=1000)
    model = backbone.model
    batches = [backbone.prepare(x) for x, _, _ in backbone.loader(split, args.batch)]

    def through_etn() -> None:
        for pixels, _, _ in backbone.loader(split, args.batch):
            backbone.extract_batch(pixels)

    def forward_only() -> None:
        with torch.inference_mode():
            for x in batches:
                model(x)

    times: dict[str, list[float]] = {"etn": [], "forward": []}
    for _ in range(args.repeats):
        for name, work in (("forward", forward_only), ("etn", through_etn)):
            start = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - start)
    best = {name: min(values) / args.images for name, values in times.items()}
    print(f"vit_base_patch16_224, 224x224, {args.images} images, batch {args.batch}, "
          f"{torch.get_num_threads()} threads, best of {args.repeats}")  # fmt: skip
    print(f"pure forward pass:        {best['forward'] * 1e3:8.1f} ms/image")
    print(f"etn extract_batch + load: {best['etn'] * 1e3:8.1f} ms/image")
    print(f"ratio etn / forward:      {best['etn'] / best['forward']:8.2f}x")


if __name__ == "__main__":
    main()
