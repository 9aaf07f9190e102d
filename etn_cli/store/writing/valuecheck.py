"""A checksum of a dataset's values, recorded in the shard when written and checked on every read.

HDF5's Fletcher-32 chunk checksums (what shards used first) cost more than the read itself
(about 2 GB/s on this machine, as does ``zlib.crc32``), which put a full read of a split at
0.46x ``numpy.load``. This check runs at numpy's matrix-vector speed (5-7 GB/s) and is stronger
against one and two flipped bits:

* the values' bytes are cut into rows of :data:`ROW_WORDS` 64-bit words ``w[b, j]``;
* each row gets a multilinear hash ``r[b] = sum_j k[j] * w[b, j] mod 2**64`` with fixed odd
  keys ``k`` (the MULTILINEAR family of Lemire & Kaser, "Strongly universal string hashing is
  fast", The Computer Journal 2014);
* each column gets the XOR of its words ``x[j] = w[0, j] ^ w[1, j] ^ ...``;
* the digest is BLAKE2b-128 over ``r``, ``x`` and the bytes after the last whole row.

Every single flipped bit changes its row's hash (``k`` odd, so ``k * 2**i != 0 mod 2**64``).
Every pair of flipped bits is caught too: two in different columns change two column XORs;
two in one column but different rows change two row hashes; two in one word change its
column's XOR. Larger errors escape only if they cancel in both the row hashes and the column
XORs at once. Rows of 8 KiB keep each step inside the CPU's cache.
"""

from __future__ import annotations

import hashlib

import numpy as np

ATTRIBUTE = "etn_checksum"  # on each dataset of a shard: "<SCHEME>:<hex digest>"
SCHEME = "mlh1"
ROW_WORDS = 1024  # 64-bit words per row: 8 KiB
BLOCK_ROWS = 64  # rows hashed per step: 512 KiB, inside the L2 cache
# Fixed forever (part of the file format): derived from a name, not from a random generator
# whose stream could change between numpy versions; forced odd.
KEYS = np.frombuffer(hashlib.shake_128(b"etn value checksum v1").digest(8 * ROW_WORDS), "<u8") | 1


def value_checksum(array: np.ndarray) -> str:
    """``"mlh1:<32 hex digits>"`` for the values of ``array`` as stored (little-endian, C order)."""
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    raw = array.reshape(-1).view(np.uint8)
    whole = len(raw) // (8 * ROW_WORDS) * (8 * ROW_WORDS)
    words = raw[:whole].view("<u8").reshape(-1, ROW_WORDS)  # (rows, ROW_WORDS)
    columns = np.zeros(ROW_WORDS, np.uint64)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.asarray(array.shape, "<i8").tobytes())
    with np.errstate(over="ignore"):
        for start in range(0, len(words), BLOCK_ROWS):
            block = words[start : start + BLOCK_ROWS]
            # (rows,) multilinear hash per row, mod 2**64 (einsum: a little faster than matmul)
            digest.update(np.einsum("ij,j->i", block, KEYS))
            columns ^= np.bitwise_xor.reduce(block, axis=0)
    digest.update(columns)
    digest.update(raw[whole:])
    return f"{SCHEME}:{digest.hexdigest()}"


def recorded_checksum(attrs) -> str | None:  # noqa: ANN001
    """The checksum an etn shard's dataset carries (h5py attributes), or None (older shards)."""
    found = attrs.get(ATTRIBUTE)
    if found is None:
        return None
    return found.decode() if isinstance(found, bytes) else str(found)
