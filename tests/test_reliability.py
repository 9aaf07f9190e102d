"""Never lose or corrupt work: kills at any moment, resumed extraction, overlapping runs,
atomic replacement, content keys that cover every input, ``etn verify`` and ``etn status``.

The kill tests run ``etn run`` in a subprocess on a tiny digits pipeline and SIGKILL it; a
rerun must finish and give exactly the metrics of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from cli_runner import finished_run, fresh_data, unstamped
from safetensors.torch import save_file
from tiny_pipeline import TINY_MCQA, causal_lm, fake_data, tiny_pipeline

from etn_cli.errors import EtnError
from etn_cli.planning import plan as plan_module
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.plan import make_plan
from etn_cli.stages.extract_batches import remaining_batches, tail_loader
from etn_cli.stages.run import run_pipeline
from etn_cli.stages.status import render_status, status
from etn_cli.stages.train import train
from etn_cli.stages.verify import verify
from etn_cli.store.artefacts.headfiles import check_head_folder
from etn_cli.store.atomic import is_locked, unit_lock
from etn_cli.store.reading.reader import read_split
from etn_cli.store.writing.writer import ShardWriter

REPO = Path(__file__).resolve().parents[1]
PIPELINE = tiny_pipeline(
    data={"ood": ["digits_noise"], "batch_size": 16, "shard_rows": 16},
    heads=({"name": "etn", "epochs": 2, "batch_size": 64}, "map"),
)
UNITS = {"extract": 3, "train": 2, "evaluate": 2}  # what one run of PIPELINE builds
SUMMARY = UNITS | {"extract": UNITS["extract"] + 1}  # a run's summary counts the classifier
METRIC_COLUMNS = ["eval_set", "task", "method", "seed", "metric", "score", "value", "note"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An uninterrupted run: (pipeline file, data dir)."""
    return finished_run(tmp_path_factory.mktemp("reference"), PIPELINE)


