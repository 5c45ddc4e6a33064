"""The shared-memory segment behind the slot ring, and passing its file descriptor over a Unix socket.

The segment is an anonymous ``memfd`` (Linux): it has no name under /dev/shm, so nothing is left to
unlink after a crash of either process; the kernel frees the memory when the last descriptor and the
last mapping are gone. The daemon creates it (``create_segment``) and passes the descriptor to each
client with the ``Welcome`` frame (``send_with_fds``, SCM_RIGHTS); the client maps it
(``map_segment``), read-only by default.

``ftruncate`` only sets the size: no memory is reserved, and each page is allocated when first
written. If memory runs out then, a write through the mapping faults (SIGBUS or the OOM killer), which
Python cannot turn into an exception. ``Segment.prefault`` reserves every page up front with
``posix_fallocate`` (which fails with a clear ``ShmError`` instead) and then touches one byte per
page, so a segment that cannot be backed fails at daemon startup rather than mid-training.
"""

import contextlib
import mmap
import os
import socket

import numpy as np

from proto.errors import ShmError

__all__ = ["DEFAULT_NAME", "Segment", "create_segment", "map_segment", "send_with_fds", "recv_with_fds"]

DEFAULT_NAME = "megabatch-slots"
"""memfd name (shown as ``/memfd:megabatch-slots`` in /proc/PID/fd and /proc/PID/maps; not a path)."""


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

    The segment owns ``fd``: ``close`` (idempotent) closes it and unmaps. If numpy views of the mapping
    are still alive, the unmap (and the close of the duplicate descriptor an ``mmap`` keeps) is left to
    the garbage collector: it happens when the last view goes.
    """

    def __init__(self, fd: int, nbytes: int, mapping: mmap.mmap, writable: bool) -> None:
        self.fd = fd
        self.nbytes = nbytes
        self.writable = writable
        self._mapping: mmap.mmap | None = mapping

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
        data is written: it writes zeros.
        """
        if not self.writable:
            raise ShmError("prefault needs a writable segment")
        try:
            os.posix_fallocate(self.fd, 0, self.nbytes)
        except OSError as err:
            raise ShmError(f"cannot reserve {_pretty_bytes(self.nbytes)} of shared memory for the slot ring: "
                           f"{os.strerror(err.errno) if err.errno else err}; use fewer or smaller slots, "
                           f"or free memory") from None
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

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        return None


def create_segment(nbytes: int, name: str = DEFAULT_NAME) -> Segment:
    """A new writable memfd segment of ``nbytes`` bytes (zero-filled), named ``name`` (default DEFAULT_NAME).

    Raises ``ShmError`` when ``nbytes`` exceeds the machine's physical memory or the kernel refuses the
    memfd, its size or the mapping. The pages are not reserved: call ``Segment.prefault`` for that.
    """
    if nbytes < 1:
        raise ShmError(f"segment size must be at least 1 byte, got {nbytes}")
    physical = _physical_memory()
    if physical is not None and nbytes > physical:
        raise ShmError(f"the slot ring needs {_pretty_bytes(nbytes)} of shared memory but this machine has "
                       f"{_pretty_bytes(physical)}; use fewer or smaller slots")
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    except OSError as err:
        raise ShmError(f"cannot create shared memory (memfd_create): {os.strerror(err.errno or 0)}") from None
    try:
        os.ftruncate(fd, nbytes)
        mapping = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as err:
        os.close(fd)
        raise ShmError(f"cannot size or map {_pretty_bytes(nbytes)} of shared memory: "
                       f"{os.strerror(err.errno or 0)}") from None
    return Segment(fd, nbytes, mapping, writable=True)


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
