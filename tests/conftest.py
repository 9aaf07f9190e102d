"""Shared fakes for the tests: tiny, seeded synthetic backbone features; the README's Quick
start, run once for the tests that only read its results."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch


@dataclass
class Features:
    """What ``etn extract`` caches for one split, plus the backbone's final layer."""

    hidden: np.ndarray  # (N, D) float32
    logits: np.ndarray  # (N, C) float32
    labels: np.ndarray  # (N,) int64
    weight: np.ndarray  # (C, D) float32
    bias: np.ndarray  # (C,) float32
    means: np.ndarray  # (C, D) class means of ``hidden``
    layers: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (N, D_l) float32

    @property
    def classifier(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight, "bias": self.bias}


def make_features(
    n: int = 200, d: int = 16, c: int = 4, *, seed: int = 0, split: int = 0, spread: float = 3.0
) -> Features:
    """Gaussian classes with class-dependent means; ``logits = h @ W.T + b`` plus noise, with
    ``W`` pointing at the class means so that the logits mostly agree with the labels.

    ``seed`` fixes the "backbone" (class means, W, b); ``split`` draws another sample from the
    same distribution (a held-out test set). ``layers`` holds two pooled "intermediate layers"
    (random projections of ``hidden``, one through a ReLU, plus noise), drawn from their own
    streams so that every other array is the same as without them.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=spread / 4, size=(c, d))  # (C, D), about spread apart
    weight = means + 0.3 * rng.normal(size=(c, d))  # (C, D)
    bias = -0.5 * (weight**2).sum(1)  # (C,)
    rng = np.random.default_rng([seed, split])
    labels = rng.permutation(np.arange(n) % c)  # (N,)
    hidden = means[labels] + rng.normal(size=(n, d))  # (N, D)
    logits = hidden @ weight.T + bias + 0.3 * rng.normal(size=(n, c))  # (N, C)
    projections = np.random.default_rng([seed, 7])  # part of the "backbone"
    p1, p2 = projections.normal(size=(d, 8)) / np.sqrt(d), projections.normal(size=(d, 12))
    noise = np.random.default_rng([seed, split, 7])
    layers = {
        "block1": np.maximum(hidden @ p1, 0) + 0.1 * noise.normal(size=(n, 8)),
        "block2": hidden @ p2 / np.sqrt(d) + 0.1 * noise.normal(size=(n, 12)),
    }
    return Features(
        hidden.astype(np.float32),
        logits.astype(np.float32),
        labels.astype(np.int64),
        weight.astype(np.float32),
        bias.astype(np.float32),
        means,
        {name: a.astype(np.float32) for name, a in layers.items()},
    )


@pytest.fixture(scope="session")
def features_factory():
    """``make_features`` as a fixture, so test modules need not import this file."""
    return make_features


REPO = Path(__file__).resolve().parents[1]
ETN = [shutil.which("etn")] if shutil.which("etn") else [sys.executable, "-m", "etn_cli"]


@dataclass(frozen=True)
class QuickStart:
    """The README's Quick start as a person runs it: ``etn run pipelines/digits.toml`` through
    the installed entry point, into a fresh data directory named by ``$ETN_DATA_DIR``."""

    env: dict[str, str]  # the environment variables the run was given
    done: subprocess.CompletedProcess

    @property
    def data(self) -> Path:
        return Path(self.env["ETN_DATA_DIR"])

    def etn(self, *args: object, timeout: float = 900) -> subprocess.CompletedProcess:
        """``etn ARGS`` on this run's data directory, from the repository, as the README says."""
        return subprocess.run(
            [*ETN, *map(str, args)],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, **self.env, "COLUMNS": "200"},
            timeout=timeout,  # a hang guard: the run took 260 s on a loaded 2-core machine
        )


