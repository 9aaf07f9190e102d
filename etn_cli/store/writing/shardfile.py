"""One HDF5 shard on disk: write it, look at its layout, read its values into preallocated arrays.

A shard holds ``hidden`` (N, D) float, ``logits`` (N, C) float, ``labels`` (N,) int,
``index`` (N,) int, optional ``layers/<name>`` (N, D_l) float, and the root attribute
``etn_format`` = 1. Reading happens in two passes: :func:`inspect_shard` checks names, shapes,
dtypes and the format without touching values, so the caller can allocate the whole split once;
:func:`read_shard_into` then reads each dataset in one call straight into its slice of those
arrays (no per-row access, no concatenation copy), checks the values against the checksum each
dataset records (:mod:`~etn_cli.store.writing.valuecheck`) and that the floats are finite.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.sizes import check_declared
from etn_cli.store.writing.checks import check_dtype, check_finite, check_ndim, describe
from etn_cli.store.writing.manifest import FORMAT_VERSION, check_format
from etn_cli.store.writing.valuecheck import ATTRIBUTE, recorded_checksum, value_checksum

REQUIRED = ("hidden", "logits", "labels", "index")
REREAD_HINT = "Delete the split folder and run etn extract again, or rewrite the shard."


@dataclass(frozen=True)
class ShardLayout:
    """What the first pass learned about a shard without reading its values."""

    file: str
    rows: int
    widths: dict[str, int]  # "hidden", "logits", "layers/<name>" -> number of columns
    dtypes: dict[str, np.dtype]  # every dataset -> dtype on disk
    checksums: dict[str, str | None] = field(default_factory=dict)  # dataset -> recorded value
    fletcher32: bool = False  # shards of etn 0.x's first checksummed format: HDF5 checks chunks

    @property
    def checksummed(self) -> bool:
        """Every dataset's values are checked on read (a recorded checksum, or HDF5's own)."""
        return self.fletcher32 or all(self.checksums.get(key) for key in self.dtypes)


def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write one shard so that its name only ever holds a whole, durable file.

    HDF5 builds the file in memory and Python writes the bytes to ``<path>.tmp``, fsyncs and
    renames them: HDF5 itself never touches the disk, because the library crashes the process
    when a write fails inside it (a full disk), where Python raises a clean ``OSError``. The
    bytes are the same for the same arrays, so a resumed extraction writes identical shards.
    """
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as handle:
        handle.attrs["etn_format"] = FORMAT_VERSION
        for name, array in arrays.items():
            # contiguous (the fastest read) with its values' checksum, checked on every read
            dataset = handle.create_dataset(name, data=array)
            dataset.attrs[ATTRIBUTE] = value_checksum(array)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(buffer.getbuffer())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_index(path: Path) -> np.ndarray:
    """The ``index`` dataset (N,) of one shard, as int64."""
    with open_shard(path, f"shard {path.parent.name}/{path.name}") as handle:
        return np.asarray(handle["index"][()], dtype=np.int64)


def list_shard_files(split_dir: Path) -> list[str]:
    """Names of the ``*.h5`` files in a folder, in natural order (shard-2 before shard-10)."""
    files = [p.name for p in Path(split_dir).glob("*.h5") if not p.name.startswith(".")]
    if not files:
        raise EtnError(
            f"Expected shard files (*.h5) or a manifest.json in {split_dir}, found neither. "
            "Run etn extract for this split, or write shards as docs/own-data.md ('Features you "
            "computed yourself') describes."
        )
    return sorted(files, key=_natural_key)


def inspect_shard(split_dir: Path, file: str) -> ShardLayout:
    """Check a shard's format attribute, dataset names, ranks and dtypes; read no values."""
    name = f"{Path(split_dir).name}/{file}"
    path = Path(split_dir) / file
    with open_shard(path, f"shard {name}") as handle:
        _check_format_attr(handle, name)
        datasets = _datasets(handle, name)
        found = {key: (d.shape, d.dtype) for key, d in datasets.items()}
        checksums = {key: recorded_checksum(d.attrs) for key, d in datasets.items()}
        fletcher32 = all(d.fletcher32 for d in datasets.values())
        packed = {key: d.compression is not None for key, d in datasets.items()}
    for key, (shape, dtype) in found.items():
        floating = key not in ("labels", "index")
        check_dtype(dtype, floating, describe(key), f"shard {name}")
        check_ndim(shape, 2 if floating else 1, describe(key), f"shard {name}")
        declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
        check_declared(declared, path.stat().st_size, packed[key], describe(key), path, REREAD_HINT)
    check_widths(found, name)
    rows = {key: shape[0] for key, (shape, _) in found.items()}
    if len(set(rows.values())) > 1:
        raise EtnError(
            f"Datasets in shard {name} have different row counts {rows}; expected one row per "
            f"sample in each. {REREAD_HINT}"
        )
    widths = {key: shape[1] for key, (shape, _) in found.items() if len(shape) == 2}
    dtypes = {key: dtype for key, (_, dtype) in found.items()}
    return ShardLayout(rows=rows["hidden"], file=file, widths=widths, dtypes=dtypes,
                       checksums=checksums, fletcher32=fletcher32)  # fmt: skip


