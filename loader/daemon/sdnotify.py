"""systemd's notify protocol (Type=notify): READY, STATUS, WATCHDOG, STOPPING. A few lines, no dependency.

Without ``$NOTIFY_SOCKET`` (not started by systemd) every call is a no-op.
"""

import os
import socket

__all__ = ["notify", "notify_socket", "watchdog_interval"]


def notify_socket() -> str | None:
    """The address systemd takes notifications on (``$NOTIFY_SOCKET``), or None where it did not start us."""
    return os.environ.get("NOTIFY_SOCKET") or None


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=serving"``); returns whether a socket was there to take it."""
    address = notify_socket()
    if address is None:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace socket
    try:
        # non-blocking: the event loop sends these, and must never wait on a listener whose queue is full
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
            sock.sendto(state.encode(), address)
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of ``$WATCHDOG_USEC``), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.1, int(usec) / 2e6)
    except ValueError:
        return None
