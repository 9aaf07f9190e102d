"""Reading a Parquet file that carries no checksum, so that a damaged one is one line.

A metrics file etn wrote is checked against its ``.sha256`` before the Parquet reader sees a
byte. A file without one (your own Parquet question split, a metrics file passed to ``etn report
FILE.parquet`` whose checksum is gone) may be damaged anywhere, and on some damaged files the
reader aborts the whole process or panics instead of raising (one flipped bit in 70 of a
question file's bits did in the attack of issue 31). So the bytes are parsed first in a child
process: a child that dies or fails is one line naming the file; only bytes the child parsed
are parsed here, where the reader's own errors (and a Rust panic, which pyo3 raises as a
``BaseException``) are one line too. The child costs one interpreter start (about half a
second), paid once per file content in a process.
"""

from __future__ import annotations

import hashlib
import io
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from etn_cli.errors import EtnError

PROBE = (
    "import io, sys\n"
    "import polars as pl\n"
    "pl.read_parquet(io.BytesIO(sys.stdin.buffer.read())).to_dicts()\n"
)
PROBE_SECONDS = 300
_probed: set[str] = set()  # sha256 of contents a child parsed


def read_parquet_checked(path: Path, fix: str) -> Any:
    """The Parquet file at ``path`` as a polars frame, or one line saying it is unreadable."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise EtnError(f"Cannot read {path} ({err.strerror}). {fix}") from None
    return parse_parquet_checked(data, path, fix)


def parse_parquet_checked(data: bytes, path: Path, fix: str) -> Any:
    """``data`` parsed as Parquet once a child process parsed it without dying."""
    digest = hashlib.sha256(data).hexdigest()
    if digest not in _probed:
        probe(data, path, fix)
        _probed.add(digest)
    return parse_parquet(data, path, fix)


def probe(data: bytes, path: Path, fix: str) -> None:
    """Parse ``data`` in a child process; one line when it fails or is killed."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE],
            input=data,
            capture_output=True,
            timeout=PROBE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EtnError(
            f"{path} is not a readable Parquet file (the reader ran {PROBE_SECONDS} s). {fix}"
        ) from None
    if done.returncode == 0:
        return
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        why = f"the Parquet reader was killed by {name} on it"
    else:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        why = lines[-1][:160] if lines else f"the reader exited {done.returncode}"
    raise EtnError(f"{path} is not a readable Parquet file ({why}). {fix}")


def parse_parquet(data: bytes, path: Path, fix: str) -> Any:
    """``data`` parsed as Parquet here, the reader's errors as one line."""
    import polars as pl

    try:
        return pl.read_parquet(io.BytesIO(data))
    except (OSError, ValueError, pl.exceptions.PolarsError) as err:
        raise unreadable(path, err, fix) from None
    except BaseException as err:
        if type(err).__name__ != "PanicException":  # pyo3's, raised from a Rust panic
            raise
        raise unreadable(path, err, fix) from None


def unreadable(path: Path, err: BaseException, fix: str) -> EtnError:
    first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
    return EtnError(f"{path} is not a readable Parquet file ({first}). {fix}")
