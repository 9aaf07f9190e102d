"""Writes the file system refuses (a full disk, a file-size limit or quota, a read-only or
foreign-owned data directory) are the user's to fix, not bugs: each becomes one EtnError line
saying where, why and what to do, and a stage checks that it may write before it starts."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from etn_cli.errors import EtnError
from etn_cli.store.atomic import TMP_SUFFIX

DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


DATA_DIR_ENV = "ETN_DATA_DIR"


def default_data_dir() -> Path:
    """``$ETN_DATA_DIR``, else ``$XDG_CACHE_HOME/etn``, else ``~/.cache/etn``: one cache per
    user, whatever the current directory (a cron job finds the same features)."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "etn"


def ensure_writable(folder: Path) -> None:
    """Create ``folder`` if needed and prove it takes a file; a refusal is one EtnError line."""
    folder = Path(folder)
    probe = folder / f".etn-write-probe-{secrets.token_hex(4)}{TMP_SUFFIX}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise storage_error(err, folder) from None


def storage_error(err: OSError, where: Path | None = None) -> EtnError:
    """Turn a refused write (permissions, read-only or full disk) into a one-line EtnError."""
    path = err.filename or where or "the data directory"
    reason = err.strerror or str(err)
    if err.errno in DISK_FULL:
        fix = (
            "Free disk space (or raise the file-size limit or quota) and run again; finished "
            "units and journaled shards are kept and reused"
        )
    elif err.errno in NOT_WRITABLE:
        fix = "Make it writable, or pass --data-dir with a writable folder"
    else:
        fix = "Check the file system and run again"
    return EtnError(f"Expected to write {path}, but the file system refused: {reason}. {fix}.")


def is_storage_error(err: BaseException) -> bool:
    """True for the refused writes that :func:`storage_error` explains (not for bugs)."""
    return isinstance(err, OSError) and err.errno in DISK_FULL | NOT_WRITABLE


@contextlib.contextmanager
def explained_storage_errors() -> Iterator[None]:
    """Re-raise a refused write (full disk, permissions) inside as a one-line EtnError."""
    try:
        yield
    except OSError as err:
        if not is_storage_error(err):
            raise
        raise storage_error(err) from None