def start_run(pipeline: Path, data: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "etn_cli", "run", str(pipeline), "-d", str(data)]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_until(condition: Callable[[], bool], process: subprocess.Popen) -> bool:
    """Poll ``condition`` every 2 ms; False if the process ended first."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return condition()
        time.sleep(0.002)
    raise AssertionError("the run neither progressed nor ended within 300 s")


def unit_files(data: Path) -> int:
    """Files of etn's units so far (lock files and the backbone cache aside); folders renamed
    by the running process while they are listed are skipped."""
    return sum(
        1
        for name in ("features", "heads", "metrics")
        for _, _, files in os.walk(data / name)
        for file in files
        if not file.endswith(".lock")
    )


def metrics(data: Path) -> dict[str, pl.DataFrame]:
    return {
        p.name: pl.read_parquet(p).select(METRIC_COLUMNS).sort(METRIC_COLUMNS[:6])
        for p in sorted((data / "metrics").rglob("*.parquet"))
    }


def assert_same_metrics(data: Path, reference: Path) -> None:
    ours, theirs = metrics(data), metrics(reference)
    assert ours.keys() == theirs.keys() and len(ours) == UNITS["evaluate"]
    for name, frame in ours.items():
        assert frame.equals(theirs[name]), name


def assert_all_valid(data: Path) -> None:
    """Every shard, head and metrics file validates and no leftover stays after cleaning."""
    found = verify(data, clean_partials=True)
    assert not found.damaged, [d.line() for d in found.damaged]
    assert found.checked["feature splits"] == UNITS["extract"]
    assert found.checked["heads"] == UNITS["train"]
    assert found.checked["metrics files"] == UNITS["evaluate"]
    assert len(found.cleaned) == len(found.leftovers)
    assert not verify(data).leftovers


def journals(data: Path) -> list[tuple[Path, dict]]:
    found = []
    for path in data.glob("features/*/*.partial-*/journal.json"):
        try:
            found.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):  # replaced or removed between glob and read
            continue
    return found


# ------------------------------------------------------------------------ kills
def test_a_split_killed_midway_resumes_from_its_finished_shards(reference, tmp_path) -> None:
    pipeline, reference_data = reference
    data = fresh_data(tmp_path, reference)
    process = start_run(pipeline, data)
    halfway = lambda: any(len(doc["shards"]) >= 2 for _, doc in journals(data))  # noqa: E731
    assert wait_until(halfway, process), "the run ended before any split was half written"
    process.send_signal(signal.SIGSTOP)  # freeze it holding the split's lock
    path, _ = next((p, doc) for p, doc in journals(data) if len(doc["shards"]) >= 2)
    unit = Path(str(path.parent).split(".partial-")[0])
    assert is_locked(unit)
    process.kill()
    process.wait()
    assert not is_locked(unit)  # the kernel released the dead process's lock
    journal = json.loads(path.read_text())
    kept = {e["file"]: (path.parent / e["file"]).stat() for e in journal["shards"]}
    found = verify(data)
    assert not found.damaged and "journaled shard" in found.render()

    assert run_pipeline(pipeline, data).ok  # no lock or partial folder to clear by hand
    manifest = json.loads((unit / "manifest.json").read_text())
    assert manifest["resumed"]["shards"] == len(kept) >= 2
    for file, before in kept.items():  # the very same files: not recomputed, not rewritten
        after = (unit / file).stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    resumed = read_split(unit)
    uninterrupted = read_split(reference_data / unit.relative_to(data))
    np.testing.assert_array_equal(resumed.hidden, uninterrupted.hidden)
    np.testing.assert_array_equal(resumed.index, uninterrupted.index)
    assert_same_metrics(data, reference[1])
    assert_all_valid(data)


def kill_at_random_moments(
    pipeline: Path, data: Path, total: int, times: int, seed: int, timed: float = 0.0
) -> int:
    """Start ``etn run`` and SIGKILL it, up to ``times`` times or until a run ends by itself;
    return how many runs were killed mid-way. A kill comes once a random share of the
    remaining unit files exist (plus up to 50 ms), or, for a share ``timed`` of the runs,
    after a random delay of up to 4 s, which also lands in start-up or the backbone's
    training."""
    rng = random.Random(seed)
    killed = 0
    for _ in range(times):
        start = unit_files(data)
        target = rng.randint(start + 1, start + 1 + max(0, total - start) // 2)
        process = start_run(pipeline, data)
        if rng.random() < timed:
            time.sleep(rng.uniform(0.0, 4.0))
        elif not wait_until(lambda: unit_files(data) >= target, process):  # noqa: B023
            assert process.returncode == 0, process.stderr.read()
            break
        time.sleep(rng.uniform(0.0, 0.05))
        process.kill()
        process.wait()
        if process.returncode != -signal.SIGKILL:  # it had finished
            assert process.returncode == 0, process.stderr.read()
            break
        killed += 1
        if data.exists():  # a kill during start-up leaves no data directory at all
            found = verify(data)  # whatever the moment, nothing finished is damaged
            assert not found.damaged, [d.line() for d in found.damaged]
    return killed


def test_ctrl_c_says_interrupted_and_that_a_rerun_resumes_then_a_rerun_does(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    pipeline, reference_data = reference
    data = fresh_data(tmp_path, reference)
    process = start_run(pipeline, data)
    started = lambda: any(data.glob("features/*/*.partial-*"))  # noqa: E731
    assert wait_until(started, process), "the run ended before its first unit started"
    process.send_signal(signal.SIGINT)  # what Ctrl-C sends
    _, err = process.communicate(timeout=120)
    lines = unstamped(err.decode())
    assert process.returncode == 130, err.decode()
    assert not any("FAILED" in line or "Traceback" in line for line in lines), lines
    assert re.fullmatch(r"\[1/\d+\] extract +digits\.adapt: interrupted after [\d.]+ s", lines[-2])
    command = f"etn run {pipeline} -d {data}"
    assert lines[-1] == f"interrupted: `{command}` resumes from the finished units"
    assert run_pipeline(pipeline, data).ok
    assert_same_metrics(data, reference[1])


@pytest.mark.slow  # kills at random moments: about 15 s
def test_runs_killed_at_random_moments_then_rerun_equal_an_uninterrupted_run(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    pipeline, reference_data = reference
    data = fresh_data(tmp_path, reference)
    killed = kill_at_random_moments(pipeline, data, unit_files(reference_data), times=3, seed=1)
    assert killed >= 2
    assert run_pipeline(pipeline, data).ok
    assert_same_metrics(data, reference[1])
    assert_all_valid(data)


@pytest.mark.slow
def test_many_kills_anywhere_never_lose_or_corrupt_work(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """Eight pipelines from an empty data directory, each killed until it finishes by itself
    or has been killed six times, then rerun: at least 30 kills in all."""
    pipeline, reference_data = reference
    total = unit_files(reference_data)
    killed = 0
    for seed in range(8):
        data = tmp_path / f"data{seed}"
        killed += kill_at_random_moments(pipeline, data, total, times=6, seed=seed, timed=0.2)
        assert run_pipeline(pipeline, data).ok
        assert_same_metrics(data, reference[1])
        found = verify(data, clean_partials=True)
        assert not found.damaged, [d.line() for d in found.damaged]
        # only temporary folders of the backbone's own cache, which has no lock, may stay
        assert all(left.unit is None for left in verify(data).leftovers)
    assert killed >= 30


KILL_INSIDE_PARQUET_WRITE = """
import os, signal, sys

