"""The catalogue of bad inputs: every way a user can feed etn a wrong file or setting.

Each case builds its inputs in ``tmp_path``, runs one ``etn`` command through the real entry
point (``etn_cli.cli.app.main``, so the exit status is the one a shell sees) and checks three
things: the message is one line on stderr naming what was expected, what was found and how to
fix it (key phrases below); the exit status is 2; and the data directory is unchanged, file by
file (size and modification time), lock files included: inputs are checked and the model is
loaded before any unit's lock is taken.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import pytest
import torch
from cli_runner import without_progress
from llm_fixtures import make_adapter, make_llama
from tiny_pipeline import TINY_MCQA, causal_lm, fake_data, resnet18, tiny_pipeline

from etn_cli.cli.app import main
from etn_cli.stages.run import run_pipeline
from etn_cli.store.reading.reader import write_manifest

REPO = Path(__file__).resolve().parents[1]


def digits_pipeline(
    folder: Path,
    extra: str = "",
    *,
    name: str = "bad",
    backbone: str = "digits_cnn",
    id: str = "digits",
    adapt: str = "adapt",
    ood: str = "digits_noise",
    head: str = "etn",
) -> Path:
    """The digits pipeline with one thing wrong: a name, a split, or ``extra`` lines of the
    last head's settings."""
    data = {"id": id, "adapt": adapt, "ood": [ood], "batch_size": 64}
    heads = ("map", {"name": head, "epochs": 2, "batch_size": 64})
    path = folder / "bad.toml"
    text = tiny_pipeline(name, backbone={"name": backbone, "epochs": 2}, data=data, heads=heads)
    path.write_text(text + extra)
    return path


def edited(path: Path, old: str, new: str) -> Path:
    """``path`` with its first ``old`` replaced by ``new``."""
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    return path


def snapshot(data: Path, allowed: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file under ``data`` (lock files too) with its size and modification time, but
    those matching a glob pattern of ``allowed``."""
    if not data.exists():
        return {}
    return {
        str(p.relative_to(data)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in data.rglob("*")
        if p.is_file() and not any(p.relative_to(data).match(glob) for glob in allowed)
    }


def etn(capsys: pytest.CaptureFixture, *args: str | Path) -> tuple[int, str]:
    """Run ``etn *args`` through the real entry point; return (exit status, stderr)."""
    capsys.readouterr()
    with mock.patch.object(sys, "argv", ["etn", *map(str, args)]):
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, without_progress(capsys.readouterr().err)


# ------------------------------------------------------------------------ shared inputs
@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished digits run (pipeline, data dir), copied by the cases that damage it."""
    root = tmp_path_factory.mktemp("finished")
    pipeline = digits_pipeline(root, name="good")
    outcome = run_pipeline(pipeline, root / "data")
    assert outcome.ok, outcome.message
    return pipeline, root / "data"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("llama"))


def copy_finished(request: pytest.FixtureRequest, tmp: Path, drop_metrics: bool) -> Path:
    """A copy of the finished run's data dir (without its metrics, so evaluate has work)."""
    pipeline, data = request.getfixturevalue("finished")
    shutil.copytree(data, tmp / "data")
    if drop_metrics:
        shutil.rmtree(tmp / "data" / "metrics")
    target = tmp / "good.toml"
    target.write_text(pipeline.read_text())
    return target


