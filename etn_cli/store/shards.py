"""The feature store: split folders of HDF5 shards written once by ``extract``, read by the rest.

A split folder holds one (backbone, dataset, split): ``shard-00000.h5``, ``shard-00001.h5``, ...
and ``manifest.json``. Each shard has the datasets ``hidden`` (N, D) float, ``logits`` (N, C)
float, ``labels`` (N,) int64 and ``index`` (N,) int64 (the sample's position in its source
split), optional ``layers/<name>`` (N, D_l) float, and the root attribute ``etn_format = 1``.
Users may write such shards themselves with h5py; :func:`read_split` accepts a folder without a
manifest, and :func:`write_manifest` adds one.

:class:`ShardWriter` builds the folder under a private ``<split>.partial-<random>`` name and
renames it into place after writing the manifest last, so a split folder that exists is
complete, and a failed run leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.atomic import atomic_dir
from etn_cli.store.checks import (
    as_float,
    as_int64,
    check_finite,
    check_unique_index,
    describe,
    to_numpy,
)
from etn_cli.store.classifier import load_classifier, save_classifier
from etn_cli.store.fingerprint import file_sha256, fingerprint_key
from etn_cli.store.manifest import SHARD_NAME, build_manifest, save_manifest
from etn_cli.store.reader import Features, read_split, write_manifest
from etn_cli.store.shardfile import write_shard

__all__ = [
    "Features",
    "ShardWriter",
    "load_classifier",
    "read_split",
    "save_classifier",
    "write_manifest",
]

NAN_HINT = "Check the backbone's outputs (try --dtype float32); nothing was written."


class ShardWriter:
    """Append batches of backbone outputs; write shards of ``shard_rows`` rows and a manifest.

    >>> with ShardWriter(out / "test", fingerprint) as writer:  # doctest: +SKIP
    ...     for hidden, logits, labels, index in batches:
    ...         writer.append(hidden, logits, labels, index)
    """

    def __init__(
        self,
        split_dir: Path,
        fingerprint: dict[str, Any],
        shard_rows: int = 65536,
        provenance: dict[str, Any] | None = None,
        *,
        replace: bool = False,
    ) -> None:
        if shard_rows < 1:
            raise EtnError(f"Expected shard_rows >= 1, got {shard_rows}. Pass a positive count.")
        self.split_dir = Path(split_dir)
        self.fingerprint = fingerprint
        self.key = fingerprint_key(fingerprint)  # fails early if the fingerprint is not JSON-able
        self.shard_rows = shard_rows
        self.provenance = provenance
        self.replace = replace
        self.manifest: dict[str, Any] | None = None  # set once the split is complete
        self.extra: dict[str, Any] = {}  # extra manifest fields (e.g. timing), set before exit
        self.rows = 0
        self._partial: Path | None = None  # the private folder, while inside the with block
        self._buffer: list[dict[str, np.ndarray]] = []
        self._buffered = 0
        self._shards: list[dict[str, Any]] = []
        self._widths: dict[str, int] | None = None  # "hidden", "logits", "layers/<name>" -> width
        self._indices: list[np.ndarray] = []

    def __enter__(self) -> ShardWriter:
        self._folder = atomic_dir(self.split_dir, replace=self.replace)
        self._partial = self._folder.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            try:
                self._finish()
            except BaseException as failure:
                self._folder.__exit__(type(failure), failure, failure.__traceback__)
                raise
        self._folder.__exit__(kind, error, tb)

    def append(
        self,
        hidden: Any,
        logits: Any,
        labels: Any,
        index: Any,
        layers: dict[str, Any] | None = None,
    ) -> None:
        """Add one batch: hidden (B, D), logits (B, C), labels (B,), index (B,), layers (B, D_l).

        Numpy arrays and torch tensors on any device are accepted; the batch is checked here, at
        the boundary, so a bad value names its batch rows instead of surfacing at read time.
        """
        assert self._partial is not None, "use ShardWriter in a with block"
        batch = self._validated(hidden, logits, labels, index, layers or {})
        rows = len(batch["index"])
        if rows == 0:
            return
        self._buffer.append(batch)
        self._buffered += rows
        self._indices.append(batch["index"])
        self.rows += rows
        if self._buffered >= self.shard_rows:
            self._flush(final=False)

    def _validated(
        self, hidden: Any, logits: Any, labels: Any, index: Any, layers: dict[str, Any]
    ) -> dict[str, np.ndarray]:
        where = f"the batch appended to split {self.split_dir.name!r}"
        batch = {
            "hidden": as_float(to_numpy(hidden), "Hidden states", where),  # (B, D)
            "logits": as_float(to_numpy(logits), "Logits", where),  # (B, C)
            "labels": as_int64(to_numpy(labels), "Labels", where),  # (B,)
            "index": as_int64(to_numpy(index), "Index", where),  # (B,)
        }
        for name, array in layers.items():
            _check_layer_name(name)
            key = f"layers/{name}"
            batch[key] = as_float(to_numpy(array), describe(key), where)
        self._check_shapes(batch, where)
        for key, array in batch.items():
            if array.ndim == 2:
                check_finite(array, describe(key), where, self.rows, NAN_HINT)
        return batch

    def _check_shapes(self, batch: dict[str, np.ndarray], where: str) -> None:
        shapes = {key: array.shape for key, array in batch.items()}
        wanted = {key: 1 if key in ("labels", "index") else 2 for key in batch}
        if any(len(shapes[key]) != ndim for key, ndim in wanted.items()):
            raise EtnError(
                f"Arrays in {where} have shapes {shapes}; expected 2-D hidden, logits and layers "
                "and 1-D labels and index. Pool or flatten them to one row per sample."
            )
        if len({shape[0] for shape in shapes.values()}) > 1:
            raise EtnError(
                f"Arrays in {where} have shapes {shapes}; expected the same number of rows in "
                "each. Pass one row per sample to every argument."
            )
        widths = {key: shape[1] for key, shape in shapes.items() if len(shape) == 2}
        if self._widths is not None and widths != self._widths:
            raise EtnError(
                f"Columns in {where} are {widths} but earlier batches had {self._widths}; "
                "expected every batch of a split to share them. Keep the backbone and layers fixed."
            )
        self._widths = widths

    def _flush(self, final: bool) -> None:
        """Write full shards from the buffer; with ``final``, also the last partial one."""
        merged = {key: np.concatenate([b[key] for b in self._buffer]) for key in self._buffer[0]}
        start = 0
        while self._buffered - start >= self.shard_rows or (final and start < self._buffered):
            stop = min(start + self.shard_rows, self._buffered)
            self._write({key: array[start:stop] for key, array in merged.items()})
            start = stop
        rest = {key: array[start:].copy() for key, array in merged.items()}
        self._buffer = [rest] if start < self._buffered else []
        self._buffered -= start

    def _write(self, arrays: dict[str, np.ndarray]) -> None:
        assert self._partial is not None
        name = SHARD_NAME.format(len(self._shards))
        write_shard(self._partial / name, arrays)
        rows = len(arrays["index"])
        self._shards.append(
            {"file": name, "rows": rows, "sha256": file_sha256(self._partial / name)}
        )

    def _finish(self) -> None:
        """Write the remaining rows, check the whole split, then the manifest, last."""
        if self.rows == 0:
            raise EtnError(
                f"Expected rows for split {self.split_dir.name!r}, but none were appended; "
                "nothing was written. Check that the dataset split is not empty."
            )
        fix = "Pass each sample's position in its source split once; nothing was written."
        check_unique_index(np.concatenate(self._indices), f"split {self.split_dir.name!r}", fix)
        if self._buffered:
            self._flush(final=True)
        assert self._widths is not None
        layers = [key.removeprefix("layers/") for key in self._widths if "/" in key]
        hidden_size, num_classes = self._widths["hidden"], self._widths["logits"]
        self.manifest = build_manifest(
            self.fingerprint, self._shards, hidden_size, num_classes, layers, self.provenance
        )
        self.manifest.update(self.extra)
        assert self._partial is not None
        save_manifest(self._partial, self.manifest)


def _check_layer_name(name: str) -> None:
    if not name or "/" in name or name.startswith("."):
        raise EtnError(
            f"Layer name {name!r} cannot name an HDF5 dataset; expected a plain name such as "
            "'block6'. Rename the layer."
        )
