"""The store: every file etn writes under a data directory, and how it is read back.

Read it in this order; each group may import the ones above it, never those below.

**Ground rules, for every artefact** (modules of this package)

* :mod:`~etn_cli.store.fingerprint` content keys: canonical JSON, short sha256 keys, file hashes.
* :mod:`~etn_cli.store.atomic` crash-safe files and folders (a private name, fsync, rename),
  and the kernel lock that lets one process at a time build a unit.
* :mod:`~etn_cli.store.storage` a write the file system refuses (full disk, read-only) as
  one line, and the check that a folder takes files before a stage starts.

**Writing a split** (:mod:`etn_cli.store.writing`): a split folder holds one (backbone,
dataset, split) as ``shard-00000.h5``, ``shard-00001.h5``, ... and ``manifest.json``.

* ``shardfile`` one HDF5 shard: its datasets and format attribute, written byte-identically.
* ``checks`` the boundary checks on feature arrays (dtype, shape, finite values, unique index).
* ``manifest`` ``manifest.json``, written last, so a split folder that exists is complete.
* ``writer`` :class:`ShardWriter`: batches in, shards and manifest out, in a private folder.
* ``journal`` a killed extraction resumes at its last finished shard.
* ``pieces`` under torchrun: how a split is shared out in pieces, and one rank's writer.
* ``merge`` rank 0 merges every rank's pieces into the split a single process would write.

**Reading a split** (:mod:`etn_cli.store.reading`)

* ``reader`` :func:`read_split` checks a split against its manifest on every read;
  :func:`check_split` for ``etn verify``; :func:`write_manifest` for your own shards.
* ``consistency`` checks across the splits of one pipeline before ``train`` or ``evaluate``.

**Other artefacts** (:mod:`etn_cli.store.artefacts`)

* ``classifier`` the backbone's final layer, saved once per backbone (safetensors).
* ``headfiles`` a trained head's folder and the checksums in its ``train.json``.
* ``predictions`` the per-row predictions ``evaluate`` keeps beside each metrics file.

**Maintenance** (:mod:`etn_cli.store.maintenance`)

* ``leftovers`` what interrupted runs leave behind: find, describe and clean it
  (``etn verify`` in :mod:`etn_cli.stages.verify`, ``etn status`` in
  :mod:`etn_cli.stages.status`).

Code outside the store imports these names from ``etn_cli.store``; the modules import each
other directly.
"""

from etn_cli.store.artefacts.classifier import load_classifier, save_classifier
from etn_cli.store.artefacts.headfiles import (
    check_head_folder,
    head_checksums,
    read_json_object,
    seal_head_files,
)
from etn_cli.store.atomic import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_text,
    is_locked,
    partial_folders,
    remove_partials,
    remove_tmp,
    unit_lock,
)
from etn_cli.store.fingerprint import canonical_json, file_sha256, fingerprint_key
from etn_cli.store.maintenance.leftovers import (
    TMP_FILE,
    Leftover,
    clean_leftover,
    find_leftovers,
    peek_partial,
)
from etn_cli.store.reading.consistency import check_splits, check_varies
from etn_cli.store.reading.reader import Features, check_split, read_split, write_manifest
from etn_cli.store.storage import (
    ensure_writable,
    explained_storage_errors,
    is_storage_error,
    storage_error,
)
from etn_cli.store.writing.checks import to_numpy
from etn_cli.store.writing.journal import peek_journal
from etn_cli.store.writing.manifest import (
    FORMAT_VERSION,
    load_manifest,
    split_is_complete,
)
from etn_cli.store.writing.merge import merge_pieces
from etn_cli.store.writing.pieces import (
    Layout,
    Piece,
    PieceWriter,
    piece_index,
    pieces_folder,
    prune,
    reusable,
)
from etn_cli.store.writing.writer import ShardWriter

__all__ = [
    "FORMAT_VERSION",
    "TMP_FILE",
    "Features",
    "Layout",
    "Leftover",
    "Piece",
    "PieceWriter",
    "ShardWriter",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "canonical_json",
    "check_head_folder",
    "check_split",
    "check_splits",
    "check_varies",
    "clean_leftover",
    "ensure_writable",
    "explained_storage_errors",
    "file_sha256",
    "find_leftovers",
    "fingerprint_key",
    "head_checksums",
    "seal_head_files",
    "is_locked",
    "is_storage_error",
    "load_classifier",
    "load_manifest",
    "merge_pieces",
    "partial_folders",
    "peek_journal",
    "peek_partial",
    "piece_index",
    "pieces_folder",
    "prune",
    "read_json_object",
    "read_split",
    "remove_partials",
    "remove_tmp",
    "reusable",
    "save_classifier",
    "split_is_complete",
    "storage_error",
    "to_numpy",
    "unit_lock",
    "write_manifest",
]
