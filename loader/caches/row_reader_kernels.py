"""numba kernels of ``loader.caches.row_reader``: plan page-aligned read spans, then pread them and scatter rows.

``plan_spans`` is a pure function on numpy arrays; ``read_groups`` is not: it reads the file, calling
libc ``pread`` through ctypes from nopython code with the GIL released, so several threads can each
have one read in flight. Callers (``RowReader``) validate every index first: numba does not bounds-check.
"""

import ctypes
import errno as _errno

import numpy as np
from numba import njit

from loader.format.checksum_kernels import PAGE_BYTES, bad_block_in
from proto.jit import kernel

__all__ = ["STATUS_EOF", "STATUS_OK", "STATUS_OS_ERROR", "STATUS_CORRUPT", "RESULT_FIELDS", "plan_spans",
           "read_groups"]

STATUS_OK = 0
STATUS_OS_ERROR = 1
"""pread returned -1 with an errno other than EINTR (``result[1]`` holds it)."""
STATUS_EOF = 2
"""pread returned 0 before the group's rows were complete: the file shrank under us."""
STATUS_CORRUPT = 3
"""A block read fails its read check (``result[4]``: the block's file offset)."""

RESULT_FIELDS = 5
"""Per share: status, errno, pread calls, bytes returned by pread, file offset of the failed read."""

_libc = ctypes.CDLL(None, use_errno=True)
_pread = _libc.pread
_pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64)
_pread.restype = ctypes.c_ssize_t
# ctypes' own errno bookkeeping (use_errno / get_errno) only runs for calls made from Python; numba
# calls the C function pointer directly, so read the thread's errno through glibc's accessor.
_errno_location = _libc.__errno_location
_errno_location.argtypes = ()
_errno_location.restype = ctypes.POINTER(ctypes.c_int)

_EINTR = _errno.EINTR


@kernel
def plan_spans(offsets: np.ndarray, row_bytes: int, page: int, merge_gap: int, max_span: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Page-aligned, disjoint, ascending read spans ``(start, length)`` covering every row.

    offsets: int64, sorted ascending, >= 0 (duplicates fine). Row i occupies bytes
    ``[offsets[i], offsets[i] + row_bytes)`` and touches pages ``[fp, ep)`` (rounded out to
    ``page``). A row joins the current span when its pages overlap it, touch it, or begin within
    ``merge_gap`` bytes of its end (the gap pages are then read too); otherwise, or when joining
    would grow a span past ``max_span`` although the row shares no page with it, a new span starts at
    the row's first page. A row sharing a page with the current span always joins, and the span is
    then cut every ``max_span`` bytes, so such a row (and any row longer than ``max_span``) is split
    across spans instead of its shared page being read twice. Hence no page is read twice, every
    span is at most ``max_span`` (a positive multiple of ``page``) and, with ``merge_gap`` 0, the
    spans cover exactly the pages the rows touch.
    """
    n = offsets.shape[0]
    # a row adds at most one span for its start plus one per max_span of its pages
    bound = n * ((row_bytes + 2 * page) // max_span + 2) + 1
    starts = np.empty(bound, dtype=np.int64)
    lengths = np.empty(bound, dtype=np.int64)
    count = 0
    if n == 0:
        return starts[:0], lengths[:0]
    gs = offsets[0] // page * page
    ge = gs
    for i in range(n):
        fp = offsets[i] // page * page
        ep = (offsets[i] + row_bytes + page - 1) // page * page
        if fp > ge + merge_gap or (fp >= ge and ep - gs > max_span):
            if ge > gs:
                starts[count] = gs
                lengths[count] = ge - gs
                count += 1
            gs = fp
            ge = ep
        elif ep > ge:
            ge = ep
        while ge - gs > max_span:
            starts[count] = gs
            lengths[count] = max_span
            count += 1
            gs += max_span
    starts[count] = gs
    lengths[count] = ge - gs
    count += 1
    return starts[:count], lengths[:count]


# Not cached: the compiled code embeds the address of libc's pread, which moves with every process.
@njit(nogil=True, cache=False)
def read_groups(fd: int, span_start: np.ndarray, span_len: np.ndarray, span_need: np.ndarray,
                row_lo: np.ndarray, row_hi: np.ndarray, offsets: np.ndarray, dest: np.ndarray, row_bytes: int,
                out: np.ndarray, bounce: np.ndarray, g0: int, g1: int, result: np.ndarray,
                block_sums: np.ndarray, block: int) -> None:
    """pread spans ``g0..g1`` into ``bounce`` one at a time and copy their rows into ``out``.

    Span g is ``span_len[g]`` bytes at ``span_start[g]``; at least ``span_need[g]`` must arrive (a
    span may run past the end of the file). Rows ``row_lo[g]..row_hi[g]`` of the sorted request
    (``offsets``) intersect it: the intersection of row r with the span is copied to row ``dest[r]``
    of ``out`` (uint8, flat, ``row_bytes`` per row), so a row split across spans is assembled by
    the spans' copies, which touch disjoint bytes. Short reads are continued and EINTR retried.
    Writes status, errno, pread calls, bytes read and the failing offset to ``result`` (int64[5])
    and stops at the first error; rows of spans not reached are left as they were. With read checks
    (``block_sums`` not empty, one per ``block`` bytes of the file; ``block`` divides 4096) every
    block a row of the span touches is checked, once, before any row is copied out of it: the span's
    other bytes are read (pages are the unit of a read) but not hashed. ``span_need[g]`` then reaches
    the end of the file, so a last, short block is whole.
    """
    reads = 0
    nbytes = 0
    acc = np.empty(8, dtype=np.uint64)
    pad = np.empty(PAGE_BYTES, dtype=np.uint8)
    for g in range(g0, g1):
        start = span_start[g]
        length = span_len[g]
        need = span_need[g]
        done = 0
        while done < need:
            got = _pread(fd, bounce[done:].ctypes, length - done, start + done)
            reads += 1
            if got < 0:
                err = _errno_location()[0]
                if err == _EINTR:
                    continue
                result[0] = STATUS_OS_ERROR
                result[1] = err
                result[2] = reads
                result[3] = nbytes
                result[4] = start + done
                return
            if got == 0:
                result[0] = STATUS_EOF
                result[1] = 0
                result[2] = reads
                result[3] = nbytes
                result[4] = start + done
                return
            done += got
            nbytes += got
        end = start + length
        if len(block_sums):
            checked_to = start  # rows ascend, so the blocks already checked are those below this offset
            for r in range(row_lo[g], row_hi[g]):
                lo = max(max(offsets[r], start) // block * block, checked_to)
                # whole blocks, except the file's last, which ends where the file does
                hi = min((min(offsets[r] + row_bytes, end) + block - 1) // block * block, start + need)
                if hi <= lo:
                    continue
                bad = bad_block_in(bounce, lo - start, hi - lo, lo, block_sums, block, acc, pad)
                if bad >= 0:
                    result[0] = STATUS_CORRUPT
                    result[1] = 0
                    result[2] = reads
                    result[3] = nbytes
                    result[4] = bad
                    return
                checked_to = hi
        for r in range(row_lo[g], row_hi[g]):
            row = offsets[r]
            lo = max(row, start)
            hi = min(row + row_bytes, end)
            base = dest[r] * row_bytes - row
            out[base + lo:base + hi] = bounce[lo - start:hi - start]
    result[0] = STATUS_OK
    result[1] = 0
    result[2] = reads
    result[3] = nbytes
    result[4] = -1
