"""Feature store: HDF5 shards of cached backbone outputs, manifests, content keys, atomic writes.

``extract`` writes split folders with :class:`ShardWriter`; ``train`` and ``evaluate`` read them
with :func:`read_split`. See :mod:`etn_cli.store.shards` for the on-disk format. How work
survives kills and overlapping runs: :mod:`etn_cli.store.atomic` (private write then rename,
kernel locks), :mod:`etn_cli.store.journal` (extraction resumes at shard granularity),
:mod:`etn_cli.store.leftovers` (what interrupted runs leave), :mod:`etn_cli.store.consistency`
and :mod:`etn_cli.store.headfiles` (checks before a stage writes anything).
"""

from etn_cli.store.atomic import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_text,
    remove_partials,
    unit_lock,
)
from etn_cli.store.fingerprint import canonical_json, file_sha256, fingerprint_key
from etn_cli.store.manifest import FORMAT_VERSION, split_is_complete
from etn_cli.store.shards import (
    Features,
    ShardWriter,
    load_classifier,
    read_split,
    save_classifier,
    write_manifest,
)

__all__ = [
    "FORMAT_VERSION",
    "Features",
    "ShardWriter",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "canonical_json",
    "file_sha256",
    "fingerprint_key",
    "load_classifier",
    "read_split",
    "remove_partials",
    "save_classifier",
    "split_is_complete",
    "unit_lock",
    "write_manifest",
]
