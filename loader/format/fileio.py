"""Low-level file primitives: every byte the offline tools write goes through ``write_all``.

Keeping one write path means one place handles short writes and one place a test can make
fail (a simulated full disk).
"""

import os
from pathlib import Path

import numpy as np
import xxhash

from proto.errors import UserError

__all__ = ["write_all", "pread_into", "read_failed", "range_xxh3", "file_xxh3", "HASH_CHUNK_BYTES"]

HASH_CHUNK_BYTES = 8 << 20
"""Read size for checksumming: large enough to stream at disk speed, small next to any budget."""


def write_all(fd: int, data: memoryview | bytes | np.ndarray, offset: int | None = None) -> int:
    """Write every byte of ``data`` to ``fd`` (at ``offset`` when given); return the count.

    Raises OSError (ENOSPC and friends) unchanged; callers turn it into a UserError.
    """
    if isinstance(data, np.ndarray):
        # reshape(-1) first: memoryview refuses to cast arrays with a zero-length axis
        view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    else:
        view = memoryview(data)
    total = len(view)
    done = 0
    while done < total:
        if offset is None:
            written = os.write(fd, view[done:])
        else:
            written = os.pwrite(fd, view[done:], offset + done)
        if written <= 0:
            raise OSError(28, "No space left on device")
        done += written
    return total


def pread_into(fd: int, buffer: np.ndarray, offset: int, path: Path | str) -> None:
    """Fill ``buffer`` from ``fd`` at ``offset``; a short read means a truncated file."""
    if not buffer.flags.c_contiguous:
        raise ValueError("pread_into needs a C-contiguous buffer")
    view = buffer.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise UserError(f"{path}: truncated (wanted {len(view)} bytes at offset {offset}, file ends early)")
        done += got


def read_failed(path: Path | str, nbytes: int, offset: int, err: OSError) -> UserError:
    """The one-line error of a read the OS refused (EIO and friends), naming file and byte."""
    return UserError(f"{path}: read of {nbytes} bytes at byte {offset} failed ({err.strerror}); check the disk "
                     f"(dmesg) and run 'megabatch verify'")


def range_xxh3(fd: int, offset: int, length: int, buffer: memoryview, path: Path | str) -> int:
    """xxh3-64 of ``length`` bytes of ``fd`` from ``offset``, read through ``buffer`` a chunk at a time."""
    hasher = xxhash.xxh3_64()
    done = 0
    while done < length:
        got = os.preadv(fd, [buffer[:min(len(buffer), length - done)]], offset + done)
        if got <= 0:
            raise UserError(f"{path}: ends before byte {offset + length}")
        hasher.update(buffer[:got])
        done += got
    return hasher.intdigest()


def file_xxh3(path: Path) -> str:
    """xxh3-64 of a whole file as 16 hex digits, read in bounded chunks."""
    with open(path, "rb", buffering=0) as handle:
        fd = handle.fileno()
        digest = range_xxh3(fd, 0, os.fstat(fd).st_size, memoryview(bytearray(HASH_CHUNK_BYTES)), path)
    return f"{digest:016x}"
