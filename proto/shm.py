"""The shared-memory segment behind the slot ring, and passing its file descriptor over a Unix socket.

The segment is an anonymous ``memfd`` (Linux): it has no name under /dev/shm, so nothing is left to
unlink after a crash of either process; the kernel frees the memory when the last descriptor and the
last mapping are gone. The daemon creates it (``create_segment``) and passes a read-only descriptor of
it (``Segment.reader_fd``) to its client with the ``Welcome`` frame (``send_with_fds``, SCM_RIGHTS);
the client maps it (``map_segment``), read-only by default.

A client is not trusted with the daemon's memory. A page of a ``MAP_SHARED`` mapping that lies past
the end of its file faults with SIGBUS on access, which kills the whole daemon (every session) and
which Python cannot catch; so a client that could ``ftruncate`` the segment could kill the daemon at
its next write into a slot. ``create_segment`` therefore, before anyone else sees the descriptor:

- sizes it and reserves every page (``posix_fallocate``): ``ftruncate`` alone reserves nothing, and a
  write to an unbacked page when memory is short faults too; reserving fails with a ``ShmError`` now;
- seals it (``SEALS``): its size can never change again (``F_SEAL_SHRINK``, ``F_SEAL_GROW``), no new
  writable mapping, ``write`` or hole punch is allowed (``F_SEAL_FUTURE_WRITE``: only the mapping the
  daemon already holds can write; a punched hole would undo the reservation), and no seal can be
  added or removed (``F_SEAL_SEAL``). Seals belong to the memfd itself, so they also hold against a
  writable descriptor reopened through /proc/PID/fd, which a same-uid process can always get.
- opens a second, read-only descriptor of it for clients (a read-only descriptor can be neither
  resized nor mapped writable, even without the seals).

``Segment.prefault`` additionally touches one byte per page, to map every page in up front.
"""

import contextlib
import errno
import fcntl
import mmap
import os
import socket

import numpy as np

from proto.errors import ShmError

__all__ = ["DEFAULT_NAME", "SEALS", "Segment", "create_segment", "map_segment", "send_with_fds", "recv_with_fds"]

DEFAULT_NAME = "megabatch-slots"
"""memfd name (shown as ``/memfd:megabatch-slots`` in /proc/PID/fd and /proc/PID/maps; not a path)."""

# Python 3.11's fcntl has F_ADD_SEALS, F_GET_SEALS and F_SEAL_{SEAL,SHRINK,GROW,WRITE} but not
# F_SEAL_FUTURE_WRITE (Linux 5.1); the fallbacks are the values of <linux/fcntl.h>, a stable kernel ABI.
_F_ADD_SEALS: int = getattr(fcntl, "F_ADD_SEALS", 1024 + 9)
_F_SEAL_SEAL: int = getattr(fcntl, "F_SEAL_SEAL", 0x0001)
_F_SEAL_SHRINK: int = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
_F_SEAL_GROW: int = getattr(fcntl, "F_SEAL_GROW", 0x0004)
_F_SEAL_FUTURE_WRITE: int = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
_MFD_ALLOW_SEALING: int = getattr(os, "MFD_ALLOW_SEALING", 0x0002)

SEALS = _F_SEAL_SHRINK | _F_SEAL_GROW | _F_SEAL_FUTURE_WRITE | _F_SEAL_SEAL
"""Seals ``create_segment`` sets (``fcntl(fd, F_GET_SEALS)`` reads them): fixed size, no writer but the
daemon's own mapping, no further seal changes."""


def _pretty_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


class Segment:
    """A mapped shared-memory segment: descriptor ``fd``, size ``nbytes``, and its ``mapping``.

    ``readonly_fd`` (default None): a read-only descriptor of the same memory, the one to hand to
    clients (``reader_fd``); ``create_segment`` opens it. The segment owns both descriptors: ``close``
    (idempotent) closes them and unmaps. If numpy views of the mapping are still alive, the unmap (and
    the close of the duplicate descriptor an ``mmap`` keeps) is left to the garbage collector: it
    happens when the last view goes.
    """

    def __init__(self, fd: int, nbytes: int, mapping: mmap.mmap, writable: bool,
                 readonly_fd: int | None = None) -> None:
        self.fd = fd
        self.nbytes = nbytes
        self.writable = writable
        self._readonly_fd = readonly_fd
        self._mapping: mmap.mmap | None = mapping

    @property
    def reader_fd(self) -> int:
        """The read-only descriptor to pass to a client (it stays owned by this segment)."""
        if self._mapping is None:
            raise ShmError("the shared-memory segment is closed")
        if self._readonly_fd is None:
            raise ShmError("this segment has no read-only descriptor to share (it was not made by create_segment)")
        return self._readonly_fd

    @property
    def mapping(self) -> mmap.mmap:
        if self._mapping is None:
            raise ShmError("the shared-memory segment is closed")
        return self._mapping

    @property
    def closed(self) -> bool:
        return self._mapping is None

    def prefault(self) -> None:
        """Allocate every page now (``posix_fallocate``), then touch one byte per page; writable only.

        Raises ``ShmError`` when the memory cannot be reserved (tmpfs full, memory cgroup limit), which
        would otherwise surface as SIGBUS on the first write to an unbacked page. Call it before any
        data is written: it writes zeros. (``create_segment`` reserves already; this maps the pages in.)
        """
        if not self.writable:
            raise ShmError("prefault needs a writable segment")
        _reserve(self.fd, self.nbytes)
        pages = np.frombuffer(self.mapping, dtype=np.uint8)
        pages[::mmap.PAGESIZE] = 0  # allocated already, so this cannot fault; it maps the pages in
        del pages

    def close(self) -> None:
        if self._mapping is None:
            return
        mapping, self._mapping = self._mapping, None
        with contextlib.suppress(BufferError):  # live views: the mmap unmaps itself when the last one goes
            mapping.close()
        os.close(self.fd)
        if self._readonly_fd is not None:
            os.close(self._readonly_fd)

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reserve(fd: int, nbytes: int) -> None:
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as err:
        raise ShmError(f"cannot reserve {_pretty_bytes(nbytes)} of shared memory for the slot ring: "
                       f"{os.strerror(err.errno) if err.errno else err}; use fewer or smaller slots, "
                       f"or free memory") from None


