"""Fit + score time of every post-hoc scorer at ImageNet scale, beside one float32 matrix
product of the same sizes and, where pytorch-ood has the detector, pytorch-ood on the same
arrays; and exact nearest neighbours by blocked torch products against faiss-cpu.

Method: synthetic ResNet-50-shaped features (D = 2,048, C = 1,000, class-dependent means, a
fixed linear classifier handed to the scorers that need one): ``--fit-rows`` ID rows (default
128,000, 10% of ImageNet's training set, OpenOOD's and the KNN paper's practice) for the ID
statistics, ``--test-rows`` test rows scored (default 50,000, ImageNet's validation set, as the
issue asks). Each scorer is fitted once with its defaults and asked
for its own score only (``Scorer.score``). References, measured in the same run:

* ``fit matmul``: ``X_fit^T X_fit`` (fit_rows x D x D), one pass of second moments over the
  ID features, the floor of every Gaussian or subspace scorer;
* ``test x fit matmul``: ``X_test X_fit^T`` (test_rows x fit_rows x D), the floor of any exact
  nearest-neighbour search (KNN, NNGuide); measured only when one of them runs.

pytorch-ood's detectors get the same tensors; ones that cannot run at this size (DICE builds
an (N, C, D) tensor: 82 GB here; Mahalanobis and RMD loop over 1,000 classes with a D x D
product each; KNN through scikit-learn) predict only the first 100 or 1,000 test rows, and
their predict time is scaled up by test_rows / rows, which the table marks. ``--faiss`` adds
faiss-cpu's exact search beside the blocked torch one.

    python benchmarks/bench_scorers.py [--fit-rows 128000] [--test-rows 50000]
        [--scorers knn vim ...] [--no-peers] [--faiss]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from etn_cli.errors import EtnError
from etn_cli.heads import heads
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.neighbours import normalise, top_inner_products

TEST_ROWS, DIM, CLASSES = 50_000, 2048, 1000


def features(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden (N, D) float32 >= 0 (post-ReLU, as ResNet's pooled features), logits, labels."""
    means = torch.from_numpy(np.random.default_rng(0).gamma(2.0, 0.25, (CLASSES, DIM))).float()
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (rows,), generator=generator)
    hidden = (means[labels] + 0.3 * torch.randn(rows, DIM, generator=generator)).clamp_min(0)
    return hidden, hidden @ classifier()["weight"].T + classifier()["bias"], labels


def classifier() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    means = torch.from_numpy(np.random.default_rng(0).gamma(2.0, 0.25, (CLASSES, DIM))).float()
    weight = means - means.mean(0) + 0.01 * torch.randn(CLASSES, DIM, generator=generator)
    return {"weight": weight, "bias": torch.zeros(CLASSES)}


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def peers(fit: tuple, test: tuple, clf: dict) -> dict[str, Callable[[], tuple[float, int]]]:
    """pytorch-ood's detector of the same name: a function returning (fit + predict seconds
    for TEST_ROWS test rows, and the factor its predict time was scaled by: 1 unless it ran on
    fewer rows)."""
    from pytorch_ood import detector as d

    (h, z, y), (ht, zt, _) = fit, test
    linear = torch.nn.Linear(DIM, CLASSES)
    with torch.no_grad():
        linear.weight.copy_(clf["weight"])
        linear.bias.copy_(clf["bias"])
    maps = ht[:, :, None, None]

    def head(x: torch.Tensor) -> torch.Tensor:
        return linear(x.flatten(1))

    def fitted(make: Callable, predict: str, rows: int = TEST_ROWS) -> Callable:
        def run() -> tuple[float, int]:
            with torch.no_grad():
                data = (
                    maps[:rows]
                    if predict == "predict_feature_maps"
                    else (zt[:rows] if predict == "predict_logits" else ht[:rows])
                )
                started = time.perf_counter()
                det = make()
                fit_s = time.perf_counter() - started
                predict_s = timed(lambda: getattr(det, predict)(data))
                # fit once, predict time scaled to all test rows where it ran on fewer
                return fit_s + predict_s * TEST_ROWS / rows, TEST_ROWS // rows

        return run  # fmt: skip

    few = 1000
    return {
        "max_logit": fitted(lambda: d.MaxLogit(None), "predict_logits"),
        "entropy": fitted(lambda: d.Entropy(None), "predict_logits"),
        "gen": fitted(lambda: d.GEN(None, M=100), "predict_logits"),
        "kl_matching": fitted(lambda: d.KLMatching(None).fit_logits(z, y), "predict_logits"),
        "temperature": fitted(
            lambda: d.TemperatureScaling(None).fit_logits(z, y), "predict_logits"
        ),
        "map": fitted(lambda: d.MaxSoftmax(None), "predict_logits"),
        "energy": fitted(lambda: d.EnergyBased(None), "predict_logits"),
        "react": fitted(lambda: d.ReAct(None, head).fit_feature_maps(h, y), "predict_feature_maps"),
        "ash_s": fitted(lambda: d.ASH(None, head, "ash-s", 0.9), "predict_feature_maps"),
        "scale": fitted(lambda: d.SCALE(None, head, 0.85), "predict_feature_maps"),
        "dice": fitted(lambda: d.DICE(None, clf["weight"], clf["bias"], 0.9).fit_features(h, y),
                       "predict_features", rows=100),
        "knn": fitted(lambda: d.KNN(None, k=50).fit_features(h, y), "predict_features", few),
        "nnguide": fitted(lambda: d.NNGuide(None, linear, k=100).fit_features(h, y),
                          "predict_features"),
        "vim": fitted(lambda: d.ViM(None, 1000, clf["weight"], clf["bias"]).fit_features(h, y),
                      "predict_features"),
        "mahalanobis": fitted(lambda: d.Mahalanobis(None).fit_features(h, y),
                              "predict_features", few),
        "rmds": fitted(lambda: d.RMD(None).fit_features(h, y), "predict_features", few),
        "she": fitted(lambda: d.SHE(None, linear).fit_features(h, y), "predict_features"),
        "fdbd": fitted(lambda: d.fDBD(None, linear).fit_features(h, y), "predict_features"),
    }  # fmt: skip


