"""Crash-safe writes of files and folders, and a lock per unit of work shared between processes.

A reader must never see half an artefact: files are written next to their final name and moved
into place with ``os.replace`` (atomic on one file system); folders are built under a private
``<final>.partial-<random>`` name and renamed when complete. A process killed half-way leaves at
most a ``.partial-`` folder behind, which :func:`remove_partials` clears while holding the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from etn_cli.errors import EtnError

PARTIAL_TAG = ".partial-"
LOCK_POLL_SECONDS = 0.05


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix.

    The bytes go to a temporary file in the same folder (the rename must not cross file systems),
    are fsynced so a crash cannot leave an empty file under the final name, then replace ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 honours the umask
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 with the same guarantees as :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(final: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a private folder next to ``final``; rename it to ``final`` if the block succeeds.

    On an exception the private folder is deleted and ``final`` is left untouched. If ``final``
    exists already this raises :class:`EtnError` unless ``replace`` is true; then the old folder
    is renamed aside, the new one renamed in, and the old one deleted, so readers see the old
    folder, briefly none, or the new one, but never a mixture.
    """
    final = Path(final)
    if final.exists() and not replace:
        raise EtnError(_exists_message(final))
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}{PARTIAL_TAG}{secrets.token_hex(4)}")
    partial.mkdir()
    try:
        yield partial
        _move_into_place(partial, final, replace)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def remove_partials(final: Path) -> list[Path]:
    """Delete ``<final>.partial-*`` folders left by killed runs; call it while holding the lock."""
    final = Path(final)
    stale = sorted(final.parent.glob(f"{final.name}{PARTIAL_TAG}*"))
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale


@contextlib.contextmanager
def unit_lock(path: Path, *, timeout: float | None = None) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``<path>.lock`` so one process at a time builds ``path``.

    A second process waits (forever, or ``timeout`` seconds before raising :class:`EtnError`).
    The kernel drops the lock when its holder dies, so a crash never leaves a stale lock. After
    acquiring it, the caller must check again whether the unit was completed meanwhile.
    """
    path = Path(path)
    lock_path = path.with_name(f"{path.name}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        _acquire(fd, path, lock_path, timeout)
        try:
            yield lock_path
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, path: Path, lock_path: Path, timeout: float | None) -> None:
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EtnError(
                    f"Expected to lock {lock_path} within {timeout:g} s, but another etn process "
                    f"is still building {path.name}. Wait for it to finish or stop it."
                ) from None
            time.sleep(min(LOCK_POLL_SECONDS, remaining))


def _move_into_place(partial: Path, final: Path, replace: bool) -> None:
    if not (replace and final.exists()):
        try:
            os.rename(partial, final)
        except OSError as error:  # another process finished the same folder first
            raise EtnError(_exists_message(final)) from error
        _fsync_dir(final.parent)
        return
    old = final.with_name(f"{final.name}.old-{secrets.token_hex(4)}")
    os.rename(final, old)
    try:
        os.rename(partial, final)
    except OSError:
        os.rename(old, final)
        raise
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _exists_message(final: Path) -> str:
    return (
        f"Expected to create {final}, but it already exists; pass --force to rebuild it, "
        "or delete it."
    )


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable; some file systems cannot fsync folders, which is harmless."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
