"""Unnamed scratch files for staging: on SSD (O_TMPFILE, gone when closed or when the process dies) or in RAM.

Both the feature rows a window stages (``stager``) and the sampled structure a long superbatch spills
(``spilled_pass``) live in such files: nothing is left behind by a crash, and a second open file
description lets reads use O_DIRECT while writes go where the caller wants.
"""

import errno
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SCRATCH_ALIGN", "ScratchFile", "ScratchFiles", "aligned_buffer", "open_direct", "open_scratch",
           "read_exactly", "takes_direct_writes"]

SCRATCH_ALIGN = 4096
"""O_DIRECT's page: offsets, lengths and buffers of direct transfers are multiples of it."""


def aligned_buffer(size: int) -> mmap.mmap:
    """A zeroed, page-aligned anonymous buffer of at least ``size`` bytes (a whole number of pages)."""
    return mmap.mmap(-1, max(SCRATCH_ALIGN, -(-size // SCRATCH_ALIGN) * SCRATCH_ALIGN))


def open_direct(path: Path, flags: int, direct: bool) -> tuple[int, bool]:
    """(fd, whether it is O_DIRECT): O_DIRECT when ``direct`` and the filesystem takes it, else buffered."""
    if direct:
        try:
            return os.open(path, flags | os.O_DIRECT | os.O_CLOEXEC), True
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
    return os.open(path, flags | os.O_CLOEXEC), False


def read_exactly(fd: int, buffer: mmap.mmap, at: int, length: int, name: str) -> None:
    """Read ``length`` bytes of ``fd`` from byte ``at`` into ``buffer`` (EIO naming ``name`` if the file ends first).

    ``length`` may be a page multiple beyond the data for O_DIRECT; ``buffer`` holds at least ``length`` bytes."""
    view = memoryview(buffer)
    done = 0
    while done < length:
        got = os.preadv(fd, [view[done:length]], at + done)
        if got == 0:
            raise OSError(errno.EIO, f"{name} file ends at byte {at + done}", name)
        done += got


def takes_direct_writes(directory: Path | None) -> bool:
    """Whether unnamed files under ``directory`` take O_DIRECT writes (None, a memfd: no)."""
    if directory is None:
        return False
    write_fd, read_fd, direct = open_scratch(directory, 0, direct_reads=False, direct_writes=True)
    for fd in {write_fd, read_fd}:
        os.close(fd)
    return direct


def open_scratch(directory: Path | None, size: int, *, direct_reads: bool, direct_writes: bool = False
                 ) -> tuple[int, int, bool]:
    """(write fd, read fd, whether writes are O_DIRECT) of a new unnamed file of ``size`` bytes under
    ``directory`` (None: a memfd, in RAM).

    On disk the read fd is a second open file description, O_DIRECT where ``direct_reads`` and the
    filesystem allow; the write fd is O_DIRECT where ``direct_writes`` asks and it is allowed. The two
    may be the same fd (in RAM, or neither direct); close both (once each)."""
    if directory is None:
        fd = os.memfd_create("megabatch-staging", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return fd, fd, False
    fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fds = [fd]
    try:
        os.ftruncate(fd, size)
        proc = Path(f"/proc/self/fd/{fd}")

        def description(flags: int, wanted: bool) -> int:
            """A second, O_DIRECT description of the file where ``wanted`` and taken, else ``fd`` itself."""
            if not wanted:
                return fd
            other, is_direct = open_direct(proc, flags, True)
            if not is_direct:
                os.close(other)
                return fd
            fds.append(other)
            return other

        write_fd = description(os.O_WRONLY, direct_writes)
        read_fd = description(os.O_RDONLY, direct_reads)
        if write_fd != fd and read_fd != fd:
            os.close(fd)  # both ways have descriptions of their own: the inode lives while they do
        return write_fd, read_fd, write_fd != fd
    except BaseException:
        for f in fds:
            os.close(f)
        raise


@dataclass
class ScratchFile:
    """An unnamed scratch file taken from ``ScratchFiles``: write through ``fd``, read through ``read_fd``."""

    fd: int
    read_fd: int
    direct_writes: bool
    size: int

    def grow(self, size: int) -> None:
        """At least ``size`` bytes long (the new part is a hole)."""
        if size > self.size:
            os.ftruncate(self.fd, size)
            self.size = size

    def close(self) -> None:
        for fd in {self.fd, self.read_fd}:
            if fd >= 0:
                os.close(fd)
        self.fd = self.read_fd = -1


class ScratchFiles:
    """Scratch files under ``directory`` kept for the next window once one is given back, at most ``keep`` of them.

    On ext4 an O_DIRECT write into a hole waits for its blocks to be allocated and their extent converted,
    and closing a file of a gigabyte frees its extents for half a second to two seconds on the thread that
    closes it. Rewriting blocks a file already holds does neither: 128 interleaved streams of 96 KiB
    O_DIRECT writes, 8 at a time, ran at 820 MB/s into a written file against 456 MB/s into a sparse one
    and 569 MB/s into a fallocated one (``bench/scratch_write_bench.py``, docs/PERFORMANCE.md). So a
    window's staging file and a superbatch's spill file go back here when they are done, and the next one
    rewrites them. Files in RAM (``directory`` None, memfds) are never kept: their pages are memory the
    budget does not charge between windows.
    Thread-safe: ``take`` and ``give`` may come from different threads.
    """

    def __init__(self, directory: Path | None, *, direct_reads: bool, direct_writes: bool, keep: int) -> None:
        self.directory = directory
        self._direct_reads, self._direct_writes = direct_reads, direct_writes
        self._keep = keep if directory is not None else 0
        self._free: list[ScratchFile] = []
        self._open: dict[int, ScratchFile] = {}  # every file of this pool not yet closed (taken or kept), by id()
        self._lock = threading.Lock()
        self._closed = False

    def take(self, size: int) -> ScratchFile:
        """A file of at least ``size`` bytes: a kept one (the largest, grown if need be) or a new one."""
        with self._lock:
            kept = self._free.pop() if self._free else None
        if kept is None:
            fd, read_fd, direct = open_scratch(self.directory, size, direct_reads=self._direct_reads,
                                               direct_writes=self._direct_writes)
            file = ScratchFile(fd, read_fd, direct, size)
            with self._lock:
                self._open[id(file)] = file
            return file
        try:
            kept.grow(size)
        except BaseException:
            self._forget(kept)
            raise
        return kept

    def give(self, file: ScratchFile) -> None:
        """``file`` is done with: kept for reuse while there is room, else closed."""
        with self._lock:
            if not self._closed and len(self._free) < self._keep and file.fd >= 0:
                self._free.append(file)
                self._free.sort(key=lambda f: f.size)  # take() pops the largest
                return
        self._forget(file)

    def _forget(self, file: ScratchFile) -> None:
        with self._lock:
            self._open.pop(id(file), None)
        file.close()

    @property
    def kept(self) -> int:
        return len(self._free)

    @property
    def held_bytes(self) -> int:
        """Bytes of disk (or RAM) this pool's files take: those in use and those kept."""
        with self._lock:
            return sum(f.size for f in self._open.values())

    def close(self) -> None:
        """Close the kept files; files given back later are closed then."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for file in free:
            self._forget(file)
