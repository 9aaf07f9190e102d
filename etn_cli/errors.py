"""Domain errors: anything a user can fix becomes an :class:`EtnError` with a one-line message."""


class EtnError(Exception):
    """A user-facing error: what was expected, what was found, and how to fix it.

    The CLI prints the message on one line and exits with status 2; bugs are left as ordinary
    exceptions so that they keep their traceback.
    """