def _seal(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_ADD_SEALS, SEALS)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        # Linux < 5.1 knows no F_SEAL_FUTURE_WRITE: the size seals alone still rule out the SIGBUS
        fcntl.fcntl(fd, _F_ADD_SEALS, SEALS & ~_F_SEAL_FUTURE_WRITE)


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        return None


def create_segment(nbytes: int, name: str = DEFAULT_NAME) -> Segment:
    """A new writable memfd segment of ``nbytes`` bytes (zero-filled), named ``name`` (default DEFAULT_NAME).

    Every page is reserved, the memfd is sealed with ``SEALS`` and ``reader_fd`` is a read-only
    descriptor of it for clients (see the module docstring). Raises ``ShmError`` when ``nbytes``
    exceeds the machine's physical memory, the memory cannot be reserved, or the kernel refuses the
    memfd, its size, the seals, the mapping or the read-only descriptor.
    """
    if nbytes < 1:
        raise ShmError(f"segment size must be at least 1 byte, got {nbytes}")
    physical = _physical_memory()
    if physical is not None and nbytes > physical:
        raise ShmError(f"the slot ring needs {_pretty_bytes(nbytes)} of shared memory but this machine has "
                       f"{_pretty_bytes(physical)}; use fewer or smaller slots")
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | _MFD_ALLOW_SEALING)
    except OSError as err:
        raise ShmError(f"cannot create shared memory (memfd_create): {os.strerror(err.errno or 0)}") from None
    mapping: mmap.mmap | None = None
    step = "size"
    try:
        os.ftruncate(fd, nbytes)
        _reserve(fd, nbytes)
        step = "map"
        # mapped before sealing: F_SEAL_FUTURE_WRITE refuses every writable mapping made after it
        mapping = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        step = "seal"
        _seal(fd)
        step = "open a read-only descriptor of"
        # a new open file description of the same memfd (a dup would share the read-write one)
        readonly_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        if mapping is not None:
            mapping.close()
        os.close(fd)
        if isinstance(err, ShmError):
            raise
        raise ShmError(f"cannot {step} {_pretty_bytes(nbytes)} of shared memory: "
                       f"{os.strerror(err.errno) if err.errno else err}") from None
    return Segment(fd, nbytes, mapping, writable=True, readonly_fd=readonly_fd)


def map_segment(fd: int, nbytes: int, writable: bool = False) -> Segment:
    """Map the first ``nbytes`` of the segment behind ``fd`` (read-only unless ``writable``; default False).

    The returned ``Segment`` owns ``fd``. Raises ``ShmError`` if the descriptor is smaller than
    ``nbytes`` (a Welcome that does not match its segment) or cannot be mapped; ``fd`` is closed then.
    """
    try:
        if nbytes < 1:
            raise ShmError(f"segment size must be at least 1 byte, got {nbytes}")
        try:
            size = os.fstat(fd).st_size
        except OSError as err:
            raise ShmError(f"cannot inspect the shared-memory descriptor {fd}: {os.strerror(err.errno or 0)}") from None
        if size < nbytes:
            raise ShmError(f"the shared-memory segment has {size} bytes, expected at least {nbytes}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        try:
            mapping = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=prot)
        except OSError as err:
            raise ShmError(f"cannot map {_pretty_bytes(nbytes)} of shared memory: "
                           f"{os.strerror(err.errno or 0)}") from None
    except ShmError:
        os.close(fd)
        raise
    return Segment(fd, nbytes, mapping, writable=writable)


def send_with_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """Send all of ``data`` on a blocking stream socket, ``fds`` attached (SCM_RIGHTS) to its first byte."""
    if not data:
        raise ValueError("send_with_fds needs at least one byte to carry the descriptors")
    sent = socket.send_fds(sock, [data], fds)
    if sent < len(data):
        sock.sendall(data[sent:])  # the descriptors went with the first part already


def recv_with_fds(sock: socket.socket, bufsize: int, maxfds: int) -> tuple[bytes, list[int]]:
    """Receive up to ``bufsize`` bytes and up to ``maxfds`` descriptors (b"" at end of stream).

    Descriptors beyond ``maxfds`` are closed here (the kernel closes those that did not fit the control
    buffer), so a misbehaving peer cannot leak descriptors into this process.
    """
    data, fds, _flags, _addr = socket.recv_fds(sock, bufsize, maxfds)
    for extra in fds[maxfds:]:
        os.close(extra)
    return data, list(fds[:maxfds])
