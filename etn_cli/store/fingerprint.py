"""Content keys: a stable text form of a configuration and short sha256 keys derived from it.

Every stage names its outputs by a key computed from everything that changes them (model,
revision, dataset, split, transform, dtype, code version, ...). The key must not depend on dict
ordering, on whether a value arrived as a tuple or a list, or on whether a path is a ``Path`` or a
``str``; otherwise a rerun would rebuild a unit that is already up to date.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from enum import Enum
from os import PathLike
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20  # 1 MiB: large enough for full disk speed, small enough to stream


def canonical_json(obj: Any) -> str:
    """Serialise ``obj`` to one canonical JSON string: sorted keys, no whitespace.

    Paths become strings, tuples and sets become lists, dataclasses become dicts, numpy scalars
    and arrays become Python numbers and lists. Floats use Python's shortest round-trip ``repr``,
    which is the same on every platform; non-finite floats become the strings "NaN", "Infinity"
    and "-Infinity" because JSON has no spelling for them.
    """
    plain = _plain(obj)
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_key(obj: Any, length: int = 16) -> str:
    """Return the first ``length`` hex digits of sha256(canonical_json(obj))."""
    digest = hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()
    return digest[:length]


def file_sha256(path: Path) -> str:
    """Return the sha256 hex digest of a file, read in 1 MiB chunks so memory stays flat."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _plain(obj: Any) -> Any:
    """Convert ``obj`` recursively into JSON-native values (dict, list, str, int, float, ...)."""
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return _plain_float(obj)
    if isinstance(obj, dict):
        return _plain_dict(obj)
    if isinstance(obj, (list, tuple)):
        return [_plain(item) for item in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((_plain(item) for item in obj), key=canonical_json)
    return _plain_other(obj)


def _plain_other(obj: Any) -> Any:
    """Handle the less common types: dataclasses, paths, enums and numpy values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, (Path, PathLike)):
        return str(Path(obj))
    if isinstance(obj, Enum):
        return _plain(obj.value)
    import numpy as np  # here: a pipeline file is keyed without loading numpy

    if isinstance(obj, (np.generic, np.ndarray)):
        return _plain(obj.tolist())
    raise TypeError(f"cannot fingerprint a value of type {type(obj).__name__}: {obj!r}")


def _plain_float(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _plain_dict(mapping: dict) -> dict[str, Any]:
    plain = {str(key): _plain(value) for key, value in mapping.items()}
    # 1 and "1" would silently collapse into one key and hide a difference between configs.
    assert len(plain) == len(mapping), f"dict keys collide once turned into strings: {mapping!r}"
    return plain
