"""Write one split folder: batches of backbone outputs in, shards and a manifest out.

:class:`ShardWriter` builds the folder under a private ``<split>.partial-<random>`` name
(:mod:`etn_cli.store.atomic`), writes a shard (:mod:`~etn_cli.store.writing.shardfile`) each
time ``shard_rows`` rows are in, and renames the folder into place after writing the manifest
(:mod:`~etn_cli.store.writing.manifest`) last, so a split folder that exists is complete. Every
batch is checked at this boundary (:mod:`~etn_cli.store.writing.checks`). With ``resume`` (what
``extract`` uses, holding the unit's lock) every finished shard is recorded in a journal
(:mod:`~etn_cli.store.writing.journal`): a killed run leaves its finished shards behind and the
next run adopts them and skips the batches they cover. Without it, a failed run leaves nothing
behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.atomic import exists_message, new_partial, publish
from etn_cli.store.fingerprint import file_sha256, fingerprint_key
from etn_cli.store.writing.checks import check_finite, check_unique_index, checked_batch, describe
from etn_cli.store.writing.journal import Journal, open_journal
from etn_cli.store.writing.manifest import SHARD_NAME, build_manifest, save_manifest
from etn_cli.store.writing.shardfile import inspect_shard, read_index, write_shard

NAN_HINT = (
    'Check the backbone\'s outputs (try dtype = "float32" in [backbone]); nothing was written.'
)


class ShardWriter:
    """Append batches of backbone outputs; write shards of ``shard_rows`` rows and a manifest.

    >>> with ShardWriter(out / "test", fingerprint) as writer:  # doctest: +SKIP
    ...     for hidden, logits, labels, index in batches:
    ...         writer.append(hidden, logits, labels, index)

    ``resume`` (a dict of settings the shards depend on besides the fingerprint, such as the
    batch size) makes the writer resumable: each ``append`` is one batch, a shard is cut at the
    first batch boundary at or past ``shard_rows`` rows (so a shard never splits a batch), and
    a matching interrupted folder is adopted on entry; ``resumed_batches`` then says how many
    leading batches its shards hold, which the caller skips. Only use it holding the unit lock.
    """

    def __init__(
        self,
        split_dir: Path,
        fingerprint: dict[str, Any],
        shard_rows: int = 8192,
        provenance: dict[str, Any] | None = None,
        *,
        replace: bool = False,
        resume: dict[str, Any] | None = None,
    ) -> None:
        if shard_rows < 1:
            raise EtnError(f"Expected shard_rows >= 1, got {shard_rows}. Pass a positive count.")
        self.split_dir = Path(split_dir)
        self.fingerprint = fingerprint
        self.key = fingerprint_key(fingerprint)  # fails early if the fingerprint is not JSON-able
        self.shard_rows = shard_rows
        self.provenance = provenance
        self.replace = replace
        self.resume = resume
        self.manifest: dict[str, Any] | None = None  # set once the split is complete
        self.extra: dict[str, Any] = {}  # extra manifest fields (e.g. timing), set before exit
        self.rows = 0
        self.batches = 0  # append calls so far, adopted ones included
        self.resumed_batches = 0  # leading batches covered by adopted shards
        self.resumed_shards = 0
        self.resumed_index = np.empty(0, np.int64)  # (R,) their index, in writing order
        self._partial: Path | None = None  # the private folder, while inside the with block
        self._journal: Journal | None = None
        self._buffer: list[dict[str, np.ndarray]] = []
        self._buffered = 0
        self._shards: list[dict[str, Any]] = []
        self._widths: dict[str, int] | None = None  # "hidden", "logits", "layers/<name>" -> width
        self._indices: list[np.ndarray] = []

    def __enter__(self) -> ShardWriter:
        if self.split_dir.exists() and not self.replace:
            raise EtnError(exists_message(self.split_dir))
        if self.resume is None:
            self._partial = new_partial(self.split_dir)
            return self
        settings = {"key": self.key, "shard_rows": self.shard_rows, **self.resume}
        self._journal = open_journal(self.split_dir, settings)
        self._partial = self._journal.folder
        self._adopt(self._journal)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._partial is not None
        if kind is not None:
            self._discard(error)
            return
        try:
            self._finish()
            publish(self._partial, self.split_dir, replace=self.replace)
        except BaseException as failure:
            self._discard(failure)
            raise

    def _discard(self, error: BaseException | None) -> None:
        """After a failure: keep journaled shards for the next run unless the data itself was
        refused (an EtnError: nothing is kept), otherwise delete the private folder."""
        assert self._partial is not None
        keep = self._journal is not None and self._journal.entries
        if keep and not isinstance(error, EtnError):
            self._journal.tidy()
            self._journal.save()
        else:
            shutil.rmtree(self._partial, ignore_errors=True)

    def _adopt(self, journal: Journal) -> None:
        """Take over the shards an interrupted run journaled: their rows, index and columns."""
        if not journal.entries:
            return
        indices = [read_index(journal.folder / e["file"]) for e in journal.entries]
        layout = inspect_shard(journal.folder, journal.entries[0]["file"])
        self._widths = dict(layout.widths)
        self._shards = [{k: e[k] for k in ("file", "rows", "sha256")} for e in journal.entries]
        self._indices = indices
        self.rows = journal.rows
        self.batches = self.resumed_batches = journal.batches
        self.resumed_shards = len(journal.entries)
        self.resumed_index = np.concatenate(indices)

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
        self.batches += 1
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
        batch = checked_batch(hidden, logits, labels, index, layers, where, self._widths)
        for key, array in batch.items():
            if array.ndim == 2:
                check_finite(array, describe(key), where, self.rows, NAN_HINT)
        self._widths = {key: array.shape[1] for key, array in batch.items() if array.ndim == 2}
        return batch

    def _flush(self, final: bool) -> None:
        """Write full shards from the buffer; with ``final``, also the last partial one.

        A resumable writer writes the whole buffer (whole batches) as one shard instead.
        """
        merged = {key: np.concatenate([b[key] for b in self._buffer]) for key in self._buffer[0]}
        self._buffer = []
        if self.resume is not None:
            self._write(merged)
            self._buffered = 0
            return
        start = 0
        while self._buffered - start >= self.shard_rows or (final and start < self._buffered):
            stop = min(start + self.shard_rows, self._buffered)
            self._write({key: array[start:stop] for key, array in merged.items()})
            start = stop
        if start < self._buffered:
            self._buffer = [{key: array[start:].copy() for key, array in merged.items()}]
        self._buffered -= start

    def _write(self, arrays: dict[str, np.ndarray]) -> None:
        assert self._partial is not None
        name = SHARD_NAME.format(len(self._shards))
        write_shard(self._partial / name, arrays)
        rows = len(arrays["index"])
        entry = {"file": name, "rows": rows, "sha256": file_sha256(self._partial / name)}
        self._shards.append(entry)
        if self._journal is not None:
            first = self._journal.rows
            stop = first + rows
            self._journal.record(
                {**entry, "first_row": first, "stop_row": stop, "batches": self.batches}
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
        if self._journal is not None:
            self.manifest["resumed"] = {
                "shards": self.resumed_shards,
                "rows": len(self.resumed_index),
                "batches": self.resumed_batches,
            }
        assert self._partial is not None
        save_manifest(self._partial, self.manifest)
        if self._journal is not None:
            self._journal.close()
