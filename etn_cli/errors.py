"""Domain errors: anything a user can fix becomes an :class:`EtnError` with a one-line message."""

WORKER_PREFIX = "Caught EtnError"  # how torch's DataLoader re-raises a worker's error
MARKER = "EtnError: "


class EtnError(Exception):
    """A user-facing error: what was expected, what was found, and how to fix it.

    The CLI prints the message on one line and exits with status 2; bugs are left as ordinary
    exceptions so that they keep their traceback. An EtnError raised in a DataLoader worker
    (an unreadable image) comes back from torch as ``EtnError("Caught EtnError in DataLoader
    worker ... Original Traceback ... EtnError: <message>")``; only ``<message>`` is kept.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        if text.startswith(WORKER_PREFIX) and MARKER in text:
            message = text.rsplit(MARKER, 1)[1].strip()
        super().__init__(message, *args)