def check_widths(found: dict[str, tuple], name: str) -> None:
    """At least one hidden unit and two classes: features of width 0 or a single logit would
    give a table of numbers that mean nothing."""
    hidden, logits = found["hidden"][0][1], found["logits"][0][1]
    if hidden < 1 or logits < 2:
        raise EtnError(
            f"Shard {name} holds hidden states of width {hidden} and {logits} logits per row; "
            f"expected at least 1 and 2 (a classifier's features and its class scores). "
            f"{REREAD_HINT}"
        )


def read_shard_into(
    split_dir: Path,
    layout: ShardLayout,
    out: dict[str, np.ndarray],
    start: int,
    checked_at_write: bool = False,
) -> None:
    """Read every dataset of one shard into ``out[key][start:start + rows]``, check the values
    against the checksums the shard records (:mod:`~etn_cli.store.writing.valuecheck`), and
    check that floats are finite.

    With ``checked_at_write`` (a split whose manifest etn wrote after checking every value) and
    checksums, the values are proven to be the ones checked then: the finite check is skipped
    (it costs as much as the checksums)."""
    name = f"{Path(split_dir).name}/{layout.file}"
    stop = start + layout.rows
    if layout.rows == 0:
        return
    with open_shard(Path(split_dir) / layout.file, f"shard {name}") as handle:
        for key, array in out.items():
            _read_checked(handle[key], array[start:stop], layout.checksums.get(key), name, key)
    if checked_at_write and layout.checksummed:
        return
    fix = 'Extract in float32 (dtype = "float32" in [backbone]) or check the backbone.'
    for key in layout.widths:
        check_finite(out[key][start:stop], describe(key), f"shard {name}", 0, fix)


def _read_checked(dataset: h5py.Dataset, out: np.ndarray, checksum, name: str, key: str) -> None:
    """Read ``dataset`` into ``out``; if a checksum is recorded, the values must match it."""
    if checksum is None or dataset.dtype == out.dtype:
        dataset.read_direct(out)  # HDF5 converts float16/int32 on the fly
        stored = out
    else:  # the checksum covers the values as stored
        stored = dataset[()]
        out[...] = stored
    if checksum is not None and value_checksum(stored) != checksum:
        raise EtnError(
            f"{describe(key)} in shard {name} do not match the checksum recorded when the "
            f"shard was written: the file is corrupt. {REREAD_HINT}"
        )


@contextlib.contextmanager
def open_shard(path: Path, where: str) -> Iterator[h5py.File]:
    """Open a shard read-only; a truncated or corrupt file becomes an :class:`EtnError`, also
    where it fails inside the ``with`` block (h5py raises ``KeyError`` when a damaged header
    cannot open an object that the caller knows is there)."""
    try:
        with h5py.File(path, "r") as handle:
            yield handle
    except (OSError, KeyError, RuntimeError) as error:
        raise EtnError(
            f"Expected {where} to be a readable HDF5 file, but reading it failed ({error}); it "
            f"may be truncated or corrupt. {REREAD_HINT}"
        ) from None


def _check_format_attr(handle: h5py.File, name: str) -> None:
    if "etn_format" not in handle.attrs:
        raise EtnError(
            f"Shard {name} has no root attribute etn_format; expected etn_format = "
            f"{FORMAT_VERSION}. Add it with h5py: f.attrs['etn_format'] = {FORMAT_VERSION}."
        )
    found = handle.attrs["etn_format"]
    check_format(found.item() if isinstance(found, np.generic) else found, f"Shard {name}")


def _datasets(handle: h5py.File, name: str) -> dict[str, h5py.Dataset]:
    """Return the required datasets and every ``layers/<name>`` dataset, by path."""
    missing = [key for key in REQUIRED if not isinstance(handle.get(key), h5py.Dataset)]
    if missing:
        raise EtnError(
            f"Shard {name} lacks the datasets {', '.join(missing)}; expected "
            f"{', '.join(REQUIRED)} (and optional layers/<name>). {REREAD_HINT}"
        )
    datasets = {key: handle[key] for key in REQUIRED}
    group = handle.get("layers")
    if isinstance(group, h5py.Group):
        for layer, item in group.items():
            if isinstance(item, h5py.Dataset):
                datasets[f"layers/{layer}"] = item
    return datasets


def _natural_key(name: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
