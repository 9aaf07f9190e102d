"""Fit + score time of every post-hoc scorer beside pytorch-ood's detector of the same name,
on the same arrays in the same process, at two shapes; and exact nearest neighbours by blocked
torch products against faiss-cpu.

Shapes (``--shape``), synthetic features with class-dependent means and a fixed linear
classifier handed to the scorers that need one; a fifth of the labels disagree with the
classifier (accuracy about 80%, ResNet-50's on ImageNet is 76%), so temperature scaling has a
finite optimum as on real data:

* ``small``: CIFAR-10 with a ResNet-18 (OpenOOD's CIFAR benchmark): 50,000 fit rows (the
  training set), 10,000 test rows, D = 512, C = 10.
* ``imagenet``: ResNet-50 on ImageNet: 128,000 fit rows (10% of the training set, OpenOOD's
  and the KNN paper's practice), 50,000 test rows (the validation set), D = 2,048, C = 1,000.

``--fit-rows`` / ``--test-rows`` shrink a shape for a quick look. Each scorer is fitted with
its defaults and asked for its own score only (``head.score``); pytorch-ood's detector gets the
same settings (k, percentiles, sparsity, d, ...) and the same tensors, fit + predict. The two
are timed alternately, ``--repeats`` times each (best of; 40 times when both take under half a
second, once when both take over a second and are 3x apart after the first round), in sweeps
over all the scorers, so that a burst of load from other processes costs each one round. The
reference is **one test x D x C product** (``X_test W^T``, best of the repeats): a scorer
"keeps up" when its time is at most pytorch-ood's plus twice that product (the noise floor of
the cheapest scorers, which read only the logits).

pytorch-ood's detectors that cannot run at ImageNet size (DICE builds an (N, C, D) tensor, 82
GB; Mahalanobis and RMD loop over the classes with a D x D product each; KNN goes through
scikit-learn; NNGuide compares every test row with 65,536 bank rows at once, 13 GB for 50,000
rows, which with its running top-k took this 24 GiB machine out of memory) predict only the
first 100 or 1,000 test rows there, their predict time scaled up to all test rows (marked
``xN``); they are timed once. pytorch-ood has no Residual,
Mahalanobis++ or DDU, and its VRA is a different method (per-unit quantiles): those rows show
our time alone.

``--conditions`` (issue 40) times each pair's fit and score separately instead, medians, with
torch and every native pool at 1 thread, at 2 threads, and at 2 threads beside ``--load``
processes spinning on the CPU (started and stopped here), and prints the ratios ours /
pytorch-ood of all three.

    python benchmarks/bench_scorers.py [--shape small|imagenet|both] [--repeats 3]
        [--fit-rows N] [--test-rows N] [--scorers knn vim ...] [--no-peers] [--faiss]
        [--conditions [--load 1]]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import threadpoolctl
import torch

from etn_cli.errors import EtnError
from etn_cli.heads import heads
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.neighbours import normalise, top_inner_products

WRONG = 0.2  # share of labels that disagree with the classifier
CLEAR = 3.0  # a pair of slow ones this far apart after one round is not repeated
CHEAP, CHEAP_ROUNDS = 0.5, 40  # seconds; rounds for pairs that both take less


@dataclass(frozen=True)
class Shape:
    fit_rows: int
    test_rows: int
    dim: int
    classes: int


SHAPES = {"small": Shape(50_000, 10_000, 512, 10), "imagenet": Shape(128_000, 50_000, 2048, 1000)}


def class_means(shape: Shape) -> torch.Tensor:
    rng = np.random.default_rng(0)
    return torch.from_numpy(rng.gamma(2.0, 0.25, (shape.classes, shape.dim))).float()


def classifier(shape: Shape) -> dict[str, torch.Tensor]:
    means = class_means(shape)
    noise = torch.randn(shape.classes, shape.dim, generator=torch.Generator().manual_seed(1))
    return {"weight": means - means.mean(0) + 0.01 * noise, "bias": torch.zeros(shape.classes)}


def features(shape: Shape, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    """hidden (N, D) float32 >= 0 (post-ReLU, as pooled ResNet features), logits, labels."""
    generator = torch.Generator().manual_seed(seed)
    centre = torch.randint(0, shape.classes, (rows,), generator=generator)
    noise = torch.randn(rows, shape.dim, generator=generator)
    hidden = (class_means(shape)[centre] + 0.3 * noise).clamp_min(0)
    clf = classifier(shape)
    logits = torch.addmm(clf["bias"], hidden, clf["weight"].T)
    wrong = torch.rand(rows, generator=generator) < WRONG
    shift = torch.randint(1, shape.classes, (rows,), generator=generator)
    labels = torch.where(wrong, (logits.argmax(1) + shift) % shape.classes, logits.argmax(1))
    return hidden, logits, labels


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def ours(name: str, fit: tuple, test: tuple, clf: dict) -> Callable[[], float]:
    def run() -> float:
        head = heads.get(name)()
        started = time.perf_counter()
        head.fit(fit[0], fit[1], fit[2], classifier=clf)
        head.score(test[0], test[1])
        return time.perf_counter() - started

    return run


def peers(shape: Shape, fit: tuple, test: tuple, clf: dict) -> dict[str, Callable]:
    """pytorch-ood's detector of each name, with our head's default settings: a function
    returning (fit + predict seconds for all test rows, the factor its predict time was scaled
    by: 1 unless it ran on fewer rows)."""
    from pytorch_ood import detector as d

    from etn_cli.heads.scorers.subspace import principal_dim

    (h, z, y), (ht, zt, _) = fit, test
    linear = torch.nn.Linear(shape.dim, shape.classes)
    with torch.no_grad():
        linear.weight.copy_(clf["weight"])
        linear.bias.copy_(clf["bias"])
    maps = ht[:, :, None, None]
    rows_all = len(ht)

    def config(name: str):
        return heads.get(name)().config

    def head(x: torch.Tensor) -> torch.Tensor:
        return linear(x.flatten(1))

    def fitted(make: Callable, predict: str, rows: int | None = None) -> Callable:
        rows = min(rows or rows_all, rows_all)
        data = {"predict_feature_maps": maps, "predict_logits": zt}.get(predict, ht)[:rows]

        def run(split: bool = False) -> tuple:
            with torch.no_grad():
                started = time.perf_counter()
                det = make()
                fit_s = time.perf_counter() - started
                predict_s = timed(lambda: getattr(det, predict)(data)) * rows_all / rows
            if split:
                return fit_s, predict_s, rows_all // rows
            return fit_s + predict_s, rows_all // rows

        return run

    few = 1000 if shape.classes > 100 else None  # the class loops and sklearn's KNN
    gen = config("gen")
    return {
        "map": fitted(lambda: d.MaxSoftmax(None), "predict_logits"),
        "energy": fitted(lambda: d.EnergyBased(None, t=config("energy").temperature),
                         "predict_logits"),
        "max_logit": fitted(lambda: d.MaxLogit(None), "predict_logits"),
        "entropy": fitted(lambda: d.Entropy(None), "predict_logits"),
        "gen": fitted(lambda: d.GEN(None, gamma=gen.gamma, M=min(gen.top_m, shape.classes)),
                      "predict_logits"),
        "kl_matching": fitted(lambda: d.KLMatching(None).fit_logits(z, y), "predict_logits"),
        "temperature": fitted(lambda: d.TemperatureScaling(None).fit_logits(z, y),
                              "predict_logits"),
        "react": fitted(lambda: d.ReAct(None, head, percentile=config("react").percentile / 100)
                        .fit_feature_maps(h[:, :, None, None], y), "predict_feature_maps"),
        **{
            f"ash_{v}": fitted(lambda v=v: d.ASH(None, head, f"ash-{v}",
                                                 config(f"ash_{v}").percentile / 100),
                               "predict_feature_maps")
            for v in "pbs"
        },
        "scale": fitted(lambda: d.SCALE(None, head, config("scale").percentile / 100),
                        "predict_feature_maps"),
        "dice": fitted(lambda: d.DICE(None, clf["weight"], clf["bias"],
                                      config("dice").sparsity / 100).fit_features(h, y),
                       "predict_features", 100 if shape.classes > 100 else None),
        "knn": fitted(lambda: d.KNN(None, k=config("knn").k).fit_features(h, y),
                      "predict_features", few),
        "nnguide": fitted(lambda: d.NNGuide(None, linear, k=config("nnguide").k)
                          .fit_features(h, y), "predict_features", few),
        "vim": fitted(lambda: d.ViM(None, principal_dim(config("vim").dim, shape.dim),
                                    clf["weight"], clf["bias"]).fit_features(h, y),
                      "predict_features"),
        "mahalanobis": fitted(lambda: d.Mahalanobis(None).fit_features(h, y),
                              "predict_features", few),
        "rmds": fitted(lambda: d.RMD(None).fit_features(h, y), "predict_features", few),
        "she": fitted(lambda: d.SHE(None, linear).fit_features(h, y), "predict_features"),
        "fdbd": fitted(lambda: d.fDBD(None, linear).fit_features(h, y), "predict_features"),
        "gradnorm": fitted(lambda: d.GradNorm(linear, param_filter=lambda n: n == "weight",
                                              temperature=config("gradnorm").temperature),
                           "predict", 2000 if shape.classes > 100 else None),
    }  # fmt: skip


@dataclass
class Pair:
    """One scorer's timings so far: ours, pytorch-ood's (if it has the detector), its scaling
    factor, and how many sweeps it takes part in (decided after the first)."""

    mine: Callable
    theirs: Callable | None
    ours_s: list[float] = field(default_factory=list)
    theirs_s: list[float] = field(default_factory=list)
    factor: int = 1
    sweeps: int = 0

    def time_once(self, repeats: int) -> None:
        self.ours_s.append(self.mine())
        gc.collect()
        if self.theirs is not None:
            seconds, self.factor = self.theirs()
            self.theirs_s.append(seconds)
            gc.collect()
        if len(self.ours_s) == 1:
            first = [self.ours_s[0], *self.theirs_s]
            slow_and_clear = min(first) > 1.0 and max(first) > CLEAR * min(first)
            if max(first) < CHEAP:
                self.sweeps = max(repeats, CHEAP_ROUNDS)
            elif self.factor > 1 or slow_and_clear:
                self.sweeps = 1
            else:
                self.sweeps = repeats


def sweep_all(pairs: dict[str, Pair], repeats: int) -> None:
    """Time every pair once per sweep, sweep after sweep, until each has had its sweeps: a
    burst of load from other processes then costs each scorer one round, not all of them."""
    sweep = 0
    while any(sweep < (pair.sweeps or 1) for pair in pairs.values()):
        for pair in pairs.values():
            if sweep < (pair.sweeps or 1):
                pair.time_once(repeats)
        sweep += 1


# --------------------------------------------------------------- --conditions
# (name, threads, busy processes beside the run)
CONDITIONS = (("1 thread", 1, 0), ("2 threads", 2, 0), ("2 threads, loaded", 2, 1))
CONDITION_ROUNDS = 7  # rounds for pairs that both take under CHEAP seconds
# pytorch-ood's detectors that learn something before predicting; the others' "fit" is their
# constructor, so only the score is compared
PEER_FITS = {"kl_matching", "temperature", "react", "dice", "knn", "nnguide", "vim",
             "mahalanobis", "rmds", "she", "fdbd"}  # fmt: skip


@contextmanager
def threads(count: int) -> Iterator[None]:
    """torch's intra-op threads and every native pool (numpy's BLAS, OpenMP) at ``count``."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        with threadpoolctl.threadpool_limits(count):
            yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def competing_load(processes: int) -> Iterator[None]:
    """``processes`` Python processes spinning on the CPU for as long as the block runs."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)
    ]
    try:
        if spinners:
            time.sleep(0.5)  # started and spinning before the first timing
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def ours_split(name: str, fit: tuple, test: tuple, clf: dict) -> Callable[[], tuple]:
    """Our head's (fit seconds, score seconds), a fresh head each call."""

    def run() -> tuple[float, float]:
        head = heads.get(name)()
        fit_s = timed(lambda: head.fit(fit[0], fit[1], fit[2], classifier=clf))
        return fit_s, timed(lambda: head.score(test[0], test[1]))

    return run


