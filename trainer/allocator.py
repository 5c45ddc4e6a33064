"""Keep the trainer's large freed blocks in the heap instead of giving them back to the kernel after every batch.

glibc's malloc serves a request above its mmap threshold (adaptive, at most 32 MiB) with a fresh ``mmap`` and frees
it with ``munmap``; torch's CPU allocator has no cache of its own. A batch's big tensors (its gathered input rows,
the first layer's aggregates) are then new pages every step, which the kernel zero-fills one 4 KiB fault at a time:
on coauthor-cs (6,805 features a row, a link batch of 256 pairs gathers about 12,000 rows, 0.3 GB) that was half of
the trainer's CPU time, spent in the kernel (docs/PERFORMANCE.md, "The trainer's allocator"). Raising the threshold
to ``MMAP_THRESHOLD`` and the trim threshold to ``TRIM_THRESHOLD`` lets freed blocks go back to malloc's free lists
and be reused by the next batch. The cost: the process keeps up to ``TRIM_THRESHOLD`` of freed memory instead of
returning it at once, about the batch working set it needs again a step later.

Only glibc has ``mallopt`` with these parameters; elsewhere (musl, macOS) this does nothing."""

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

log = logging.getLogger("megabatch.trainer")

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 1 << 30
"""Requests from 1 GiB up still get their own mapping (a dataset's features loaded whole, say): they are one-offs."""
TRIM_THRESHOLD = 2**31 - 1
"""Free memory at the top of the heap up to this much (2 GiB, the largest int ``mallopt`` takes) is kept for the next
batch rather than returned."""


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (module docstring); True when both took, False where there is no glibc ``mallopt``
    or it refused one (logged at debug: the trainer runs either way, only slower on wide features)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: the allocator keeps its own thresholds")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    taken = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not taken:
        log.debug("mallopt refused the mmap or trim threshold: the allocator keeps its own")
    return taken
