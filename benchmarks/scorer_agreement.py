"""Every post-hoc scorer beside pytorch-ood's detector of the same name on real features: the
digits pipeline's cache (``etn run pipelines/digits.toml -d DIR`` first), the scores that
``docs/scorers.md`` quotes.

Each scorer is fitted as the pipeline fits it (ID statistics on ``digits:train``, the others on
``digits:adapt``) with its defaults, and pytorch-ood's detector with the same settings on the
same arrays; both score the ID test digits and each OOD set (unseen digits 7-9, noisy digits).
Printed per scorer, the largest difference over the two OOD sets of AUROC and of FPR95 (points,
as the report computes them), and the smallest Spearman rank correlation of the two scores.
pytorch-ood returns outlier scores (higher = OOD); ours are oriented by each score's
direction. pytorch-ood has no Residual, Mahalanobis++ or DDU, and its VRA is another method.

    python benchmarks/scorer_agreement.py DIR
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from etn_cli.heads import heads
from etn_cli.heads.scorers.base import Scorer
from etn_cli.metrics.ranking import ranking_values
from etn_cli.metrics.scores import id_score
from etn_cli.store.artefacts.classifier import load_classifier
from etn_cli.store.reading.reader import read_split

OOD = ("digits_unseen.test", "digits_noise.test")
OOD_FIT = ("digits.train", "digits.adapt")  # ID statistics / everything else


def splits(data: Path) -> dict[str, object]:
    """The digits backbone's cached splits and its classifier (weight, bias)."""
    (root,) = (data / "features").glob("digits_cnn-*")
    found = {}
    for name in ("digits.train", "digits.adapt", "digits.test", *OOD):
        (folder,) = [p for p in root.glob(f"{name}-*") if p.is_dir()]
        found[name] = read_split(folder)
    weight, bias = load_classifier(root / "classifier.safetensors")
    found["classifier"] = {"weight": torch.as_tensor(weight), "bias": torch.as_tensor(bias)}
    return found


def peers(fit: object, clf: dict) -> dict[str, tuple[Callable, str]]:
    """pytorch-ood's detector of each name with our defaults, fitted: (detector, input)."""
    from pytorch_ood import detector as d

    from etn_cli.heads.scorers.subspace import principal_dim

    h, z, y = (torch.as_tensor(a) for a in (fit.hidden, fit.logits, fit.labels))
    dim, classes = h.shape[1], z.shape[1]
    linear = torch.nn.Linear(dim, classes)
    with torch.no_grad():
        linear.weight.copy_(clf["weight"])
        linear.bias.copy_(clf["bias"])

    def head(x: torch.Tensor) -> torch.Tensor:
        return linear(x.flatten(1))

    def config(name: str):
        return heads.get(name)().config

    maps = h[:, :, None, None]
    gen = config("gen")
    return {
        "map": (lambda: d.MaxSoftmax(None), "logits"),
        "energy": (lambda: d.EnergyBased(None, t=config("energy").temperature), "logits"),
        "max_logit": (lambda: d.MaxLogit(None), "logits"),
        "entropy": (lambda: d.Entropy(None), "logits"),
        "gen": (lambda: d.GEN(None, gamma=gen.gamma, M=min(gen.top_m, classes)), "logits"),
        "kl_matching": (lambda: d.KLMatching(None).fit_logits(z, y), "logits"),
        "temperature": (lambda: d.TemperatureScaling(None).fit_logits(z, y), "logits"),
        "react": (lambda: d.ReAct(None, head, percentile=config("react").percentile / 100)
                  .fit_feature_maps(maps, y), "maps"),
        **{f"ash_{v}": (lambda v=v: d.ASH(None, head, f"ash-{v}",
                                          config(f"ash_{v}").percentile / 100), "maps")
           for v in "pbs"},
        "scale": (lambda: d.SCALE(None, head, config("scale").percentile / 100), "maps"),
        "dice": (lambda: d.DICE(None, clf["weight"], clf["bias"], config("dice").sparsity / 100)
                 .fit_features(h, y), "features"),
        "knn": (lambda: d.KNN(None, k=config("knn").k).fit_features(h, y), "features"),
        "nnguide": (lambda: d.NNGuide(None, linear, k=config("nnguide").k).fit_features(h, y),
                    "features"),
        "vim": (lambda: d.ViM(None, principal_dim(config("vim").dim, dim), clf["weight"],
                              clf["bias"]).fit_features(h, y), "features"),
        "mahalanobis": (lambda: d.Mahalanobis(None).fit_features(h, y), "features"),
        "rmds": (lambda: d.RMD(None).fit_features(h, y), "features"),
        "she": (lambda: d.SHE(None, linear).fit_features(h, y), "features"),
        "fdbd": (lambda: d.fDBD(None, linear).fit_features(h, y), "features"),
        "gradnorm": (lambda: d.GradNorm(linear, param_filter=lambda n: n == "weight",
                                        temperature=config("gradnorm").temperature), "model"),
    }  # fmt: skip