def write_shard(path: Path, n: int = 40, d: int = 8, c: int = 3, seed: int = 0, **arrays) -> None:
    """A shard in the README's format from "someone else's model", with ``arrays`` replaced."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    hidden = np.eye(c, d)[labels] * 3 + rng.normal(size=(n, d))
    values = {
        "hidden": hidden.astype(np.float32),
        "logits": (hidden[:, :c] * 2).astype(np.float32),
        "labels": labels.astype(np.int64),
        "index": np.arange(n, dtype=np.int64) + 1000 * seed,
    } | arrays
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as handle:
        handle.attrs["etn_format"] = arrays.pop("etn_format", 1)
        for key, array in values.items():
            if key != "etn_format":
                handle[key] = array


def byof_pipeline(tmp: Path, **folders: dict) -> Path:
    """Shards for adapt / test / far written with ``write_shard(**folders[name])``, and a
    pipeline file naming them."""
    for seed, name in enumerate(("adapt", "test", "far")):
        write_shard(tmp / "mine" / name / "shard-00000.h5", seed=seed, **folders.get(name, {}))
    path = tmp / "byof.toml"
    path.write_text(
        'name = "byof"\nseeds = [0]\n[features]\nadapt = "mine/adapt"\ntest = "mine/test"\n'
        'ood = ["mine/far"]\n[[heads]]\nname = "etn"\nepochs = 2\n[[heads]]\nname = "map"\n'
    )
    return path


def llm_pipeline(tmp: Path, model: Path, **backbone: object) -> Path:
    path = tmp / "llm.toml"
    data = TINY_MCQA | {"batch_size": 16}
    path.write_text(tiny_pipeline("llm", backbone=causal_lm(model, **backbone), data=data))
    return path


# ------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Case:
    """A bad input: ``setup(tmp, request)`` writes it and returns the pipeline (or data dir)
    for ``command``; the error must contain every one of ``phrases``."""

    command: str
    setup: Callable[[Path, pytest.FixtureRequest], Path]
    phrases: tuple[str, ...]
    leaves: tuple[str, ...] = ()  # glob patterns of files the refused run may leave


def _damaged_copy(damage: Callable[[Path], None]) -> Callable:
    def setup(tmp: Path, request: pytest.FixtureRequest) -> Path:
        pipeline = copy_finished(request, tmp, drop_metrics=True)
        damage(tmp / "data")
        return pipeline

    return setup


def _flip_byte(data: Path) -> None:
    shard = sorted(data.glob("features/*/digits.test-*/shard-00000.h5"))[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))


def _newer_manifest(data: Path) -> None:
    manifest = sorted(data.glob("features/*/digits.test-*/manifest.json"))[0]
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 2}))


def _foreign_checkpoint(data: Path, update_record: bool) -> None:
    """Replace the ETN head's weights by tensors of another shape (a checkpoint of some other
    head); with ``update_record`` also its recorded checksum, as a tool rewriting it would."""
    from safetensors.torch import save_file

    head = next(p for p in sorted(data.glob("heads/etn-*")) if p.is_dir())
    save_file({"scale.weight": torch.zeros(3, 3)}, head / "weights.safetensors")
    if update_record:
        from etn_cli.store.artefacts.headfiles import head_checksums
        from etn_cli.store.artefacts.sealed import seal_record

        record = json.loads((head / "train.json").read_text())
        record["files"] = head_checksums(head)
        (head / "train.json").write_text(json.dumps(seal_record(record)))  # resealed as well


def _truncated_shard(tmp: Path, request: pytest.FixtureRequest) -> Path:
    pipeline = byof_pipeline(tmp)
    shard = tmp / "mine" / "adapt" / "shard-00000.h5"
    shard.write_bytes(shard.read_bytes()[:900])  # what a killed writer leaves
    return pipeline


def _two_class_counts(tmp: Path, request: pytest.FixtureRequest) -> Path:
    pipeline = byof_pipeline(tmp)
    write_shard(tmp / "mine" / "adapt" / "shard-00001.h5", c=4, seed=7)
    return pipeline


def _different_backbones(tmp: Path, request: pytest.FixtureRequest) -> Path:
    pipeline = byof_pipeline(tmp)
    for name, model in (("adapt", "resnet50"), ("test", "resnet50"), ("far", "vgg16")):
        write_manifest(tmp / "mine" / name, {"backbone": {"name": model}, "split": name})
    return pipeline


def _pickled_model(tmp: Path, request: pytest.FixtureRequest) -> Path:
    import torchvision

    torch.save(torchvision.models.resnet18(num_classes=4), tmp / "model.pt")  # a whole module
    path = tmp / "vision.toml"
    backbone = resnet18(None, weights="model.pt")  # the class count from the saved module
    path.write_text(
        tiny_pipeline("vision", backbone=backbone, data=fake_data(size=4, batch_size=None))
    )
    return path


def _remote_code(tmp: Path, request: pytest.FixtureRequest) -> Path:
    folder = tmp / "custom"
    folder.mkdir()
    config = {"model_type": "etn_custom_lm", "auto_map": {"AutoConfig": "modeling.Config"}}
    (folder / "config.json").write_text(json.dumps(config))
    return llm_pipeline(tmp, folder)


def _not_single_tokens(tmp: Path, request: pytest.FixtureRequest) -> Path:
    llama = request.getfixturevalue("llama")
    return llm_pipeline(tmp, llama, letters=["W", "X", "Y", "Z"])


def _foreign_adapter(tmp: Path, request: pytest.FixtureRequest) -> Path:
    llama = request.getfixturevalue("llama")
    wider = make_adapter(make_llama(tmp / "wider", hidden=48), tmp / "adapter")
    return llm_pipeline(tmp, llama, adapter=wider)


CASES: dict[str, Case] = {
    # names: unknown ones are caught while planning, before any backbone is built
    "unknown backbone": Case(
        "extract",
        lambda tmp, r: digits_pipeline(tmp, backbone="digits_cnm"),
        ("Unknown backbone 'digits_cnm'", "Did you mean: digits_cnn?", "Available:"),
    ),
    "unknown dataset": Case(
        "extract",
        lambda tmp, r: digits_pipeline(tmp, id="digts"),
        ("Unknown dataset 'digts'", "Did you mean: digits", "Available:"),
    ),
    "unknown OOD dataset": Case(
        "extract",
        lambda tmp, r: digits_pipeline(tmp, ood="digits_unsen"),
        ("Unknown dataset 'digits_unsen'", "Did you mean: digits_unseen", "Available:"),
    ),
    "unknown head": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, head="etm"),
        ("Unknown head 'etm'", "Did you mean: etn", "Available:"),
    ),
    "unknown split": Case(
        "extract",
        lambda tmp, r: digits_pipeline(tmp, adapt="adpt"),
        ("has no split 'adpt'", "Did you mean 'adapt'?", "Available: train, adapt, test"),
    ),
    "unknown OOD split": Case(
        "extract",
        lambda tmp, r: digits_pipeline(tmp, ood="digits_noise:tset"),
        ("'digits_noise' has no split 'tset'", "Did you mean 'test'?", "Available: test"),
    ),
    "unknown top-level key": Case(
        "extract",
        lambda tmp, r: edited(digits_pipeline(tmp), "seeds = [0]", "sed = [0]"),
        ("Unknown key 'sed'", "Did you mean 'seeds'?", "Allowed top-level keys:"),
    ),
    "unknown [data] key": Case(
        "extract",
        lambda tmp, r: edited(digits_pipeline(tmp), "batch_size = 64\n[[", "batchsize = 64\n[["),
        ("Unknown key 'batchsize'", "Did you mean 'batch_size'?", "Allowed keys:"),
    ),
    "unknown head setting": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, extra="prior_mod = 5\n"),
        ("Unknown key 'prior_mod'", "Did you mean 'prior_mode'?", "Allowed keys:"),
    ),
    "unknown backbone option": Case(
        "extract",
        lambda tmp, r: edited(digits_pipeline(tmp), "epochs = 2\n[data]", "chanels = 8\n[data]"),
        ("Unknown key 'chanels'", "Did you mean 'channels'?", "Allowed keys:"),
    ),
    # ranges of head settings (config.RANGES): one line naming the key, the range and the value
    "etn's nu at 1": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, extra="nu = 1.0\n"),
        ("key 'nu' must be a number in (1, 1e8], got 1.0", "Fix the value"),
    ),
    "warmup over the whole run": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, extra="warmup_fraction = 1.0\n"),
        ("key 'warmup_fraction' must be a fraction of the epochs in [0, 1), got 1.0",),
    ),
    "negative warmup": Case(
        "run",
        lambda tmp, r: digits_pipeline(tmp, extra="warmup_fraction = -0.1\n"),
        ("key 'warmup_fraction' must be a fraction of the epochs in [0, 1), got -0.1",),
    ),
    "DUQ with no centroid size": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, head="duq", extra="centroid_size = 0\n"),
        ("key 'centroid_size' must be an integer in 1 .. 65,536, got 0",),
    ),
    "SNGP with a zero length scale": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, head="sngp", extra="length_scale = 0.0\n"),
        ("key 'length_scale' must be a number in (0, 1e6], got 0.0",),
    ),
    # types
    "text where a number belongs": Case(
        "extract",
        lambda tmp, r: edited(digits_pipeline(tmp), "batch_size = 64\n[[", 'batch_size = "64"\n[['),
        ("key 'batch_size' expected int, got '64' (str)", "Fix the value's type"),
    ),
    "fraction where an integer belongs": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, extra="mc_samples = 2.5\n"),
        ("key 'mc_samples' expected int, got 2.5", "Fix the value's type"),
    ),
    "seeds not a list": Case(
        "train",
        lambda tmp, r: edited(digits_pipeline(tmp), "seeds = [0]", 'seeds = "0"'),
        ("seeds must be a non-empty list of integers, got '0'", "seeds = [0, 1, 2]"),
    ),
    "invalid TOML": Case(
        "extract",
        lambda tmp, r: edited(digits_pipeline(tmp), 'name = "bad"', "name = [bad"),
        ("is not valid TOML", "Fix the syntax"),
    ),
    "missing pipeline file": Case(
        "extract",
        lambda tmp, r: tmp / "nowhere.toml",
        ("nowhere.toml does not exist", "etn ls pipelines"),
    ),
    "missing feature folder": Case(
        "train",
        lambda tmp, r: edited(byof_pipeline(tmp), "mine/far", "mine/gone"),
        ("mine/gone", "does not exist", "Point it at a folder of shard-*.h5 files"),
    ),
    # paths that would leave the data directory
    "pipeline name with ..": Case(
        "extract",
        lambda tmp, r: digits_pipeline(tmp, name="../../escape"),
        ("name must be letters, digits, '-' or '_'", "'../../escape'", "Rename it"),
    ),
    "pipeline name with /": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, name="a/b"),
        ("name must be letters, digits, '-' or '_'", "'a/b'", "Rename it"),
    ),
    "dataset name with ..": Case(
        "extract",
        lambda tmp, r: digits_pipeline(tmp, ood="../digits"),
        ("Unknown dataset '../digits'", "Available:"),
    ),
    "head name with /": Case(
        "train",
        lambda tmp, r: digits_pipeline(tmp, head="../heads/etn"),
        ("Unknown head '../heads/etn'", "Available:"),
    ),
    # values inside shards
    "NaN in logits": Case(
        "train",
        lambda tmp, r: byof_pipeline(
            tmp, adapt={"logits": np.where(np.arange(120).reshape(40, 3) == 7, np.nan, 1.0)}
        ),
        ("Logits in shard adapt/shard-00000.h5 contain 1 NaN value (row 2)", "float32"),
    ),
    "infinite hidden state": Case(
        "train",
        lambda tmp, r: byof_pipeline(
            tmp, adapt={"hidden": np.where(np.arange(320).reshape(40, 8) == 90, np.inf, 0.5)}
        ),
        ("Hidden states in shard adapt/shard-00000.h5 contain 1 infinite value (row 11)",),
    ),
    "labels out of range": Case(
        "train",
        lambda tmp, r: byof_pipeline(tmp, test={"labels": np.arange(40) % 6}),
        ("Labels of the ID test set lie in 0..5", "expected labels in 0..2", "Map the labels"),
    ),
    "class-count mismatch between shards": Case(
        "train",
        _two_class_counts,
        ("shard-00001.h5 has columns", "expected every shard of a split to share them"),
    ),
    "hidden size mismatch": Case(
        "train",
        lambda tmp, r: byof_pipeline(tmp, far={"hidden": np.ones((40, 16), np.float32)}),
        ("OOD set 'far' has hidden size 16", "adaptation set has 8", "same backbone"),
    ),
    "ID and OOD shards from different backbones": Case(
        "train",
        _different_backbones,
        ("OOD set 'far'", "extracted by backbone 'vgg16'", "by 'resnet50'", "features of one"),
    ),
    "empty OOD set": Case(
        "train",
        lambda tmp, r: byof_pipeline(
            tmp,
            far={
                "hidden": np.zeros((0, 8), np.float32),
                "logits": np.zeros((0, 3), np.float32),
                "labels": np.zeros(0, np.int64),
                "index": np.zeros(0, np.int64),
            },
        ),
        ("OOD set 'far'", "holds no rows", "expected at least one sample"),
    ),
    "single-class evaluation set": Case(
        "train",
        lambda tmp, r: byof_pipeline(tmp, test={"labels": np.ones(40, np.int64)}),
        ("ID test set", "holds only class 1", "expected at least two classes"),
    ),
    "hidden states of width 0": Case(
        "train",
        lambda tmp, r: byof_pipeline(tmp, far={"hidden": np.zeros((40, 0), np.float32)}),
        ("far/shard-00000.h5 holds hidden states of width 0", "expected at least 1 and 2"),
    ),
    "constant scores": Case(
        "train",
        lambda tmp, r: byof_pipeline(tmp, adapt={"logits": np.ones((40, 3), np.float32)}),
        ("Logits of the adaptation set", "same in all 40 rows", "every score is constant"),
    ),
    "truncated shard": Case(
        "train",
        _truncated_shard,
        ("adapt/shard-00000.h5", "may be truncated or corrupt", "rewrite the shard"),
    ),
    "shard from a newer format": Case(
        "train",
        lambda tmp, r: byof_pipeline(tmp, adapt={"etn_format": 2}),
        ("newer etn (format 2); this etn reads format 1", "Upgrade etn"),
    ),
    "corrupted shard": Case(
        "evaluate",
        _damaged_copy(_flip_byte),
        ("shard-00000.h5 has sha256", "the file changed or is corrupt", "Delete the split"),
        leaves=("metrics/*/*.lock",),  # evaluate reads the shards under the metrics' lock
    ),
    "manifest from a newer format": Case(
        "evaluate",
        _damaged_copy(_newer_manifest),
        ("newer etn (format 2); this etn reads format 1", "Upgrade etn"),
    ),
    "checkpoint that does not match its head": Case(
        "evaluate",
        _damaged_copy(lambda data: _foreign_checkpoint(data, update_record=True)),
        ("weights.safetensors does not match head 'etn'", "etn train --force"),
    ),
    "changed checkpoint": Case(
        "evaluate",
        _damaged_copy(lambda data: _foreign_checkpoint(data, update_record=False)),
        ("weights.safetensors has sha256", "train.json records", "run etn train again"),
    ),
    # models
    "answer letters that are not single tokens": Case(
        "extract", _not_single_tokens, ("not single tokens",)
    ),
    "adapter that does not fit the model": Case(
        "extract", _foreign_adapter, ("does not fit", "Use an adapter trained on this base model")
    ),
    "pickled weights needing weights_only=False": Case(
        "extract", _pickled_model, ("cannot be read with torch.load(weights_only=True)", "Re-save")
    ),
    "model needing remote code": Case("extract", _remote_code, ("trust_remote_code = true",)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_clear_line_exit_2_and_changes_nothing(
    name: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture
) -> None:
    check_case(CASES[name], tmp_path, request, capsys)


def check_case(
    case: Case, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture
) -> None:
    """Run the case's command; one error line with its phrases, exit 2, nothing changed."""
    pipeline = case.setup(tmp_path, request)
    data = tmp_path / "data"
    before = snapshot(data)
    code, err = etn(capsys, case.command, pipeline, "--data-dir", data)
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for phrase in case.phrases:
        assert phrase in err, f"{phrase!r} not in {err!r}"
    assert snapshot(data, case.leaves) == before


