"""Who is on the other end of a connection, and how often the daemon may say so.

``peer_credentials`` reads what the kernel recorded at ``connect`` (``SO_PEERCRED``, and the
supplementary groups through ``SO_PEERGROUPS``), which the daemon checks against ``[server]
allow_uids`` / ``allow_gids`` before a connection costs anything. ``Throttle`` keeps an event that can
repeat fast (a flood of refused peers, accept failing for want of descriptors) to one log line per
``LOG_INTERVAL``.
"""

import errno
import logging
import select
import socket
import struct
import time
from dataclasses import dataclass

__all__ = ["PeerCredentials", "peer_credentials", "peer_description", "peer_hung_up", "Throttle", "LOG_INTERVAL"]

log = logging.getLogger("megabatch.server")

LOG_INTERVAL = 10.0
"""Seconds between two log lines about the same repeating event (refused peers, failing accepts)."""

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
"""Linux >= 4.13: the peer's supplementary groups (Python's socket module lacks the constant; 59 on
x86 and arm)."""

NGROUPS_MAX = 65536
"""Linux's limit on a process's supplementary groups."""


class Throttle:
    """At most one log line per ``LOG_INTERVAL`` for an event that can repeat fast (a flood of refused
    peers, accept failing for want of descriptors); the next line says how many were left out."""

    def __init__(self) -> None:
        self._next = 0.0
        self._left_out = 0

    def warn(self, fmt: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._left_out += 1
            return
        self._next = now + LOG_INTERVAL
        if self._left_out:
            fmt += " (and %d more not logged in the last %g s)"
            args += (self._left_out, LOG_INTERVAL)
            self._left_out = 0
        log.warning(fmt, *args)


@dataclass(frozen=True)
class PeerCredentials:
    """Who is on the other end of a Unix socket, as the kernel saw it at ``connect``."""

    pid: int
    uid: int
    gid: int
    """Primary (effective) group."""
    groups: tuple[int, ...]
    """Supplementary groups (``SO_PEERGROUPS``); empty where the kernel cannot tell (before Linux 4.13)."""

    def describe(self) -> str:
        return f"pid {self.pid} uid {self.uid} gid {self.gid}"


def peer_credentials(conn: socket.socket) -> PeerCredentials | None:
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    except OSError:
        return None
    pid, uid, gid = struct.unpack("iII", raw)  # uid_t and gid_t are unsigned
    groups: tuple[int, ...] = ()
    for size in (64, NGROUPS_MAX):  # most peers have a few groups: ask for room for all only if needed
        try:
            data = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * size)
        except OSError as err:
            if err.errno == errno.ERANGE:
                continue
            break  # before Linux 4.13: the primary group only
        groups = struct.unpack(f"{len(data) // 4}I", data)
        break
    return PeerCredentials(pid, uid, gid, groups)


def peer_description(conn: socket.socket) -> str:
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", raw)
    except OSError:
        return "unknown peer"
    return f"pid {pid} uid {uid}"


def peer_hung_up(fd: int) -> bool:
    """Whether the peer of connected socket ``fd`` has closed it (or shut its writing down), as the kernel
    says now, although bytes it sent before may be unread: a dead trainer's socket is hung up from the moment
    its process closed its files, before the event loop gets to its EOF. A half-close counts (``POLLRDHUP``
    without ``POLLHUP``): the session ends at that EOF anyway (the protocol has no half-open use; the
    default ``eof_received`` closes the transport)."""
    poller = select.poll()
    poller.register(fd, select.POLLRDHUP)
    return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL)
               for _, events in poller.poll(0))
