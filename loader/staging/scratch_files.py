"""Unnamed scratch files for staging: on SSD (O_TMPFILE, gone when closed or when the process dies) or in RAM.

Both the feature rows a window stages (``stager``) and the sampled structure a long superbatch spills
(``spilled_pass``) live in such files: nothing is left behind by a crash, and a second open file
description lets reads use O_DIRECT while writes go where the caller wants.
"""

import errno
import mmap
import os
from pathlib import Path

__all__ = ["SCRATCH_ALIGN", "aligned_buffer", "open_direct", "open_scratch", "read_exactly", "takes_direct_writes"]

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
