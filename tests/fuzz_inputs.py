"""Seeded corruptions of every file format a user hands etn, and how one run on each is judged.

Shared by ``tests/test_fuzz_inputs.py`` (a small sample by default, a larger one under the
``slow`` marker) and ``benchmarks/bench_bad_inputs.py``. Each *scenario* builds a small valid
project around one file of one format (feature files, question files, images, image lists, a
shard folder's manifest) and names the ``etn`` command that reads it; each *corruption* turns
the file's bytes into damaged ones (bits flipped, cut short, bytes inserted, zeroed or replaced,
emptied) or into a hostile file of that format (a header claiming 10**12 rows, a 30000 x 30000
PNG, a line nested 100,000 deep, a byte that is not UTF-8, a label of 10**20).

A case *holds* when etn either accepts the file (exit 0: a flip in a question's text is a new
valid question) or refuses it in one ``error:`` line with exit status 2 and nothing in the data
directory added or changed. It *fails* on a traceback, a message of several lines, another
exit status, or files left behind by a refusal.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
from tiny_pipeline import causal_lm, image_folder, questions, resnet18, tiny_pipeline

VERDICTS = ("accepted", "refused", "traceback", "not one line", "files written", "other exit")
HELD = ("accepted", "refused")


# ------------------------------------------------------------------------ corruptions
def flip(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    raw = bytearray(data)
    offset = rng.randrange(len(raw))
    raw[offset] ^= 1 << rng.randrange(8)
    return bytes(raw)


def flip_header(data: bytes, rng: random.Random) -> bytes:
    """A flip in the first 256 bytes, where every format keeps its header."""
    raw = bytearray(data)
    if raw:
        raw[rng.randrange(min(len(raw), 256))] ^= 1 << rng.randrange(8)
    return bytes(raw)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(max(len(data), 1))]


def insert(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.randbytes(rng.randrange(1, 64)) + data[at:]


def zero_span(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(max(len(data), 1))
    span = rng.randrange(1, 512)
    return data[:at] + bytes(min(span, len(data) - at)) + data[at + span :]


def random_bytes(data: bytes, rng: random.Random) -> bytes:
    return rng.randbytes(len(data))


def empty(data: bytes, rng: random.Random) -> bytes:
    return b""


GENERIC: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "flip": flip,
    "flip in header": flip_header,
    "truncate": truncate,
    "insert": insert,
    "zero span": zero_span,
}
ALWAYS = {"random bytes": random_bytes, "empty": empty}


# ------------------------------------------------------------------------ hostile files
def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def rezip(data: bytes, member: str, change: Callable[[bytes], bytes]) -> bytes:
    """``data`` (a zip) with ``member``'s bytes changed, stored uncompressed."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as old, zipfile.ZipFile(out, "w") as new:
        for info in old.infolist():
            body = old.read(info)
            new.writestr(info.filename, change(body) if info.filename == member else body)
    return out.getvalue()


def huge_npy_header(data: bytes, rng: random.Random) -> bytes:
    """The ``hidden`` member's header claims 10**12 rows; 64 bytes of data follow it."""

    def claim(body: bytes) -> bytes:
        header = io.BytesIO()
        declared = {"descr": "<f4", "fortran_order": False, "shape": (10**12, 8)}
        np.lib.format.write_array_header_1_0(header, declared)
        return header.getvalue() + bytes(64)

    return rezip(data, "hidden.npy", claim)


