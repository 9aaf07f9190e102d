"""How far from its own optimum does each trained head stop (issue 17.2)?

Each gradient-trained head is fitted twice on the digits default's adaptation split, both times
keeping its lowest-loss epoch (``select = "loss"``, so the figure is the loss the training
reached, not the one a selection rule preferred): with its defaults (the paper's epochs and
learning rate, as ``pipelines/digits.toml`` sets them) and with ``--longer`` times the epochs.
The reference is the longer run's loss; static scaling also gets the direct optimum of its
loss over the scale (a dense grid over ``log a`` at ``b = b_init``). The gap is
``(loss - reference) / |reference|``: a head far above 0 stops short of its optimum. The loss is
each head's own per-epoch mean adaptation loss.

    etn run pipelines/digits.toml -d DATA --only map      # once: extracts the features
    python benchmarks/optimum_gap.py -d DATA [--longer 10] [--heads static etn ...]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from etn_cli.heads import heads
from etn_cli.heads.edl import dirichlet_kl_to_target, evidence
from etn_cli.store.reading.reader import read_split

# the digits default's settings of each head (pipelines/digits.toml)
DIGITS = {
    "etn": {}, "static": {"lr": 1e-3}, "map_edl": {}, "adats": {}, "ib_edl": {},
    "ensemble": {"members": 2}, "sngp": {}, "dmm": {"epochs": 100, "batch_size": 64},
}  # fmt: skip


def lowest_loss(head_name: str, settings: dict, features, classifier) -> float:
    head = heads.get(head_name)(**settings, select="loss")
    head.fit(
        features.hidden, features.logits, features.labels, classifier=classifier,
        layers=features.layers,
    )  # fmt: skip
    kept = head.selection_
    return min(k["loss"] for k in kept) if isinstance(kept, list) else kept["loss"]


def static_line_search(features, b: float = 1.0, nu: float = 1e4) -> tuple[float, float]:
    z = torch.from_numpy(features.logits).double()
    y = torch.from_numpy(features.labels)
    grid = np.arange(-6.0, 17.0, 0.005)
    losses = [
        float(dirichlet_kl_to_target(evidence(math.exp(s) * z, torch.tensor(b)), y, nu).mean())
        for s in grid
    ]
    best = int(np.argmin(losses))
    return float(np.exp(grid[best])), losses[best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-d", "--data-dir", type=Path, required=True)
    parser.add_argument("--longer", type=int, default=10, help="epochs factor of the reference")
    parser.add_argument("--heads", nargs="*", default=list(DIGITS))
    args = parser.parse_args()
    backbone = next((args.data_dir / "features").glob("digits_cnn-*"))
    features = read_split(next(backbone.glob("digits.adapt-*[!k]")))
    classifier = load_file(backbone / "classifier.safetensors")
    print(f"digits adapt split: {len(features.labels)} rows; reference: {args.longer}x epochs")
    print(f"{'head':<10} {'epochs':>6} {'loss':>12} {'longer run':>12} {'gap':>8}")
    for name in args.heads:
        settings = DIGITS[name]
        epochs = settings.get("epochs", heads.get(name).Config().epochs)
        default = lowest_loss(name, settings, features, classifier)
        longer = settings | {"epochs": epochs * args.longer}
        reference = lowest_loss(name, longer, features, classifier)
        gap = (default - reference) / abs(reference)
        print(f"{name:<10} {epochs:>6} {default:>12.4f} {reference:>12.4f} {gap:>8.1%}")
        if name == "static":
            scale, optimum = static_line_search(features)
            fixed = lowest_loss(name, settings | {"init": "fixed"}, features, classifier)
            print(f"  line search over log a: scale {scale:.1f}, loss {optimum:.4f}; "
                  f"from a_init = 1 (init = 'fixed'): loss {fixed:.4f} "
                  f"({(fixed - optimum) / optimum:.1%} above)")  # fmt: skip


if __name__ == "__main__":
    main()