def faiss_against_torch(bank: torch.Tensor, queries: torch.Tensor, k: int) -> None:
    """Exact inner-product top-k of unit rows: faiss-cpu's IndexFlatIP, then blocked torch."""
    bank, queries = normalise(bank), normalise(queries)
    ours = timed(lambda: top_inner_products(queries, bank, k))
    try:
        import faiss
    except ImportError:
        print(f"knn search: torch blocked {ours:.1f} s; faiss-cpu not installed")
        return
    faiss.omp_set_num_threads(torch.get_num_threads())
    index = faiss.IndexFlatIP(DIM)
    seconds = timed(lambda: (index.add(bank.numpy()), index.search(queries.numpy(), k)))
    print(
        f"knn search (k = {k}): torch blocked {ours:.1f} s, faiss-cpu IndexFlatIP {seconds:.1f} s"
    )


def time_scorer(name: str, fit: tuple, test: tuple, clf: dict) -> tuple[float, float] | str:
    """Fit and own-score seconds of one scorer, or its refusal."""
    head = heads.get(name)()
    try:
        fit_s = timed(lambda: head.fit(fit[0], fit[1], fit[2], classifier=clf))
    except EtnError as refusal:
        return f"refused: {refusal}"
    return fit_s, timed(lambda: head.score(test[0], test[1]))


def run(
    fit_rows: int,
    names: list[str],
    with_peers: bool = True,
    test_rows: int = TEST_ROWS,
    with_faiss: bool = False,
) -> None:
    """Print the table (see the module docstring)."""
    global TEST_ROWS
    TEST_ROWS = test_rows
    fit, test, clf = features(fit_rows, 0), features(TEST_ROWS, 1), classifier()
    fit_ref = timed(lambda: fit[0].T @ fit[0])
    threads = torch.get_num_threads()
    print(f"fit {fit_rows} x {DIM}, test {TEST_ROWS}, C = {CLASSES}, threads {threads}")
    print(f"reference: fit matmul {fit_ref:.1f} s", flush=True)
    if {"knn", "nnguide"} & set(names) or with_faiss:
        blocks = range(0, fit_rows, 16384)
        knn_ref = timed(lambda: [test[0] @ fit[0][i : i + 16384].T for i in blocks])
        print(f"reference: test x fit matmul {knn_ref:.1f} s", flush=True)
    peer = peers(fit, test, clf) if with_peers else {}
    columns = ("fit s", "score s", "total s", "x fit mm", "pytorch-ood s")
    print(f"{'scorer':<15} " + " ".join(f"{c:>9}" for c in columns))
    for name in names:
        timing = time_scorer(name, fit, test, clf)
        if isinstance(timing, str):
            print(f"{name:<15} {timing}")
            continue
        fit_s, score_s = timing
        theirs = ""
        if name in peer:
            seconds, factor = peer[name]()
            theirs = f"{seconds:.1f}" + (f" (x{factor})" if factor > 1 else "")
        total = fit_s + score_s
        cells = (f"{fit_s:.1f}", f"{score_s:.1f}", f"{total:.1f}", f"{total / fit_ref:.1f}", theirs)
        print(f"{name:<15} " + " ".join(f"{c:>9}" for c in cells), flush=True)
    if with_faiss:
        faiss_against_torch(fit[0], test[0], 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    scorers = [n for n in heads.names() if issubclass(heads.get(n), Scorer)]
    parser.add_argument("--scorers", nargs="*", default=["map", "energy", "mahalanobis", *scorers])
    parser.add_argument("--fit-rows", type=int, default=128_000)
    parser.add_argument("--test-rows", type=int, default=TEST_ROWS)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--faiss", action="store_true")
    args = parser.parse_args()
    run(args.fit_rows, args.scorers, not args.no_peers, args.test_rows, args.faiss)


if __name__ == "__main__":
    main()
