"""Log lines of both programs: ``megabatch: message`` on stderr, journald priorities where journald reads it.

Under systemd (``JOURNAL_STREAM`` names stderr) each line starts with its syslog priority, ``<3>``
error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug, which journald strips and records as the entry's
priority; journald stamps the time itself. Elsewhere (a terminal, a file, a CI log) a ``stamped``
formatter starts each line with the local time and the level word instead
(``2026-11-03T12:34:56.789+01:00 INFO megabatch: ...``), since nothing else will record either. The
daemon (``loader.cli``) and the trainer (``trainer.cli``) both use it, so it lives here.
"""

import datetime
import logging
import os
import sys
from typing import TextIO

__all__ = ["LOG_FORMAT", "syslog_priority", "to_journal", "JournalFormatter", "configure_logging", "error_line"]

LOG_FORMAT = "megabatch: %(message)s"


def syslog_priority(levelno: int) -> int:
    """The syslog priority of a logging level: 2 critical, 3 error, 4 warning, 6 info, 7 debug."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def to_journal(stream: object) -> bool:
    """Whether ``stream`` is connected to journald: ``JOURNAL_STREAM`` (set by systemd) names its
    ``device:inode`` (a child that inherited the variable but writes elsewhere gets no prefixes)."""
    value = os.environ.get("JOURNAL_STREAM")
    fileno = getattr(stream, "fileno", None)
    if not value or fileno is None:
        return False
    try:
        st = os.fstat(fileno())
    except (OSError, ValueError):
        return False
    return value == f"{st.st_dev}:{st.st_ino}"


class JournalFormatter(logging.Formatter):
    """``fmt`` lines, each line of a record (a traceback too) prefixed with the record's syslog priority
    ``<N>`` when ``journal`` is true (default: ``to_journal(sys.stderr)``), else, when ``stamped``
    (default False), with its time (ISO 8601, milliseconds, local offset) and level word."""

    def __init__(self, fmt: str = LOG_FORMAT, journal: bool | None = None, stamped: bool = False) -> None:
        super().__init__(fmt)
        self.journal = to_journal(sys.stderr) if journal is None else journal
        self.stamped = stamped

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        # ISO 8601 with the offset: lines from machines in other zones, or across a DST change, still sort
        return datetime.datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self.journal:
            prefix = f"<{syslog_priority(record.levelno)}>"
        elif self.stamped:
            prefix = f"{self.formatTime(record)} {record.levelname} "
        else:
            return text
        return "\n".join(prefix + line for line in text.split("\n"))


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to ``sys.stderr`` as it is when a record is emitted, as the standard library's own
    last-resort handler does: one bound to the stream of its setup outlives a replaced ``sys.stderr`` (a test
    runner's capture, a daemonizing wrapper) and fails on the closed file with a traceback on every record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always sys.stderr: see the class


def configure_logging(level: int, stamped: bool = False) -> None:
    """The root logger: one stderr handler with ``JournalFormatter`` at ``level`` (``stamped``: see there)."""
    handler = _StderrHandler()
    handler.setFormatter(JournalFormatter(stamped=stamped))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def error_line(text: str) -> str:
    """A one-line error for stderr (printed, not logged), at priority error under journald."""
    return f"<3>{text}" if to_journal(sys.stderr) else text
