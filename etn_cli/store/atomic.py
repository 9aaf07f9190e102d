"""Crash-safe writes of files and folders, and a lock per unit of work shared between processes.

A reader must never see half an artefact: files are written next to their final name, fsynced
and moved into place with ``os.replace`` (atomic on one file system); folders are built under a
private ``<final>.partial-<random>`` name, fsynced and renamed when complete. A process killed
half-way leaves at most a ``.partial-`` folder or a ``.<name>.<random>.tmp`` file behind, which
the next process to hold the unit's lock clears (:func:`remove_partials`, :func:`remove_tmp`)
or, for extraction, resumes (:mod:`etn_cli.store.writing.journal`). The lock is an ``flock`` the
kernel releases when its holder dies, so a crash never leaves a lock to clear by hand.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from etn_cli.errors import EtnError

PARTIAL_TAG = ".partial-"
OLD_TAG = ".old-"
TMP_SUFFIX = ".tmp"
LOCK_SUFFIX = ".lock"
LOCK_POLL_SECONDS = 0.05
RENAME_EXCHANGE = 2  # renameat2 flag: swap two paths atomically (Linux >= 3.15)
AT_FDCWD = -100


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix.

    The bytes go to a temporary file in the same folder (the rename must not cross file systems),
    are fsynced so a crash cannot leave an empty file under the final name, then replace ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")
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
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 with the same guarantees as :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(final: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a private folder next to ``final``; rename it to ``final`` if the block succeeds.

    On an exception the private folder is deleted and ``final`` is left untouched. If ``final``
    exists already this raises :class:`EtnError` unless ``replace`` is true; then the new folder
    is swapped in for the old one (see :func:`publish`).
    """
    final = Path(final)
    if final.exists() and not replace:
        raise EtnError(exists_message(final))
    partial = new_partial(final)
    try:
        yield partial
        publish(partial, final, replace=replace)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def new_partial(final: Path) -> Path:
    """Create and return an empty private folder ``<final>.partial-<random>`` next to ``final``."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}{PARTIAL_TAG}{secrets.token_hex(4)}")
    partial.mkdir()
    return partial


def publish(partial: Path, final: Path, *, replace: bool = False) -> None:
    """Make the complete folder ``partial`` durable and rename it to ``final``.

    With ``replace`` and an existing ``final``, the two folders are exchanged in one atomic
    ``renameat2(RENAME_EXCHANGE)`` so a reader sees the old unit or the new one, never none;
    where the file system cannot exchange, the old folder is renamed aside first (a reader may
    then briefly find none). The old folder is deleted afterwards.
    """
    fsync_tree(partial)
    if replace and final.exists():
        _swap_in(partial, final)
        return
    try:
        os.rename(partial, final)
    except OSError as error:
        if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        raise EtnError(exists_message(final)) from None  # another process finished it first
    fsync_dir(final.parent)


def partial_folders(final: Path) -> list[Path]:
    """The private folders of ``final`` left by runs that did not finish, oldest name first."""
    final = Path(final)
    return sorted(p for p in final.parent.glob(f"{final.name}{PARTIAL_TAG}*") if p.is_dir())


def remove_partials(final: Path) -> list[Path]:
    """Delete ``<final>.partial-*`` folders left by killed runs; call it while holding the lock."""
    stale = partial_folders(final)
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale


def remove_tmp(path: Path) -> list[Path]:
    """Delete ``.<name>.<random>.tmp`` files that a killed :func:`atomic_write_bytes` left next
    to ``path``; call it while holding the lock of ``path``."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{path.name}.*{TMP_SUFFIX}"))
    for file in stale:
        file.unlink(missing_ok=True)
    return stale


@contextlib.contextmanager
def unit_lock(path: Path, *, timeout: float | None = None) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``<path>.lock`` so one process at a time builds ``path``.

    A second process waits (forever, or ``timeout`` seconds before raising :class:`EtnError`).
    The kernel drops the lock when its holder dies, so a crash never leaves a stale lock. After
    acquiring it, the caller must check again whether the unit was completed meanwhile. The
    empty ``.lock`` file stays: deleting it would let two processes lock two different files.
    """
    path = Path(path)
    lock_path = lock_path_of(path)
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


def lock_path_of(path: Path) -> Path:
    return Path(path).with_name(f"{Path(path).name}{LOCK_SUFFIX}")


def is_locked(path: Path) -> bool:
    """True while a live process holds the lock of ``path`` (the lock is not taken)."""
    lock_path = lock_path_of(path)
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a shared lock taken above
    return False


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and the folders themselves, so that a rename that
    publishes it can never expose empty files after a power cut."""
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for path in [folder, *(p for p in Path(folder).rglob("*") if p.is_dir())]:
        fsync_dir(path)


def fsync_dir(folder: Path) -> None:
    """Make a rename durable; some file systems cannot fsync folders, which is harmless."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
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


def _swap_in(partial: Path, final: Path) -> None:
    """Exchange ``partial`` (new) and ``final`` (old), then delete the old one."""
    if _exchange(partial, final):
        fsync_dir(final.parent)
        shutil.rmtree(partial, ignore_errors=True)  # ``partial`` now names the old folder
        return
    old = final.with_name(f"{final.name}{OLD_TAG}{secrets.token_hex(4)}")
    os.rename(final, old)
    try:
        os.rename(partial, final)
    except OSError:
        os.rename(old, final)
        raise
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """``renameat2(a, b, RENAME_EXCHANGE)``; False where the C library or file system lacks it."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def exists_message(final: Path) -> str:
    return (
        f"Expected to create {final}, but it already exists; pass --force to rebuild it, "
        "or delete it."
    )


def honour_umask(path: Path) -> None:
    """Give what a library wrote with private modes (safetensors writes files 0600, ``tempfile``
    folders 0700) the modes of every other file etn writes: 0666 and 0777 less the umask, so a
    group can share a data directory."""
    mask = os.umask(0)
    os.umask(mask)
    path = Path(path)
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)