def test_the_catalogue_covers_at_least_25_cases() -> None:
    assert len(CASES) + len(ENVIRONMENT_CASES) >= 25


# ------------------------------------------------------------------------ the environment
ENVIRONMENT_CASES = ("data directory that is not writable", "disk that fills up")


@pytest.fixture
def read_only(tmp_path: Path):
    """A data directory nobody may write to; as root, the immutable attribute does it."""
    data = tmp_path / "data"
    data.mkdir()
    if os.geteuid() != 0:
        data.chmod(0o555)
        yield data
        data.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(data)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr: cannot make a folder read-only")
    yield data
    subprocess.run(["chattr", "-i", str(data)], check=True)


def test_data_directory_that_is_not_writable(
    read_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pipeline = digits_pipeline(tmp_path, name="good")
    code, err = etn(capsys, "extract", pipeline, "--data-dir", read_only)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "Expected to write" in err and str(read_only) in err
    assert "Make it writable, or pass --data-dir with a writable folder" in err
    assert snapshot(read_only) == {}


def test_disk_that_fills_up_during_extraction(finished: tuple[Path, Path], tmp_path: Path) -> None:
    """A file-size limit makes the first shard's write fail with EFBIG, as a full disk fails
    with ENOSPC: one line, exit 2, no split folder, no half-written file."""
    data = tmp_path / "data"
    shutil.copytree(finished[1] / "backbones", data / "backbones")  # the CNN is already built
    pipeline = edited(digits_pipeline(tmp_path, name="good"), "batch_size = 64", "shard_rows = 999")
    before = snapshot(data)
    limit = 20_000  # bytes: the journal fits, a shard of 190 x 71 floats does not

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "etn_cli", "extract", str(pipeline), "-d", str(data)],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=limit_file_size,
    )
    assert done.returncode == 2, done.stderr
    err = without_progress(done.stderr)
    assert err.startswith("error: Expected to write") and err.count("\n") == 1
    assert "File too large" in err and "Free disk space" in err
    # no split folder, no partial shard, no temporary file: only the lock of the split that was
    # being written (lock files stay, see etn_cli.store.atomic.unit_lock)
    assert snapshot(data, ("features/*/digits.adapt-*.lock",)) == before


def test_disk_that_fills_up_while_head_weights_are_written(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    """The head's weights are serialised in memory and written by Python, so a full disk (a
    file-size limit here) is the one storage line, not a safetensors error; no head folder."""
    pipeline, source = finished
    data = tmp_path / "data"
    shutil.copytree(source, data, ignore=shutil.ignore_patterns("heads", "metrics", "reports"))
    before = snapshot(data)
    limit = 16_000  # bytes: a head.json fits, ETN's weights (two MLPs of width 256) do not

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "etn_cli", "train", str(pipeline), "-d", str(data)],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=limit_file_size,
    )
    err = without_progress(done.stderr)
    assert done.returncode == 2 and err.count("\n") == 1, done.stderr
    assert err.startswith("error: Expected to write") and "File too large" in err
    assert "SafetensorError" not in done.stderr
    assert not [p for p in (data / "heads").iterdir() if p.is_dir() and p.name.startswith("etn-")]
    left = {k for k in snapshot(data) if k not in before}
    assert all(k.endswith(".lock") or k.startswith("heads/map-") for k in left), left