def huge_safetensors_header(data: bytes, rng: random.Random) -> bytes:
    """A header of one tensor of 10**12 x 8 floats, with 64 bytes behind it."""
    header = json.dumps(
        {"hidden": {"dtype": "F32", "shape": [10**12, 8], "data_offsets": [0, 32 * 10**12]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + bytes(64)


def bomb_png(data: bytes, rng: random.Random) -> bytes:
    """A valid PNG header declaring 30000 x 30000 pixels (a decompression bomb)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def deep_json_line(data: bytes, rng: random.Random) -> bytes:
    return data + b"[" * 100_000 + b"]" * 100_000 + b"\n"


def latin1_byte(data: bytes, rng: random.Random) -> bytes:
    return data.replace(b"What", b"Wh\xe4t", 1)


def nul_in_csv(data: bytes, rng: random.Random) -> bytes:
    return data.replace(b"What", b"Wh\x00at", 1)


def huge_field_csv(data: bytes, rng: random.Random) -> bytes:
    return data.replace(b"What", b'"' + b"x" * 200_000 + b'"', 1)


def huge_label(data: bytes, rng: random.Random) -> bytes:
    return data.replace(b" 0\n", b" 100000000000000000000\n", 1)


def deep_manifest(data: bytes, rng: random.Random) -> bytes:
    return b"[" * 100_000 + b"]" * 100_000


def keyless_manifest(data: bytes, rng: random.Random) -> bytes:
    return b'{"kind": "etn-features", "format": 1}'


def list_manifest(data: bytes, rng: random.Random) -> bytes:
    return b"[]"


HOSTILE: dict[str, dict[str, Callable[[bytes, random.Random], bytes]]] = {
    "npz": {"random member": lambda d, r: rezip(d, "logits.npy", lambda b: r.randbytes(len(b)))},
    "npy": {"header claims 10**12 rows": huge_npy_header},
    "safetensors": {"header claims 10**12 rows": huge_safetensors_header},
    "h5": {},
    "parquet": {},
    "metrics parquet": {},
    "jsonl": {"deep nesting": deep_json_line, "latin-1 byte": latin1_byte},
    "csv": {"NUL byte": nul_in_csv, "huge field": huge_field_csv, "latin-1 byte": latin1_byte},
    "png": {"decompression bomb": bomb_png},
    "jpeg": {"decompression bomb": bomb_png},
    "image list": {"label 10**20": huge_label},
    "manifest.json": {
        "deep nesting": deep_manifest,
        "no keys": keyless_manifest,
        "a list": list_manifest,
    },
}


# ------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class Scenario:
    """A valid project around ``target``: ``args`` run etn on it, ``data`` is what it writes."""

    target: Path
    args: list[str]
    data: Path
    member: str | None = None  # the zip member that npy corruptions change


def feature_project(root: Path, suffix: str) -> Scenario:
    """adapt / test / ood feature files, imported by ``etn import``; the target is test."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(3, 8)).astype(np.float32)
    files = []
    for name in ("adapt", "test", "ood"):
        labels = rng.integers(0, 3, 30)
        hidden = (np.eye(3, 8)[labels] * 3 + rng.normal(size=(30, 8))).astype(np.float32)
        arrays = {"hidden": hidden, "logits": hidden @ weight.T, "labels": labels}
        path = root / "mine" / f"{name}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".npz":
            np.savez(path, **arrays)
        elif suffix == ".h5":
            import h5py

            with h5py.File(path, "w") as handle:
                for key, array in arrays.items():
                    handle[key] = array
        else:
            from safetensors.numpy import save_file

            save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))
        files.append(path)
    out = root / "out"
    return Scenario(files[1], ["import", *map(str, files), "-o", str(out)], out)


def question_project(root: Path, suffix: str, llama: Path) -> Scenario:
    """Question files; the target is the test split as JSONL, CSV or Parquet."""
    records = [
        {"question": f"What is {i} plus 1?", "choices": [str(i + k) for k in range(4)],
         "answer": i % 4}
        for i in range(8)
    ]  # fmt: skip
    folder = root / "questions"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    target = folder / f"test{suffix}"
    if suffix == ".jsonl":
        target.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif suffix == ".csv":
        rows = ["question,A,B,C,D,answer"]
        rows += [",".join([r["question"], *r["choices"], str(r["answer"])]) for r in records]
        target.write_text("\n".join(rows) + "\n")
    else:
        import polars as pl

        pl.DataFrame(records).write_parquet(target)
    pipeline = root / "questions.toml"
    pipeline.write_text(
        tiny_pipeline("questions", backbone=causal_lm(llama), data=questions(test=f"test{suffix}"))
    )
    data = root / "data"
    return Scenario(target, ["run", str(pipeline), "--dry-run", "-d", str(data)], data)


def image_project(root: Path, suffix: str, listed: bool = False) -> Scenario:
    """Two classes of tiny images for adapt and test; the target is one test image, or with
    ``listed`` the adaptation split's image list."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("adapt", "test"):
        for label in ("a", "b"):
            folder = root / "images" / split / label
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(2):
                pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"img{i}{suffix}")
    adapt = "adapt"
    if listed:
        lines = [f"adapt/{c}/img{i}{suffix} {k}" for k, c in enumerate("ab") for i in range(2)]
        (root / "images" / "adapt.txt").write_text("\n".join(lines) + "\n")
        adapt = "adapt.txt"
    pipeline = root / "images.toml"
    pipeline.write_text(
        tiny_pipeline("images", backbone=resnet18(2), data=image_folder(adapt=adapt))
    )
    target = root / "images" / ("adapt.txt" if listed else f"test/b/img1{suffix}")
    data = root / "data"
    return Scenario(target, ["extract", str(pipeline), "-d", str(data)], data)


def manifest_project(root: Path) -> Scenario:
    """Shard folders of your own with a manifest each; the target is test's manifest."""
    import h5py

    from etn_cli.store.reading.reader import write_manifest

    rng = np.random.default_rng(0)
    for seed, name in enumerate(("adapt", "test", "far")):
        labels = rng.integers(0, 3, 40)
        hidden = np.eye(3, 8)[labels] * 3 + rng.normal(size=(40, 8))
        folder = root / "mine" / name
        folder.mkdir(parents=True, exist_ok=True)
        with h5py.File(folder / "shard-00000.h5", "w") as handle:
            handle.attrs["etn_format"] = 1
            handle["hidden"] = hidden.astype(np.float32)
            handle["logits"] = (hidden[:, :3] * 2).astype(np.float32)
            handle["labels"] = labels.astype(np.int64)
            handle["index"] = np.arange(40, dtype=np.int64) + 1000 * seed
        write_manifest(folder, {"mine": name})
    pipeline = root / "own.toml"
    pipeline.write_text(
        'name = "own"\nseeds = [0]\n[features]\nadapt = "mine/adapt"\ntest = "mine/test"\n'
        'ood = ["mine/far"]\n[[heads]]\nname = "map"\n'
    )
    data = root / "data"
    return Scenario(
        root / "mine" / "test" / "manifest.json", ["train", str(pipeline), "-d", str(data)], data
    )


def metrics_project(root: Path) -> Scenario:
    """A metrics file without its checksum, passed to ``etn report FILE.parquet``."""
    import polars as pl

    rows = [
        {"pipeline": "p", "backbone": "b", "id_dataset": "d", "eval_set": eval_set, "task": task,
         "method": "map", "method_label": "MAP", "variant": "map", "family": "deterministic",
         "ood_group": None, "seed": seed, "metric": metric, "score": score, "value": value,
         "note": None, "head_key": "0" * 16, "metrics_key": f"{seed:016x}", "sweep": "{}"}
        for seed in (0, 1)
        for eval_set, task, metric, score, value in (
            ("d", "id", "acc", None, 0.9 + seed / 100),
            ("d", "id", "aupr", "mp", 0.95),
            ("far", "ood", "aupr", "mp", 0.7 + seed / 50),
            ("far", "ood", "auroc", "mp", 0.8),
        )
    ]  # fmt: skip
    target = root / "metrics.parquet"
    root.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(target)
    return Scenario(target, ["report", str(target), "-f", "csv"], root / "data")


def scenario(fmt: str, root: Path, llama: Path | None = None) -> Scenario:
    if fmt in ("npz", "npy"):
        found = feature_project(root, ".npz")
        return Scenario(
            found.target, found.args, found.data, "hidden.npy" if fmt == "npy" else None
        )
    if fmt in ("safetensors", "h5"):
        return feature_project(root, f".{fmt}")
    if fmt == "metrics parquet":
        return metrics_project(root)
    if fmt in ("parquet", "jsonl", "csv"):
        assert llama is not None
        return question_project(root, f".{fmt}", llama)
    if fmt in ("png", "jpeg"):
        return image_project(root, ".png" if fmt == "png" else ".jpg")
    if fmt == "image list":
        return image_project(root, ".png", listed=True)
    if fmt == "manifest.json":
        return manifest_project(root)
    raise ValueError(fmt)


FORMATS = tuple(HOSTILE)


# ------------------------------------------------------------------------ cases and verdicts
@dataclass(frozen=True)
class Case:
    fmt: str
    corruption: str
    seed: int = 0

    def __str__(self) -> str:
        return f"{self.fmt}: {self.corruption}" + (f" #{self.seed}" if self.seed else "")


def sample(per_format: int, seed: int = 0) -> list[Case]:
    """Per format: every hostile file, random bytes and an empty file, and ``per_format``
    seeded generic corruptions."""
    rng = random.Random(seed)
    cases = []
    for fmt in FORMATS:
        cases += [Case(fmt, name) for name in (*HOSTILE[fmt], *ALWAYS)]
        names = list(GENERIC)
        cases += [
            Case(fmt, names[i % len(names)], rng.randrange(1, 2**31)) for i in range(per_format)
        ]
    return cases


def corrupt(case: Case, found: Scenario) -> None:
    """Apply ``case`` to the scenario's file in place (or to its zip member)."""
    rng = random.Random(case.seed)
    change = {**GENERIC, **ALWAYS, **HOSTILE[case.fmt]}[case.corruption]
    data = found.target.read_bytes()
    if found.member is not None and case.corruption in {**GENERIC, **ALWAYS}:
        data = rezip(data, found.member, lambda body: change(body, rng))
    else:
        data = change(data, rng)
    found.target.write_bytes(data)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def run_etn(args: list[str]) -> tuple[int, str, str]:
    """``etn ARGS`` through the entry point in this process: exit status, stderr without
    progress lines, and the traceback of an exception that escaped (empty if none)."""
    import traceback

    from cli_runner import without_progress

    from etn_cli.cli.app import main

    err = io.StringIO()
    escaped = ""
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        with mock.patch.object(sys, "argv", ["etn", *args]):
            try:
                main()
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException as error:  # a bug: what the case is looking for
                code, escaped = -1, "".join(traceback.format_exception(error))
    return code, without_progress(err.getvalue()), escaped


def judge(found: Scenario, before: dict, code: int, err: str, escaped: str) -> str:
    if escaped or "Traceback" in err:
        return "traceback"
    if code == 0:
        return "accepted"
    if code != 2:
        return "other exit"
    if not (err.startswith("error: ") and err.count("\n") == 1):
        return "not one line"
    return "refused" if snapshot(found.data) == before else "files written"


def run_case(case: Case, root: Path, llama: Path | None = None) -> tuple[str, str]:
    """Build the scenario in ``root``, corrupt it, run, judge: ``(verdict, detail)``."""
    found = scenario(case.fmt, root, llama)
    corrupt(case, found)
    before = snapshot(found.data)
    code, err, escaped = run_etn(found.args)
    verdict = judge(found, before, code, err, escaped)
    detail = escaped.strip().splitlines()[-1] if escaped else err.strip()[:300]
    return verdict, detail