@dataclass
class Split:
    """One pair's fit and score seconds under one condition, round after round."""

    mine: Callable
    theirs: Callable
    ours: list[tuple[float, float]] = field(default_factory=list)
    peer: list[tuple[float, float]] = field(default_factory=list)
    factor: int = 1
    rounds: int = 0

    def time_once(self, repeats: int) -> None:
        first_ours = len(self.ours) % 2 == 0  # alternate who goes first
        for turn in (0, 1) if first_ours else (1, 0):
            if turn == 0:
                self.ours.append(self.mine())
            else:
                *seconds, self.factor = self.theirs(split=True)
                self.peer.append(tuple(seconds))
            gc.collect()
        if self.rounds == 0:
            first = sum(self.ours[0]), sum(self.peer[0])
            if self.factor > 1 or (min(first) > 1.0 and max(first) > CLEAR * min(first)):
                self.rounds = 1
            elif max(first) < CHEAP:
                self.rounds = max(repeats, CONDITION_ROUNDS)
            else:
                self.rounds = repeats

    def medians(self) -> tuple[float, float, float, float]:
        """Median (our fit, their fit, our score, their score)."""
        return (
            statistics.median(s[0] for s in self.ours),
            statistics.median(s[0] for s in self.peer),
            statistics.median(s[1] for s in self.ours),
            statistics.median(s[1] for s in self.peer),
        )


