"""A checksum of a dataset's values, recorded in the shard when written and checked on every read.

HDF5's Fletcher-32 chunk checksums (what shards used first) cost more than the read itself
(about 2 GB/s on this machine, as does ``zlib.crc32``), which put a full read of a split at
0.46x ``numpy.load``. Shards are now contiguous, and each dataset carries the XXH3-128 digest of
its values as stored (the ``xxhash`` package, Yann Collet's xxHash: about 10 GB/s on one core
here, against 0.4 GB/s for BLAKE2b and 1.7 GB/s for CRC-32), over its shape, its dtype and its
bytes. A flipped bit, a truncated or swapped block, or values from another shard give another
digest with probability 1 - 2**-128; ``tests/test_integrity.py`` flips sampled single and
double bits and checks that each is caught.
"""

from __future__ import annotations

import numpy as np
import xxhash

ATTRIBUTE = "etn_checksum"  # on each dataset of a shard: "<SCHEME>:<hex digest>"
SCHEME = "xxh3-128"


def value_checksum(array: np.ndarray) -> str:
    """``"xxh3-128:<32 hex digits>"`` for the values of ``array`` as stored (little-endian, C
    order), its shape and its dtype."""
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    digest = xxhash.xxh3_128()
    digest.update(np.asarray(array.shape, "<i8").tobytes())
    digest.update(array.dtype.str.encode())
    digest.update(memoryview(array.reshape(-1).view(np.uint8)))
    return f"{SCHEME}:{digest.hexdigest()}"


def recorded_checksum(attrs) -> str | None:
    """The checksum an etn shard's dataset carries (h5py attributes), or None (older shards)."""
    found = attrs.get(ATTRIBUTE)
    if found is None:
        return None
    return found.decode() if isinstance(found, bytes) else str(found)