class Background:
    """The Quick start's run, started in a second process as soon as the tests are collected:
    it is the longest piece of the suite, and this way it runs on the machine's other core
    while the tests before it run on this one (the tests that use it are moved last)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="etn-quick-start-"))
        self.env = {"ETN_DATA_DIR": str(self.folder / "data")}
        self.out = open(self.folder / "out", "w+")  # read back by wait, closed by close
        self.err = open(self.folder / "err", "w+")
        self.process = subprocess.Popen(
            [*ETN, "run", str(REPO / "pipelines" / "digits.toml")],
            cwd=REPO,
            stdout=self.out,
            stderr=self.err,
            env={**os.environ, **self.env, "COLUMNS": "200"},
        )

    def wait(self) -> QuickStart:
        code = self.process.wait(timeout=1800)  # a hang guard (260 s on a loaded machine)
        self.out.seek(0)
        self.err.seek(0)
        args = [str(a) for a in self.process.args]
        done = subprocess.CompletedProcess(args, code, self.out.read(), self.err.read())
        return QuickStart(self.env, done)

    def close(self) -> None:
        if self.process.poll() is None:  # the session stopped early (-x, ^C)
            self.process.kill()
            self.process.wait()
        self.out.close()
        self.err.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they do
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Start the Quick start's run now if a selected test uses it, and run those tests last."""
    uses = [item for item in items if "quick_start" in getattr(item, "fixturenames", ())]
    items[:] = [item for item in items if item not in uses] + uses
    # (an xdist worker collects every test whichever it runs: there the fixture starts it)
    if uses and not config.option.collectonly and not hasattr(config, "workerinput"):
        config.stash[QUICK_START] = Background()


def pytest_unconfigure(config: pytest.Config) -> None:
    if QUICK_START in config.stash:
        config.stash[QUICK_START].close()


QUICK_START = pytest.StashKey[Background]()


@pytest.fixture(scope="session")
def quick_start(request: pytest.FixtureRequest) -> QuickStart:
    """The whole digits default (61 heads, 3 seeds), run once per session in the background:
    shared by every test that only reads its results or reruns it (a rerun finds every unit
    finished and builds nothing)."""
    if QUICK_START not in request.config.stash:  # asked for by name, not seen at collection
        request.config.stash[QUICK_START] = Background()
    run = request.config.stash[QUICK_START].wait()
    assert run.done.returncode == 0, run.done.stderr[-2000:]
    return run


@pytest.fixture
def meta_as_accelerator(monkeypatch):
    """PyTorch's ``meta`` device as a stand-in for a GPU on a CPU-only machine: a ``meta`` tensor
    has a shape and no values, and an operation mixing it with a CPU tensor raises, as mixing
    a CUDA and a CPU tensor does. What a GPU allows and ``meta`` cannot do, reading values back
    to the host (``.cpu()``, ``.item()``, ``bool``, ``float``, ``int``), gives ones of the
    right shape here, so a computation runs to its end; ``.numpy()`` of a device tensor raises
    as on a GPU."""
    real_cpu, real_to, real_item = torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.item

    def ones(t: torch.Tensor) -> torch.Tensor:  # ones: positive where values must be
        return torch.ones(t.shape, dtype=t.dtype, device="cpu")

    def cpu(self, *args, **kwargs):
        return ones(self) if self.is_meta else real_cpu(self, *args, **kwargs)

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if self.is_meta and isinstance(target, str | torch.device):
            if torch.device(target).type == "cpu":
                return real_to(ones(self), *args, **kwargs)
        return real_to(self, *args, **kwargs)

    def item(self):
        return real_item(ones(self)) if self.is_meta else real_item(self)

    def tolist(self, real=torch.Tensor.tolist):
        return real(ones(self)) if self.is_meta else real(self)

    def truth(self, real=torch.Tensor.__bool__):
        return bool(real_item(ones(self))) if self.is_meta else real(self)

    def number(self, real=torch.Tensor.__float__):
        return float(real_item(ones(self))) if self.is_meta else real(self)

    def integer(self, real=torch.Tensor.__int__):
        return int(real_item(ones(self))) if self.is_meta else real(self)

    readbacks = {"cpu": cpu, "to": to, "item": item, "tolist": tolist, "__bool__": truth}
    for name, method in (readbacks | {"__float__": number, "__int__": integer}).items():
        monkeypatch.setattr(torch.Tensor, name, method)
    # a GPU's nonzero synchronises and counts; meta cannot count: assume every element. The
    # config module's own patch, not monkeypatch: its entries live outside the module's
    # __dict__, and pytest 9.2's monkeypatch undoes such a setattr by deleting the entry
    with torch.fx.experimental._config.patch(meta_nonzero_assume_all_nonzero=True):
        yield
