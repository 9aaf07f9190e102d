"""Shared fakes for the tests: tiny, seeded synthetic backbone features; the README's Quick
start, run once for the tests that only read its results."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
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
    it is the longest piece of the suite, and this way it runs beside the tests before it (the
    tests that use it are moved last).

    Under pytest-xdist every worker collects every test and any one of them may run the tests
    that use it, so the run lives in a folder named by the test run's id, started by the first
    worker alone, waited for by whichever runs them, and removed by the controller."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {"ETN_DATA_DIR": str(folder / "data")}

    @classmethod
    def start(cls, folder: Path) -> Background:
        folder.mkdir(parents=True)
        # a shell waits for the run and writes its exit status last, so any process can wait
        script = '"$@" >out 2>err; echo $? >status.part && mv status.part status'
        etn = [*ETN, "run", str(REPO / "pipelines" / "digits.toml")]
        env = {**os.environ, **cls(folder).env, "COLUMNS": "200"}
        process = subprocess.Popen(
            ["sh", "-c", script, "sh", *etn], cwd=folder, env=env, start_new_session=True
        )
        STARTED.append(process)  # kept, so that no warning says it was dropped while running
        (folder / "pid").write_text(str(process.pid))
        return cls(folder)

    def wait(self) -> QuickStart:
        status, deadline = self.folder / "status", time.monotonic() + 1800  # a hang guard
        while not status.exists():  # (the run took 260 s on a loaded 2-core machine)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Quick start's run in {self.folder} took over 1800 s")
            time.sleep(0.2)
        out, err = ((self.folder / name).read_text() for name in ("out", "err"))
        args = [*ETN, "run", str(REPO / "pipelines" / "digits.toml")]
        done = subprocess.CompletedProcess(args, int(status.read_text()), out, err)
        return QuickStart(self.env, done)

    def close(self) -> None:
        if (self.folder / "pid").exists() and not (self.folder / "status").exists():
            with contextlib.suppress(ProcessLookupError):  # the session stopped early (-x, ^C)
                os.killpg(int((self.folder / "pid").read_text()), signal.SIGKILL)
        shutil.rmtree(self.folder, ignore_errors=True)


def shared_folder(config: pytest.Config) -> Path | None:
    """The Quick start's folder for this session: its own under xdist (one per test run id,
    known to the controller and every worker), None without xdist."""
    uid = getattr(config, "workerinput", {}).get("testrunuid") or config.getoption(
        "testrunuid", default=None
    )
    return Path(tempfile.gettempdir()) / f"etn-quick-start-{uid}" if uid else None


def pytest_configure(config: pytest.Config) -> None:
    xdist = config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None)
    if xdist and not hasattr(config, "workerinput") and config.option.testrunuid is None:
        config.option.testrunuid = uuid.uuid4().hex  # the workers' id, chosen here to clean up


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they do
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Start the Quick start's run now if a selected test uses it, and run those tests last."""
    uses = [item for item in items if "quick_start" in getattr(item, "fixturenames", ())]
    items[:] = [item for item in items if item not in uses] + uses
    if not uses or config.option.collectonly:
        return
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:  # without xdist
        folder = Path(tempfile.mkdtemp(prefix="etn-quick-start-")) / "run"
        config.stash[QUICK_START] = Background.start(folder)
    elif worker == "gw0" and (folder := shared_folder(config)) is not None:
        Background.start(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    if QUICK_START in config.stash and shared_folder(config) is None:
        config.stash[QUICK_START].close()
        shutil.rmtree(config.stash[QUICK_START].folder.parent, ignore_errors=True)
    elif not hasattr(config, "workerinput") and (folder := shared_folder(config)) is not None:
        Background(folder).close()  # the xdist controller, once every worker is done


QUICK_START = pytest.StashKey[Background]()
STARTED: list[subprocess.Popen] = []


@pytest.fixture(scope="session")
def quick_start(request: pytest.FixtureRequest) -> QuickStart:
    """The whole digits default (61 heads, 3 seeds), run once per session in the background:
    shared by every test that only reads its results or reruns it (a rerun finds every unit
    finished and builds nothing)."""
    config = request.config
    if QUICK_START not in config.stash:
        folder = shared_folder(config)
        try:  # asked for by name, not seen at collection, or (xdist) started by the first worker
            folder = folder or Path(tempfile.mkdtemp(prefix="etn-quick-start-")) / "run"
            config.stash[QUICK_START] = Background.start(folder)
        except FileExistsError:
            config.stash[QUICK_START] = Background(folder)
    run = config.stash[QUICK_START].wait()
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
    # a GPU's nonzero synchronises and counts; meta cannot count: assume every element
    monkeypatch.setattr(torch.fx.experimental._config, "meta_nonzero_assume_all_nonzero", True)
