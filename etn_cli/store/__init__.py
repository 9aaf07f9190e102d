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

There is no front door: code outside the store imports the module that holds a name
(``from etn_cli.store.reading.reader import read_split``), so importing one of them loads
only what it needs (``etn --help`` reads none of numpy, h5py or safetensors). Which modules
the rest of etn may import is the list ``STORE_PUBLIC`` in ``tests/test_architecture.py``.
"""
