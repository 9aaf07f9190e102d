"""Why does ETN trail the plain softmax at OOD detection on the digits default?

On ``pipelines/digits.toml`` ETN's OOD AUPR of max probability (MP) trails the backbone's own
softmax on the unseen digits and on noise. Two leads, each tested here on the cached digits
features with the pipeline's own ETN settings, 3 seeds, AUPR in % (ID test = positives):

1. **Offset.** ``softmax(z + c) = softmax(z)`` for any constant ``c``; ETN's
   ``alpha = softplus(a (z + c)) + b`` is not. Table A trains and scores ETN on ``z + c``.
2. **Margin.** Where ``a z`` is large, ``softplus(a z) ~ a z``: the Dirichlet mean is then a
   ratio of the positive logits, ``p_i ~ z_i / sum_j max(z_j, 0)``, which does not change when
   every logit is multiplied by the same factor, whereas the softmax sharpens with the margin.
   Table B measures how far ETN's MP follows that ratio (Spearman's rho with the ratio and with
   the softmax MP), the share of ``a z`` in the linear range (``a z > 3``), and the ratio's own
   AUPR.
3. **References and a fitted offset.** Shifting each sample's logits by its own constant
   leaves the softmax (and ETN's predicted class) unchanged but fixes where the softplus acts.
   Table C compares ``z - max(z) + r`` (``r`` the mean top logit of the adaptation split, so a
   sample's evidence scale comes from ``a(h)`` alone and its shape from its margins), the same with
   ``r = 0``, and ``z - mean(z)`` (centring: removes the offset, keeps the ratio form); and
   ``etn_offset``, ETN with one offset fitted on its own adaptation loss
   (:mod:`etn_cli.heads.etn_offset`). Table D checks that the fitted offset absorbs any
   constant shift of the logits.

    python studies/when_etn_helps.py [--data-dir data] [--seeds 0 1 2]

It extracts the digits features first if they are not cached (about 20 s), then fits
3 x 16 ETN heads (about 5 minutes on 2 CPU cores) and prints four Markdown tables.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.special import softmax
from scipy.stats import spearmanr

from etn_cli.heads import heads
from etn_cli.heads.etn_offset import OffsetETN
from etn_cli.metrics.evaluation import ood_metrics
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.plan import make_plan
from etn_cli.stages.extract import extract
from etn_cli.store.reading.reader import read_split

ROOT = Path(__file__).resolve().parent.parent
Shift = Callable[[np.ndarray], np.ndarray]


def load(data_dir: Path) -> tuple[dict, dict]:
    """The digits splits as ``name -> (hidden, logits, labels)`` and the ETN settings of
    ``pipelines/digits.toml``."""
    pipeline = load_pipeline(ROOT / "pipelines" / "digits.toml")
    plan = make_plan(pipeline, data_dir)
    extract(plan)
    units = {"adapt": plan.adapt, "test": plan.test} | {u.name: u for u in plan.ood}
    splits = {}
    for name, unit in units.items():
        f = read_split(unit.path)
        splits[name] = (f.hidden, f.logits.astype(np.float64), f.labels)
    [spec] = [s for s in pipeline.heads if s.name == "etn" and "calibrate" not in s.settings]
    return splits, dict(spec.settings)


def aupr(id_scores: dict, ood_scores: dict, score: str) -> float:
    values = ood_metrics({score: id_scores[score]}, {score: ood_scores[score]})
    return 100 * next(m.value for m in values if m.metric == "aupr")


def ood_row(score_of: Callable[[str], dict], score: str = "mp") -> list[float]:
    """AUPR of ``score`` on each OOD set and their mean."""
    test = score_of("test")
    sets = [aupr(test, score_of(name), score) for name in ("digits_unseen", "digits_noise")]
    return [*sets, float(np.mean(sets))]


FITTED: dict = {}  # (shift name, seed) -> head: the plain ETN is fitted once per seed


def fit_etn(splits: dict, settings: dict, seed: int, shift: Shift, name: str):
    """The paper's ETN fitted on ``shift(z)``; ``name`` starting with ``offset`` fits the
    ``etn_offset`` variant instead."""
    if (name, seed) not in FITTED:
        hidden, logits, labels = splits["adapt"]
        head = heads.get("etn_offset" if name.startswith("offset") else "etn")(
            **settings, seed=seed
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            FITTED[name, seed] = head.fit(hidden, shift(logits), labels)
    return FITTED[name, seed]


def etn_rows(splits: dict, settings: dict, seeds: list[int], shift: Shift, name: str) -> np.ndarray:
    """Per seed: AUPR(MP) on each OOD set and their mean, the mean AUPR(MI) and the mean
    adaptation loss (S, 5)."""
    rows = []
    for seed in seeds:
        head = fit_etn(splits, settings, seed, shift, name)
        scores = {n: head.predict(h, shift(z)).scores for n, (h, z, _) in splits.items()}
        loss = adaptation_loss(head, splits["adapt"], shift)
        rows.append(ood_row(scores.get) + [ood_row(scores.get, "mi")[-1], loss])
    return np.asarray(rows)


def adaptation_loss(head, adapt: tuple, shift: Shift) -> float:
    """ETN's loss (paper Eq. 8) averaged over the adaptation split, on the logits the head
    predicts on (its fitted offset included), with the MC draws fixed by the seed."""
    import torch

    h, z, y = adapt
    z = torch.as_tensor(shift(z) + getattr(head, "offset_", 0.0), dtype=torch.float32)
    return OffsetETN._mean_loss(head, torch.as_tensor(h), z, torch.as_tensor(y))


def softmax_row(splits: dict) -> list[float]:
    mp = {n: {"mp": softmax(z, axis=1).max(axis=1)} for n, (_, z, _) in splits.items()}
    return ood_row(mp.get)


def ratio_score(z: np.ndarray) -> np.ndarray:
    """``max_i z_i / sum_j max(z_j, 0)``: the Dirichlet mean's max where softplus is linear."""
    positive = np.maximum(z, 0.0)
    return positive.max(axis=1) / np.maximum(positive.sum(axis=1), 1e-12)


