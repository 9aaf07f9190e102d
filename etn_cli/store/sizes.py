"""Sizes an input file declares, checked before anything is allocated for them.

An ``.npy`` header, an HDF5 dataset or a zip member says how large its array is; the reader
allocates that much before it reads a byte. A damaged or hostile file can claim 10**12 rows in
a few bytes, which ends in a ``MemoryError`` or in the machine swapping. A declared size must
fit in the bytes that hold it: uncompressed, at most the file's own size; compressed, at most
:data:`MAX_RATIO` times it (deflate cannot expand more than about 1,032-fold).
"""

from __future__ import annotations

from pathlib import Path

from etn_cli.errors import EtnError

MAX_RATIO = 1100


def check_declared(
    declared: int, available: int, compressed: bool, what: str, path: Path, fix: str
) -> None:
    """One line when ``declared`` bytes cannot come from ``available`` bytes of ``path``."""
    limit = available * (MAX_RATIO if compressed else 1)
    if declared > limit:
        raise EtnError(
            f"{what} in {path} declares {declared:,} bytes, but the file holds "
            f"{available:,}{' (compressed)' if compressed else ''}: its header is damaged or "
            f"not what it claims. {fix}".strip()
        )