def ratio(mine: float, theirs: float) -> str:
    return f"{mine / theirs:.2f}" if theirs > 0 else "inf"


def run_conditions(shape: Shape, names: list[str], repeats: int, load: int) -> None:
    """Each pair's fit and score, medians, under each of ``CONDITIONS`` (the loaded one with
    ``load`` spinning processes), pairs interleaved round by round; then the ratios."""
    fit, test, clf = features(shape, shape.fit_rows, 0), features(shape, shape.test_rows, 1), None
    clf = classifier(shape)
    peer = peers(shape, fit, test, clf)
    names = [n for n in names if n in peer]
    print(f"fit {shape.fit_rows:,} x {shape.dim:,}, test {shape.test_rows:,}, "
          f"C = {shape.classes:,}; medians", flush=True)  # fmt: skip
    found: dict[str, dict[str, tuple]] = {name: {} for name in names}
    for label, count, busy in CONDITIONS:
        busy = busy and load
        with threads(count), competing_load(busy):
            splits = {n: Split(ours_split(n, fit, test, clf), peer[n]) for n in names}
            started = time.perf_counter()
            sweep = 0
            while any(sweep < (s.rounds or 1) for s in splits.values()):
                for split in splits.values():
                    if sweep < (split.rounds or 1):
                        split.time_once(repeats)
                sweep += 1
        print(f"-- {label} ({busy} busy processes): {time.perf_counter() - started:.0f} s")
        print(f"{'scorer':<13}{'our fit':>9}{'their fit':>11}{'ratio':>7}"
              f"{'our score':>11}{'their score':>13}{'ratio':>7}{'rounds':>8}")  # fmt: skip
        for name, split in splits.items():
            of, tf, os_, ts = split.medians()
            fit_ratio = ratio(of, tf) if name in PEER_FITS else "–"
            mark = f" (x{split.factor})" if split.factor > 1 else ""
            print(f"{name:<13}{of:>9.4f}{tf:>11.4f}{fit_ratio:>7}{os_:>11.4f}{ts:>13.4f}"
                  f"{ratio(os_, ts):>7}{split.rounds:>8}{mark}", flush=True)  # fmt: skip
            found[name][label] = (fit_ratio, ratio(os_, ts))
    labels = [c[0] for c in CONDITIONS]
    print("ours / pytorch-ood, fit | score:", " | ".join(labels))
    for name in names:
        cells = [f"{found[name][c][0]:>5} {found[name][c][1]:>5}" for c in labels]
        print(f"{name:<13}" + "  |  ".join(cells), flush=True)


