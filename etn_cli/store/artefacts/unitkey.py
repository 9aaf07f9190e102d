"""A unit is the one asked for: the content key in its name and the key its own record carries
must agree.

etn names every unit it builds by a content key (``heads/etn-3f2a…``, ``metrics/<p>/map-….parquet``,
``features/<b>/digits.test-…``), and the unit records that key inside (``train.json``'s
``key``, the metrics rows' ``metrics_key``, the manifest's ``key``). Checksums prove a unit's
files are the ones written, not that they were written for this name: two seeds' head folders
swapped, or a split folder copied over another, pass every checksum. The readers that check a
unit's seal call :func:`check_recorded_key` too, so such a unit counts as damaged: ``etn run``
rebuilds it and every other command refuses it in one line. A name without a key (a folder you
named yourself) is not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

from etn_cli.errors import DamagedArtefact

KEY_LENGTH = 16  # fingerprint_key's default: every unit etn names by a key
NAMED_KEY = re.compile(rf"-([0-9a-f]{{{KEY_LENGTH}}})$")
UNIT_SUFFIXES = (".parquet",)


def named_key(unit: Path) -> str | None:
    """The content key ``unit``'s name ends in, None for a name without one."""
    name = Path(unit).name
    for suffix in UNIT_SUFFIXES:
        name = name.removesuffix(suffix)
    match = NAMED_KEY.search(name)
    return match.group(1) if match else None


def check_recorded_key(unit: Path, recorded: object, record: str, fix: str = "") -> None:
    """Raise :class:`DamagedArtefact` for ``unit`` when its name carries a key and ``record``
    (what holds the unit's own key, for the message) records another one (``recorded``: the
    key, or the distinct keys of a table's rows). A record without a key (an older etn's)
    passes."""
    expected = named_key(unit)
    if expected is None or recorded is None:
        return
    found = list(recorded) if isinstance(recorded, list | tuple | set) else [recorded]
    if found == [expected]:
        return
    shown = ", ".join(map(str, found[:3])) or "none"
    raise DamagedArtefact(
        unit,
        f"{record} records key {shown}, but {Path(unit).name} is named by key {expected}: it "
        f"holds another unit (a folder or file renamed, swapped or copied over). {fix}".strip(),
    )
