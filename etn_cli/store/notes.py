"""One-time notes from the store to the person running etn, such as an artefact an older etn
wrote without checksums. They go to the ``etn`` logger as warnings (stderr; stdout stays the
results): the store knows nothing above it, and the command line's ``-q`` silences the logger."""

from __future__ import annotations

import logging

log = logging.getLogger("etn.store")
_said: set[str] = set()


def note_once(message: str) -> None:
    """Warn ``message`` the first time this process is asked to."""
    if message not in _said:
        _said.add(message)
        log.warning(message)