def faiss_against_torch(bank: torch.Tensor, queries: torch.Tensor, k: int) -> None:
    """Exact inner-product top-k of unit rows: faiss-cpu's IndexFlatIP, then blocked torch."""
    bank, queries = normalise(bank), normalise(queries)
    mine = timed(lambda: top_inner_products(queries, bank, k))
    try:
        import faiss
    except ImportError:
        print(f"knn search: torch blocked {mine:.1f} s; faiss-cpu not installed")
        return
    faiss.omp_set_num_threads(torch.get_num_threads())
    index = faiss.IndexFlatIP(bank.shape[1])
    seconds = timed(lambda: (index.add(bank.numpy()), index.search(queries.numpy(), k)))
    print(f"knn search (k = {k}): torch blocked {mine:.1f} s, faiss-cpu {seconds:.1f} s")


def probe_rows(logits: torch.Tensor, labels: torch.Tensor, rows: int = 2000) -> torch.Tensor:
    """The first ``rows`` rows, the first row of every class and the first correctly classified
    one: a small fit that only a scorer's own limits refuse (2,000 rows alone miss classes at
    C = 1,000, which the class-mean scorers and SHE rightly refuse)."""
    y = labels.numpy()
    right = np.flatnonzero(logits.argmax(1).numpy() == y)
    firsts = [np.unique(y, return_index=True)[1], right[np.unique(y[right], return_index=True)[1]]]
    return torch.from_numpy(np.union1d(np.arange(min(rows, len(y))), np.concatenate(firsts)))


