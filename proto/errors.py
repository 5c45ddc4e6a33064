"""Exceptions raised by the ``proto`` package, and ``UserError``, which both programs show the user.

They live in one module so that ``messages``, ``codec``, ``slots``, ``shm`` and ``client`` can raise
them without importing each other, and so callers can catch them without importing the whole package.
``UserError`` is here because the daemon's and the trainer's command lines both turn it into a
one-line message, and ``proto`` is what they share.
"""

__all__ = [
    "UserError", "ProtocolError", "ConnectionClosed", "ConnectFailed", "RemoteError", "SlotError", "SlotOverflow",
    "ShmError",
]


class UserError(Exception):
    """A problem the user can fix (bad input, bad option, no space left).

    The CLI prints ``str(err)`` on one line and exits non-zero; it never shows a traceback
    for these. Messages name the file, field or option and the offending value.
    """


class ProtocolError(ValueError):
    """A peer (or the local program) produced something that is not a valid protocol message.

    ``code`` is one of the error codes of ``proto.messages.ErrorCode`` (``"bad_message"``,
    ``"unknown_message"``, ``"frame_too_large"``, ``"unsupported_version"``), so a daemon can answer
    ``Error(err.code, str(err))`` before it disconnects. A ``ValueError`` because constructing a message
    with an out-of-range field locally raises it too.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ConnectionClosed(ConnectionError):
    """The peer closed the control connection (end of stream, reset or broken pipe)."""


class ConnectFailed(ConnectionError):
    """The control socket could not be reached; ``str(err)`` is a one-line explanation with a hint."""


class RemoteError(Exception):
    """The peer sent an ``Error`` message.

    ``code`` and ``message`` are the message's fields. ``fatal`` is False only for ``"bad_request"``,
    after which the session goes on; after any other code the peer closes the connection.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"loader daemon error {code}: {message}")
        self.code = code
        self.message = message

    @property
    def fatal(self) -> bool:
        return self.code != "bad_request"


class SlotError(Exception):
    """A shared-memory slot is invalid (not committed, stale, corrupt) or was used inconsistently."""


class SlotOverflow(SlotError):
    """A batch does not fit in one slot: it needs ``needed`` bytes, a slot has ``available``."""

    def __init__(self, needed: int, available: int) -> None:
        super().__init__(f"a batch needs {needed} bytes per slot but slots have {available} bytes; "
                         f"raise the slot size to at least {needed} bytes or make batches smaller")
        self.needed = needed
        self.available = available


class ShmError(OSError):
    """The shared-memory segment could not be created, sized, reserved or mapped (message says why)."""