def margin_table(splits: dict, settings: dict, seeds: list[int]) -> list[str]:
    rows = []
    for seed in seeds:
        head = fit_etn(splits, settings, seed, lambda z: z, "z")
        h, z, _ = (np.concatenate([splits[n][i] for n in splits if n != "adapt"]) for i in range(3))
        mp = head.predict(h, z).scores["mp"]
        shape, rate = (t.detach().double().numpy()[:, 0] for t in head.net_(_tensor(h)))
        az = (shape / rate)[:, None] * z  # (N, C) at the mean of a
        rho_ratio = spearmanr(mp, ratio_score(z)).statistic
        rho_softmax = spearmanr(mp, softmax(z, axis=1).max(axis=1)).statistic
        rows.append([rho_ratio, rho_softmax, 100 * (az > 3).mean(), float(np.median(shape / rate))])
    mean = np.mean(rows, axis=0)
    ratio = {n: {"mp": ratio_score(z)} for n, (_, z, _) in splits.items()}
    ratio_aupr = ood_row(ratio.get)
    return [
        "| Spearman rho(ETN MP, ratio) | rho(ETN MP, softmax MP) | a·z > 3 (%) | median E[a] "
        "| ratio AUPR unseen | noise | mean |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        "| "
        + " | ".join(f"{v:.3f}" for v in mean[:2])
        + f" | {mean[2]:.1f} | {mean[3]:.2f} | "
        + " | ".join(f"{v:.2f}" for v in ratio_aupr)
        + " |",
    ]


def _tensor(h: np.ndarray):
    import torch

    return torch.as_tensor(h, dtype=torch.float32)


def fmt(rows: np.ndarray) -> str:
    """``mean ± 95% half-width`` per column over seeds (t with n - 1 degrees of freedom)."""
    from scipy.stats import t

    mean = rows.mean(axis=0)
    half = t.ppf(0.975, len(rows) - 1) * rows.std(axis=0, ddof=1) / np.sqrt(len(rows))
    return " | ".join(f"{m:.2f} ± {h:.2f}" for m, h in zip(mean, half, strict=True))


HEADER = (
    "| logits | AUPR(MP) unseen | noise | OOD mean | OOD mean AUPR(MI) | adaptation loss |\n"
    "|---|---:|---:|---:|---:|---:|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    splits, settings = load(args.data_dir.resolve())
    seeds = args.seeds
    softmax_cells = " | ".join(f"{v:.2f}" for v in softmax_row(splits))
    print(f"ETN settings from pipelines/digits.toml: {settings}\n")
    print("A. ETN on shifted logits z + c (the softmax is the same for every c)\n")
    print(HEADER)
    print(f"| softmax (MAP), any c | {softmax_cells} | – | – |")
    for c in (-6.0, -3.0, 0.0, 3.0, 6.0):
        shift, name = (lambda z, c=c: z + c), "z" if c == 0 else f"z{c:+g}"
        print(f"| ETN, c = {c:+g} | {fmt(etn_rows(splits, settings, seeds, shift, name))} |")
    print("\nB. How far ETN's MP follows the positive-logit ratio (test + OOD rows)\n")
    print("\n".join(margin_table(splits, settings, seeds)))
    reference = float(splits["adapt"][1].max(axis=1).mean())
    shifts: dict[str, Shift] = {
        "z": lambda z: z,
        f"z - max(z) + r, r = {reference:.2f}": lambda z: (
            z - z.max(axis=1, keepdims=True) + reference
        ),
        "z - max(z)": lambda z: z - z.max(axis=1, keepdims=True),
        "z - mean(z)": lambda z: z - z.mean(axis=1, keepdims=True),
    }
    print("\nC. References and a fitted offset (softmax and predicted class unchanged)\n")
    print(HEADER)
    print(f"| softmax (MAP) | {softmax_cells} | – | – |")
    for name, shift in shifts.items():
        print(f"| ETN on {name} | {fmt(etn_rows(splits, settings, seeds, shift, name))} |")
    offset_rows = etn_rows(splits, settings, seeds, lambda z: z, "offset")
    print(f"| ETN (fitted offset) on z | {fmt(offset_rows)} |")
    print("\nD. ETN (fitted offset) on z + c: the fitted offset absorbs c\n")
    print(HEADER.replace("| logits |", "| logits | fitted offset |").replace("|---|", "|---|---:|"))
    for c in (-6.0, 0.0, 6.0):
        shift, name = (lambda z, c=c: z + c), "offset" if c == 0 else f"offset{c:+g}"
        rows = etn_rows(splits, settings, seeds, shift, name)
        offsets = [FITTED[name, seed].offset_ for seed in seeds]
        print(f"| z {c:+g} | {np.mean(offsets):.3f} | {fmt(rows)} |")


if __name__ == "__main__":
    main()