real_fsync = os.fsync


def torn_then_killed(fd):
    if ".parquet." in os.readlink(f"/proc/self/fd/{fd}"):
        os.ftruncate(fd, os.fstat(fd).st_size // 2)  # half the bytes, as a crash leaves them
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync(fd)


os.fsync = torn_then_killed
from etn_cli.cli.app import main

sys.argv = ["etn", "evaluate", sys.argv[1], "--data-dir", sys.argv[2]]
main()
"""


def test_a_kill_inside_a_metrics_write_never_leaves_a_truncated_parquet(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    pipeline, data = copied(reference, tmp_path, "metrics", "predictions")
    command = [sys.executable, "-c", KILL_INSIDE_PARQUET_WRITE, str(pipeline), str(data)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    # a unit writes its per-row predictions first, then its metrics file
    folders = [data / "metrics" / "tiny", data / "predictions" / "tiny"]
    assert [p for f in folders for p in f.glob("*.parquet")] == []  # never half a file
    (torn,) = [p for f in folders for p in f.glob(".*.parquet.*.tmp")]
    found = verify(data)
    assert not found.damaged and [left.path for left in found.leftovers] == [torn]
    assert run_pipeline(pipeline, data).ok
    assert not torn.exists()  # the rerun cleared it under the unit's lock
    assert_same_metrics(data, reference[1])
    assert_all_valid(data)


# ------------------------------------------------------------------------ overlapping runs
@pytest.mark.slow  # two whole runs at once: about 20 s
def test_two_overlapping_runs_build_each_unit_once_and_equal_one_run(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    pipeline, reference_data = reference
    data = fresh_data(tmp_path, reference)
    runs = [start_run(pipeline, data), start_run(pipeline, data)]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    summary = re.compile(r"(\w+): (\d+) built, (\d+) up to date")
    built = [
        {stage: (int(b), int(s)) for stage, b, s in summary.findall((out + err).decode())}
        for out, err in outputs
    ]
    for stage, total in SUMMARY.items():
        assert sum(counts[stage][0] for counts in built) == total  # once, not twice
        assert all(sum(counts[stage]) == total for counts in built)
    assert_same_metrics(data, reference[1])
    assert_all_valid(data)


# ------------------------------------------------------------------------ --force
def test_force_swaps_a_new_head_in_and_never_edits_the_old_one(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    pipeline, data = copied(reference, tmp_path)
    reference_data = reference[1]
    head = next(p for p in sorted((data / "heads").glob("etn-*")) if p.is_dir())
    old = {p.name: (p.stat().st_ino, p.read_bytes()) for p in head.iterdir()}
    old_folder = head.stat().st_ino
    plan = make_plan(load_pipeline(pipeline), data)
    assert train(plan, force=True).summary() == "train: 2 built, 0 up to date"
    assert head.stat().st_ino != old_folder  # a new folder was swapped in
    new = {p.name: (p.stat().st_ino, p.read_bytes()) for p in head.iterdir()}
    assert new.keys() == old.keys()
    assert all(new[name][0] != old[name][0] for name in new)  # none of the old files rewritten
    assert new["weights.safetensors"][1] == old["weights.safetensors"][1]  # same seed, same fit
    check_head_folder(head)
    assert sorted(p.name for p in (data / "heads").iterdir() if ".lock" not in p.name) == sorted(
        p.name for p in (reference_data / "heads").iterdir() if ".lock" not in p.name
    )


# ------------------------------------------------------------------------ content keys
def copied(reference: tuple[Path, Path], tmp_path: Path, *leave_out: str) -> tuple[Path, Path]:
    """The reference run's pipeline and a copy of its data dir without ``leave_out``."""
    data = tmp_path / "data"
    shutil.copytree(reference[1], data, ignore=shutil.ignore_patterns(*leave_out))
    return reference[0], data


def keys_of(tmp_path: Path, text: str, data: Path) -> dict[str, list[str]]:
    """The content-keyed paths of every unit of a pipeline written from ``text``."""
    path = tmp_path / f"p{len(list(tmp_path.glob('p*.toml')))}.toml"
    path.write_text(text)
    plan = make_plan(load_pipeline(path), data)
    return {
        "finetune": [plan.finetune.path.name] if plan.finetune else [],
        "features": [str(u.path.relative_to(data)) for u in plan.feature_units],
        "heads": [u.path.name for u in plan.heads],
        "metrics": [u.path.name for u in plan.metrics],
    }


def changed(base: dict[str, list[str]], other: dict[str, list[str]]) -> set[str]:
    """The kinds of unit of which at least one got a new key."""
    return {kind for kind, names in base.items() if names != other[kind]}


DIGITS_CHANGES = {
    "backbone config (weights retrained)": (("epochs = 2\n[data]", "epochs = 3\n[data]"), None),
    "backbone extract option": (("epochs = 2\n[data]", "epochs = 2\nodin = true\n[data]"), None),
    "adaptation split": (('id = "digits"', 'id = "digits"\nadapt = "train"'), None),
    "OOD dataset": (('"digits_noise"', '"digits_unseen"'), None),
    "extract code version": (None, ("EXTRACT_VERSION", plan_module.EXTRACT_VERSION + 1)),
    "head setting": (("epochs = 2\nbatch_size = 64", "epochs = 3\nbatch_size = 64"), None),
    "seed": (("seeds = [0]", "seeds = [1]"), None),
    "head format": (None, ("HEAD_FORMAT", 2)),
    "metrics version": (None, ("METRICS_VERSION", plan_module.METRICS_VERSION + 1)),
}
EXPECTED = {
    "backbone config (weights retrained)": {"features", "heads", "metrics"},
    "backbone extract option": {"features", "heads", "metrics"},
    "adaptation split": {"features", "heads", "metrics"},
    "OOD dataset": {"features", "metrics"},
    "extract code version": {"features", "heads", "metrics"},
    "head setting": {"heads", "metrics"},
    "seed": {"heads", "metrics"},
    "head format": {"heads", "metrics"},
    "metrics version": {"metrics"},
}


def test_a_heads_version_gives_new_keys_to_its_own_units_only(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from etn_cli.catalogue import METHODS

    data = fresh_data(tmp_path, reference)
    base = keys_of(tmp_path, PIPELINE, data)
    monkeypatch.setitem(METHODS, "map", dataclasses.replace(METHODS["map"], version=1))
    other = keys_of(tmp_path, PIPELINE, data)
    for kind in ("heads", "metrics"):
        renewed = [a != b for a, b in zip(base[kind], other[kind], strict=True)]
        assert renewed == [name.startswith("map-") for name in base[kind]], kind


@pytest.mark.parametrize("change", list(DIGITS_CHANGES))
def test_each_input_of_a_digits_pipeline_gives_new_keys_exactly_where_it_should(
    change: str, reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = fresh_data(tmp_path, reference)
    base = keys_of(tmp_path, PIPELINE, data)
    edit, constant = DIGITS_CHANGES[change]
    text = PIPELINE if edit is None else PIPELINE.replace(*edit, 1)
    assert edit is None or text != PIPELINE
    if constant is not None:
        monkeypatch.setattr(plan_module, *constant)
    assert changed(base, keys_of(tmp_path, text, data)) == EXPECTED[change]


MOBILENET = {"name": "torchvision", "model": "mobilenet_v3_small", "num_classes": 4}


def vision(weights: str = "weights0.safetensors", fake: dict | None = None, **changes) -> str:
    """The vision pipeline of the keys' tests: a MobileNet and FakeData, with ``changes`` to the
    backbone (``backbone``) or other tables (``finetune``)."""
    backbone = MOBILENET | {"weights": weights} | changes.pop("backbone", {})
    data = fake_data(size=4, batch_size=None, **(fake or {}))
    return tiny_pipeline("vision", backbone=backbone, data=data, **changes)


def test_each_input_of_a_vision_pipeline_gives_new_feature_keys(tmp_path: Path) -> None:
    import torchvision

    for seed in (0, 1):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            state = torchvision.models.mobilenet_v3_small(num_classes=4).state_dict()
        save_file(state, tmp_path / f"weights{seed}.safetensors")
    data = tmp_path / "data"
    base = keys_of(tmp_path, vision(), data)
    variants = {
        "weights file": {"weights": "weights1.safetensors"},
        "random weights": {"weights": "none"},
        "dtype": {"backbone": {"dtype": "bfloat16"}},
        "transform": {"backbone": {"resize": 40, "crop": 36}},
        "normalisation": {"backbone": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}},
        "dataset options": {"fake": {"seed": 1}},
        "fine-tuning": {"finetune": {"split": "train", "epochs": 1}},
    }
    seen = {tuple(base["features"])}
    for name, update in variants.items():
        keys = keys_of(tmp_path, vision(**update), data)
        assert changed(base, keys) >= {"features", "heads", "metrics"}, name
        seen.add(tuple(keys["features"]))
    assert len(seen) == len(variants) + 1  # no two inputs share a key either
    tuned = vision(finetune={"split": "train", "lr": 0.01})
    again = vision(finetune={"split": "train", "lr": 0.02})
    assert keys_of(tmp_path, tuned, data)["finetune"] != keys_of(tmp_path, again, data)["finetune"]
    assert not data.exists() or not any(data.rglob("*.h5"))  # planning extracts nothing


def test_each_input_of_an_llm_pipeline_gives_new_feature_keys(tmp_path: Path) -> None:
    from llm_fixtures import make_adapter, make_llama

    llama = make_llama(tmp_path / "llama")
    other = tmp_path / "other"
    shutil.copytree(llama, other)
    from safetensors.torch import load_file

    weights = load_file(other / "model.safetensors")
    weights["lm_head.weight"][0, 0] += 1.0
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    adapter = make_adapter(llama, tmp_path / "adapter")

    def text(model: Path = llama, **option: object) -> str:
        lm = causal_lm(model, dtype=None) | option
        return tiny_pipeline("llm", backbone=lm, data=TINY_MCQA)

    data = tmp_path / "data"
    base = keys_of(tmp_path, text(), data)
    variants = {
        "model weights": {"model": other},
        "adapter": {"adapter": adapter},
        "prompt template": {"prompt_template": "instruction"},
        "answer letters": {"letters": ["D", "C", "B", "A"]},
        "dtype": {"dtype": "bfloat16"},
        "max length": {"max_length": 64},
    }
    seen = {tuple(base["features"])}
    for name, update in variants.items():
        keys = keys_of(tmp_path, text(**update), data)
        assert changed(base, keys) >= {"features"}, name
        seen.add(tuple(keys["features"]))
    assert len(seen) == len(variants) + 1


# ------------------------------------------------------------------------ resuming, in-process
def digits_batches(n: int = 40, batch: int = 8, d: int = 5) -> list[tuple]:
    rng = np.random.default_rng(0)
    rows = [
        (rng.normal(size=(batch, d)).astype(np.float32), rng.normal(size=(batch, 3)), start)
        for start in range(0, n, batch)
    ]
    return [(h, z, np.arange(s, s + batch) % 3, np.arange(s, s + batch)) for h, z, s in rows]


def test_a_loader_in_another_order_is_not_resumed_and_its_shards_are_dropped(
    tmp_path: Path,
) -> None:
    batches = digits_batches()
    with pytest.raises(KeyboardInterrupt), ShardWriter(tmp_path / "s", {}, 8, resume={}) as w:
        for batch in batches[:3]:
            w.append(*batch)
        raise KeyboardInterrupt
    shuffled = [(b[0], b[2], b[3][::-1]) for b in batches]  # (inputs, labels, index) per batch
    with pytest.raises(EtnError, match="in another order; the interrupted shards were discarded"):
        with ShardWriter(tmp_path / "s", {}, 8, resume={}) as writer:
            assert writer.resumed_batches == 3
            for _ in remaining_batches(shuffled, writer):
                pass
    assert list(tmp_path.iterdir()) == []


def test_a_sequential_data_loader_restarts_after_the_skipped_batches() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(23.0), torch.arange(23))
    loader = DataLoader(data, batch_size=4)
    tail = tail_loader(loader, 2, 8)
    expected = list(loader)[2:]
    assert [b[1].tolist() for b in tail] == [b[1].tolist() for b in expected]
    assert tail_loader(loader, 2, 7) is None  # the rows do not match whole batches
    assert tail_loader(DataLoader(data, batch_size=4, shuffle=True), 2, 8) is None


# ------------------------------------------------------------------------ verify and status
def test_verify_names_each_damaged_item_on_one_line_and_exits_1(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from etn_cli.cli.app import app

    data = tmp_path / "data"
    shutil.copytree(reference[1], data)
    clean = CliRunner().invoke(app, ["verify", "--data-dir", str(data)])
    assert clean.exit_code == 0 and "0 damaged" in clean.output
    shard = next(data.glob("features/*/digits.test-*/shard-00003.h5"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 1  # one flipped bit, the file still opens
    shard.write_bytes(bytes(raw))
    adapt = next(p for p in data.glob("features/*/digits.adapt-*") if p.is_dir())
    (adapt / "shard-00001.h5").unlink()
    parquet = next(data.glob("metrics/tiny/map-*.parquet"))
    parquet.write_bytes(parquet.read_bytes()[:100])
    head = next(p for p in data.glob("heads/etn-*") if p.is_dir())
    (head / "weights.safetensors").write_bytes(b"\0" * 64)
    result = CliRunner().invoke(app, ["verify", "--data-dir", str(data)])
    assert result.exit_code == 1
    damaged = [line for line in result.output.splitlines() if line.startswith("DAMAGED")]
    assert len(damaged) == 4 and "4 damaged" in result.output
    expected = {
        shard.parent: ("has sha256", "run etn extract"),
        adapt: ("which is missing", "run etn extract"),
        parquet: ("the file changed or is corrupt", "run etn evaluate"),  # before parsing
        head: ("has sha256", "run etn train"),
    }
    for path, phrases in expected.items():
        (line,) = [line for line in damaged if line.startswith(f"DAMAGED {path}:")]
        assert all(phrase in line for phrase in phrases) and f"Delete {path}" in line, line


def test_verify_lists_partials_and_cleans_only_those_no_process_holds(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(reference[1], data)
    split = next(p for p in data.glob("features/*/digits.test-*") if p.is_dir())
    shutil.rmtree(split)  # as if the run that wrote it had been killed after three shards
    with pytest.raises(KeyboardInterrupt), ShardWriter(split, {}, 8, resume={}) as writer:
        for batch in digits_batches()[:3]:
            writer.append(*batch)
        raise KeyboardInterrupt
    held = next(p for p in data.glob("heads/map-*") if p.is_dir())
    (held.parent / f"{held.name}.partial-0123abcd").mkdir()  # a head being trained right now
    tmp = data / "metrics" / "tiny" / ".etn-0000.parquet.89abcdef.tmp"
    tmp.write_bytes(b"PAR1")
    with unit_lock(held):
        found = verify(data)
        assert not found.damaged and len(found.leftovers) == 3
        lines = {left.path.name: left.line() for left in found.leftovers}
        partial = next(name for name in lines if name.startswith(split.name))
        assert (
            "3 journaled shard(s) (24 rows)" in lines[partial] and "interrupted" in lines[partial]
        )
        assert "held by a running etn process" in lines[f"{held.name}.partial-0123abcd"]
        assert "--clean-partials" in found.render()
        cleaned = verify(data, clean_partials=True).cleaned
    assert sorted(p.name for p in cleaned) == sorted([partial, tmp.name])
    assert [left.path.parent for left in verify(data).leftovers] == [held.parent]


def test_status_shows_done_partial_and_missing_units(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    pipeline, data = copied(reference, tmp_path, "metrics", "heads")
    split = next(p for p in data.glob("features/*/digits_noise.*") if p.is_dir())
    shutil.rmtree(split)
    with pytest.raises(KeyboardInterrupt), ShardWriter(split, {}, 8, resume={}) as writer:
        for batch in digits_batches()[:2]:
            writer.append(*batch)
        raise KeyboardInterrupt
    plan = make_plan(load_pipeline(pipeline), data)
    units = status(plan)
    states = {(u.kind, u.name): u.state for u in units}
    assert states[("features", "adapt")] == states[("features", "test")] == "done"
    assert states[("features", "digits_noise")] == "partial"
    assert states[("classifier", "backbone's final layer")] == "done"
    assert [u.state for u in units if u.kind in ("head", "metrics")] == ["missing"] * 4
    table = render_status(plan, units)
    assert "2 shard(s), 16 rows done so far, interrupted" in table
    assert table.splitlines()[-1].startswith("tiny: 8 units, 3 done, 1 partial, 4 missing")


# ------------------------------------------------------------------------ safe loading
def test_no_code_path_unpickles_anything_but_safetensors_json_or_weights_only() -> None:
    sources = {p: p.read_text() for p in (REPO / "etn_cli").rglob("*.py")}
    for path, text in sources.items():
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, (path, call)
        unpickling = r"pickle\.loads?\(|np\.load\(|allow_pickle\s*=\s*True|joblib"
        assert not re.search(unpickling, text), path
        assert "trust_remote_code=True" not in text, path


def test_cifar_batches_are_unpickled_as_arrays_only() -> None:
    import io
    import os
    import pickle

    from etn_cli.datasets.safe_pickle import arrays_only_unpickling

    batch = {"data": np.arange(12, dtype=np.uint8).reshape(2, 6), "labels": [3, 1]}
    evil = pickle.dumps(os.system)  # would name a callable to run
    import torchvision.datasets.cifar as cifar

    with arrays_only_unpickling():
        loaded = cifar.pickle.load(io.BytesIO(pickle.dumps(batch, protocol=2)), encoding="latin1")
        np.testing.assert_array_equal(loaded["data"], batch["data"])
        with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle"):
            cifar.pickle.load(io.BytesIO(evil), encoding="latin1")
    assert cifar.pickle is pickle