def run(
    shape: Shape, names: list[str], repeats: int = 3, with_peers: bool = True, faiss: bool = False
) -> None:
    """Print one shape's table (see the module docstring)."""
    fit, test, clf = features(shape, shape.fit_rows, 0), features(shape, shape.test_rows, 1), None
    clf = classifier(shape)
    product = min(timed(lambda: test[0] @ clf["weight"].T) for _ in range(max(repeats, 3)))
    print(
        f"fit {shape.fit_rows:,} x {shape.dim:,}, test {shape.test_rows:,}, C = {shape.classes:,},"
        f" threads {torch.get_num_threads()}; one test x D x C product {product * 1e3:.1f} ms",
        flush=True,
    )
    peer = peers(shape, fit, test, clf) if with_peers else {}
    pairs, refused = {}, {}
    probe = probe_rows(fit[1], fit[2])
    for name in names:
        try:  # a first fit tells a refusal (DDU at C = 1,000) before any timing
            heads.get(name)().fit(fit[0][probe], fit[1][probe], fit[2][probe], classifier=clf)
        except EtnError as refusal:
            refused[name] = str(refusal).splitlines()[0]
            continue
        pairs[name] = Pair(ours(name, fit, test, clf), peer.get(name))
    sweep_all(pairs, repeats)
    columns = ("ours s", "pytorch-ood s", "ours/theirs", "excess/product", "")
    print(f"{'scorer':<15} " + " ".join(f"{c:>14}" for c in columns))
    for name in names:
        if name in refused:
            print(f"{name:<15} refused: {refused[name]}")
            continue
        pair = pairs[name]
        mine = min(pair.ours_s)
        cells = [f"{mine:.3f}", "–", "", "", ""]
        if pair.theirs_s:
            theirs = min(pair.theirs_s)
            excess = (mine - theirs) / product
            cells[1:] = [
                f"{theirs:.3f}" + (f" (x{pair.factor})" if pair.factor > 1 else ""),
                f"{mine / theirs:.2f}",
                f"{excess:+.1f}",
                "ok" if excess <= 2 else "SLOWER",
            ]
        print(f"{name:<15} " + " ".join(f"{c:>14}" for c in cells), flush=True)
    if faiss:
        faiss_against_torch(fit[0], test[0], heads.get("knn")().config.k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    scorers = [n for n in heads.names() if issubclass(heads.get(n), Scorer)]
    parser.add_argument("--scorers", nargs="*", default=["map", "energy", "mahalanobis", *scorers])
    parser.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    parser.add_argument("--fit-rows", type=int)
    parser.add_argument("--test-rows", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--faiss", action="store_true")
    parser.add_argument("--conditions", action="store_true")
    parser.add_argument("--load", type=int, default=1)
    args = parser.parse_args()
    for name in SHAPES if args.shape == "both" else [args.shape]:
        shape = SHAPES[name]
        shape = replace(shape, fit_rows=args.fit_rows or shape.fit_rows)
        shape = replace(shape, test_rows=args.test_rows or shape.test_rows)
        print(f"== {name}")
        if args.conditions:
            run_conditions(shape, args.scorers, args.repeats, args.load)
        else:
            run(shape, args.scorers, args.repeats, not args.no_peers, args.faiss)


if __name__ == "__main__":
    main()