def theirs(detector: object, kind: str, rows: object) -> np.ndarray:
    h, z = torch.as_tensor(rows.hidden), torch.as_tensor(rows.logits)
    with torch.no_grad():
        if kind == "logits":
            outlier = detector.predict_logits(z)
        elif kind == "maps":
            outlier = detector.predict_feature_maps(h[:, :, None, None])
        elif kind == "model":
            outlier = detector.predict(h)
        else:
            outlier = detector.predict_features(h)
    return -outlier.detach().double().numpy()  # higher = more ID


def fit_split(name: str) -> str:
    return "digits.train" if heads.get(name).needs_id_statistics else "digits.adapt"


def agreement(name: str, found: dict, tables: dict) -> str:
    """One Markdown row: our AUROC on each OOD set, and the largest differences from
    pytorch-ood's detector (when it has one)."""
    fit, test = found[fit_split(name)], found["digits.test"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = heads.get(name)().fit(
            fit.hidden, fit.logits, fit.labels, classifier=found["classifier"]
        )
    make, kind = tables[fit_split(name)].get(name, (None, None))
    detector = make() if make else None
    mine_id = id_score(head.own_score, head.score(test.hidden, test.logits))
    cells, auroc, fpr, rho = [], 0.0, 0.0, 1.0
    for ood in OOD:
        rows = found[ood]
        mine = np.r_[mine_id, id_score(head.own_score, head.score(rows.hidden, rows.logits))]
        labels = np.r_[np.ones(len(mine_id)), np.zeros(len(rows.logits))]
        values = ranking_values(labels, mine)
        cells.append(f"{values['auroc'] * 100:.2f}")
        if detector is None:
            continue
        other = np.r_[theirs(detector, kind, test), theirs(detector, kind, rows)]
        peer_values = ranking_values(labels, other)
        auroc = max(auroc, abs(values["auroc"] - peer_values["auroc"]) * 100)
        fpr = max(fpr, abs(values["fpr95"] - peer_values["fpr95"]) * 100)
        rho = min(rho, spearmanr(mine, other).statistic)
    if detector is None:
        return f"| {name} | {' / '.join(cells)} | – | – | – |"
    return f"| {name} | {' / '.join(cells)} | {auroc:.2f} | {fpr:.2f} | {rho:.6f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the data directory of the digits pipeline")
    args = parser.parse_args()
    found = splits(args.data)
    tables = {split: peers(found[split], found["classifier"]) for split in OOD_FIT}
    names = ["map", "energy", "mahalanobis"]
    names += [n for n in heads.names() if issubclass(heads.get(n), Scorer)]
    print("| scorer | AUROC unseen / noise | max Δ AUROC | max Δ FPR95 | min Spearman |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        print(agreement(name, found, tables), flush=True)


if __name__ == "__main__":
    main()
