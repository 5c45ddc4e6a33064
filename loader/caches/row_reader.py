"""Read arbitrary fixed-size rows of a file (``features.bin``) into an output array, fast.

The exact (Ginex) mode needs, per mini-batch, the feature rows of the nodes that miss the
in-RAM cache: thousands of small rows at scattered offsets. ``RowReader.read_rows(offsets, out,
rows)`` puts the row at byte ``offsets[i]`` into ``out[rows[i]]`` (``out[i]`` without ``rows``),
so misses land straight in the batch's output buffer (a shared-memory slot view is fine).

How a call runs:

1. The offsets are validated against the file size (``ValueError``) and sorted (stable argsort).
   Duplicated offsets are served: equal rows share their pages, which are read once, and each
   copy goes to its own destination. Destinations (``rows``) must be distinct.
2. ``row_reader_kernels.plan_spans`` groups them into page-aligned (4096), disjoint, ascending
   spans: rows whose pages overlap, touch, or lie within ``merge_gap`` bytes are one read; no span
   exceeds ``max_span``; a row that crosses a span boundary is assembled from both, so no page is
   read twice. With ``merge_gap=0`` the bytes read are exactly the distinct pages the rows touch.
3. The spans are cut into ``threads`` contiguous shares of about equal bytes. Each share runs the
   numba kernel ``read_groups`` (GIL released) on its own thread of the reader's pool: one
   ``pread`` per span into that thread's page-aligned bounce buffer (anonymous ``mmap``, so
   O_DIRECT's alignment holds), then one copy per row into ``out``. So ``threads`` reads are in
   flight: the SSD here does ~9k random 4 KiB reads/s at depth 1 and ~30k at depth 16. A request of
   at most ``INLINE_MAX_SPANS`` spans runs on the calling thread instead (a handoff costs more
   than it saves there).

Costs per call: O(k log k) for the sort of k offsets, O(k) planning and copying (no Python loop
over rows), one pread per span (about one per row for scattered rows, ``ceil(bytes / max_span)``
for contiguous ones), and bytes read = touched pages * 4096 (a 1 KiB row costs a 4 KiB read) plus
any merged gaps. Memory: ``threads * max_span`` bytes of bounce buffers, held while open.

I/O mode: with ``direct=True`` the file is opened with O_DIRECT (no page cache: reads cost disk
time every time, but never evict the caches the loader manages itself). When the filesystem
refuses it (EINVAL at open or at a read) the reader falls back to buffered reads, logs a warning
and sets ``direct_active = False``. Buffered reads get ``POSIX_FADV_RANDOM``: readahead would
otherwise fetch up to hundreds of KiB around every scattered 4 KiB page, multiplying the bytes
read (11x measured for a memmap gather of 1 KiB rows) and polluting the page cache.

Calls are serialized by a lock (one call in flight per reader; its pool already overlaps the
reads). Counters ``bytes_read``, ``reads`` (pread calls) and ``rows_read`` accumulate over calls;
each call returns its own ``RowReadStats``, summed from each share's ``ShareResult``.
"""

import errno
import logging
import mmap
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from loader.caches import row_reader_kernels as kernels
from loader.format.checksum_kernels import PAGE_BYTES as PAGE
from loader.format.checksum_kernels import first_bad_row
from loader.format.read_checks import CorruptData

__all__ = ["DEFAULT_MAX_SPAN", "INLINE_MAX_SPANS", "RowReadStats", "RowReader", "ShareResult"]

log = logging.getLogger("megabatch.row_reader")

DEFAULT_MAX_SPAN = 256 << 10
"""Largest single read: big enough to stream contiguous rows at disk speed, small per thread."""

INLINE_MAX_SPANS = 2
"""Requests of at most this many spans are read on the calling thread, without the pool."""


@dataclass(frozen=True)
class RowReadStats:
    """What one ``read_rows`` call did."""

    rows: int
    """Rows delivered (the request's length, duplicates included)."""
    reads: int
    """pread calls (one per span, more after short reads or EINTR)."""
    bytes: int
    """Bytes returned by pread: a multiple of 4096 unless a span ran into the end of the file."""
    seconds: float
    """Wall time of the call, validation and sorting included."""


@dataclass(frozen=True)
class ShareResult:
    """What ``row_reader_kernels.read_groups`` reported for one share of a call's spans."""

    status: int
    """``row_reader_kernels.STATUS_OK``, or how the share stopped (an OS error, the end of the file, a failed check)."""
    errno: int
    """The errno pread failed with (``STATUS_OS_ERROR``), else 0."""
    reads: int
    """pread calls made, the failed one included."""
    bytes: int
    """Bytes returned by pread."""
    offset: int
    """File offset of the failed read, or of the block that failed its check; -1 when the share succeeded."""

    @classmethod
    def from_kernel(cls, result: np.ndarray) -> "ShareResult":
        """The share's result row as the kernel wrote it (``row_reader_kernels.RESULT_FIELDS``: this order)."""
        status, err, reads, nbytes, offset = (int(v) for v in result)
        return cls(status=status, errno=err, reads=reads, bytes=nbytes, offset=offset)


@dataclass(frozen=True)
class _ReadPlan:
    """One call's reads, as ``row_reader_kernels.read_groups`` takes them (its arguments of the same names)."""

    span_start: np.ndarray
    """int64 per span: its first byte in the file (page-aligned); ascending, disjoint."""
    span_len: np.ndarray
    """int64 per span: its bytes (whole pages, at most ``max_span``)."""
    span_need: np.ndarray
    """int64 per span: the bytes that must arrive (a span may run past the end of the file)."""
    row_lo: np.ndarray
    """int64 per span: the first row of the sorted request intersecting it."""
    row_hi: np.ndarray
    """int64 per span: one past the last row intersecting it."""
    offsets: np.ndarray
    """int64 per row: the request's offsets, sorted."""
    dest: np.ndarray
    """int64 per row: the row of ``out`` each sorted offset goes to."""
    out: np.ndarray
    """The caller's ``out`` as flat bytes."""
    block_sums: np.ndarray
    """The read checks the read threads verify (empty: none there, checked after the reads or not at all)."""


class RowReader:
    """Reads rows of ``row_bytes`` bytes at arbitrary byte offsets of ``path``.

    direct: open with O_DIRECT (falls back to buffered with a warning where refused); threads:
    reads in flight (default 8); max_span: largest read in bytes, a positive multiple of 4096
    (default 256 KiB); merge_gap: pages of rows at most this many bytes apart are read as one span,
    gap included (default 0: only overlapping or adjacent pages merge); block_sums: the file's read
    checks, one XXH3-64 per ``check_block`` bytes (512 to 4096, a power of two; ``loader.format.read_checks``;
    None: unchecked): every block a requested row touches is verified on its read thread and a
    mismatch raises ``CorruptData`` naming the block. Raises
    ValueError for a bad argument and OSError when the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str], *, row_bytes: int, direct: bool, threads: int = 8,
                 max_span: int = DEFAULT_MAX_SPAN, merge_gap: int = 0, block_sums: np.ndarray | None = None,
                 check_block: int = PAGE) -> None:
        if row_bytes <= 0:
            raise ValueError(f"row_bytes: {row_bytes} is not positive")
        if threads < 1:
            raise ValueError(f"threads: {threads} is below 1")
        if max_span < PAGE or max_span % PAGE:
            raise ValueError(f"max_span: {max_span} is not a positive multiple of {PAGE}")
        if merge_gap < 0:
            raise ValueError(f"merge_gap: {merge_gap} is negative")
        if check_block < 1 or PAGE % check_block:
            raise ValueError(f"check_block: {check_block} does not divide the {PAGE}-byte page")
        self.path = os.fspath(path)
        self.row_bytes = row_bytes
        self.block_sums = np.empty(0, np.uint64) if block_sums is None else np.ascontiguousarray(block_sums, np.uint64)
        self.check_block = check_block
        self.threads = threads
        self.max_span = max_span
        self.merge_gap = merge_gap
        self.direct_requested = direct
        self.direct_active = False
        self.bytes_read = 0
        self.reads = 0
        self.rows_read = 0
        self._lock = threading.Lock()
        self._fd = -1
        self._fd = self._open(direct)
        # one page-aligned bounce buffer per thread (anonymous maps start on a page boundary)
        self._maps = [mmap.mmap(-1, max_span) for _ in range(threads)]
        self._bounce: list[np.ndarray] = [np.frombuffer(m, dtype=np.uint8) for m in self._maps]
        self._pool = (ThreadPoolExecutor(threads, thread_name_prefix="megabatch-rows") if threads > 1 else None)

    def _open(self, direct: bool) -> int:
        flags = os.O_RDONLY | os.O_CLOEXEC
        if direct:
            try:
                fd = os.open(self.path, flags | os.O_DIRECT)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                log.warning("%s: the filesystem refuses O_DIRECT; reading rows through the page cache", self.path)
            else:
                self.direct_active = True
                return fd
        fd = os.open(self.path, flags)
        self.direct_active = False
        # scattered rows: readahead would read (and cache) far more than the pages asked for
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return fd

    def _fall_back_to_buffered(self) -> None:
        log.warning("%s: O_DIRECT read refused (EINVAL); reading rows through the page cache", self.path)
        fd = self._open(direct=False)
        os.close(self._fd)
        self._fd = fd

    def _check_out(self, out: np.ndarray, count: int, rows: np.ndarray | None) -> np.ndarray | None:
        if not isinstance(out, np.ndarray) or out.ndim != 2:
            raise ValueError(f"out: expected a 2-D array, got {getattr(out, 'shape', type(out))}")
        if out.dtype.hasobject or out.shape[1] * out.itemsize != self.row_bytes:
            raise ValueError(f"out: rows of {out.shape[1]} x {out.dtype} are not {self.row_bytes} bytes")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out: must be C-contiguous and writeable")
        if rows is None:
            if out.shape[0] < count:
                raise ValueError(f"out: {out.shape[0]} rows, the request has {count}")
            return None
        dest = np.asarray(rows)
        if dest.ndim != 1 or len(dest) != count or (dest.size and dest.dtype.kind not in "iu"):
            raise ValueError(f"rows: expected {count} integers, got {dest.dtype} {dest.shape}")
        dest = dest.astype(np.int64, copy=False)
        if count:
            if dest.min() < 0 or dest.max() >= out.shape[0]:
                bad = dest[(dest < 0) | (dest >= out.shape[0])][0]
                raise ValueError(f"rows: {bad} is outside out's {out.shape[0]} rows")
            seen = np.zeros(out.shape[0], dtype=np.bool_)
            seen[dest] = True
            if int(np.count_nonzero(seen)) != count:
                raise ValueError("rows: a destination row is repeated")
        return dest

    def read_rows(self, offsets: np.ndarray, out: np.ndarray, rows: np.ndarray | None = None) -> RowReadStats:
        """Copy the ``row_bytes`` bytes at each ``offsets[i]`` into ``out[rows[i]]`` (or ``out[i]``).

        offsets: 1-D integers (int64), any order, repeats allowed; each row must lie within the
        file. out: 2-D, C-contiguous, writeable, each row ``row_bytes`` bytes (any dtype). rows:
        distinct destination rows of ``out`` or None. Other rows of ``out`` are not touched. Raises
        ValueError (naming the argument) before reading anything, OSError (with the path) on a
        read error, ``CorruptData`` on a failed read check; after either the destination rows hold
        partial data.
        """
        t0 = time.perf_counter()
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"{self.path}: the row reader is closed")
            off = np.asarray(offsets)
            if off.ndim != 1 or (off.size and off.dtype.kind not in "iu"):
                raise ValueError(f"offsets: expected a 1-D integer array, got {off.dtype} {off.shape}")
            off = np.ascontiguousarray(off, dtype=np.int64)
            count = len(off)
            dest = self._check_out(out, count, rows)
            if count == 0:
                return RowReadStats(0, 0, 0, time.perf_counter() - t0)
            size = os.fstat(self._fd).st_size
            lowest, highest = int(off.min()), int(off.max())
            if lowest < 0 or highest + self.row_bytes > size:
                bad = lowest if lowest < 0 else highest
                raise ValueError(f"offsets: a row at {bad} does not lie within {self.path} ({size} bytes)")

            order = np.argsort(off, kind="stable")
            sorted_off = off[order]
            sorted_dest = order if dest is None else dest[order]
            starts, lengths = kernels.plan_spans(sorted_off, self.row_bytes, PAGE, self.merge_gap, self.max_span)
            ends = starts + lengths
            # rows intersecting span g: offset < end and offset + row_bytes > start (both monotone)
            row_lo = np.searchsorted(sorted_off, starts - self.row_bytes, side="right")
            row_hi = np.searchsorted(sorted_off, ends, side="left")
            # the span may run past EOF; only up to its last row's end must arrive, or, to check them, its
            # whole blocks up to the end of the file
            if len(self.block_sums):
                need = np.minimum(ends, size) - starts
            else:
                need = np.minimum(ends, sorted_off[row_hi - 1] + self.row_bytes) - starts
            flat = out.reshape(-1).view(np.uint8)
            # rows made of whole, aligned check blocks are checked after the reads, in one pass over ``out``,
            # instead of block by block on the read threads between their preads: the same hashes, but the
            # threads go straight back to the disk (docs/PERFORMANCE.md, "The read path's cost")
            check_after = bool(len(self.block_sums)) and self.row_bytes % self.check_block == 0 and \
                not np.any(off % self.check_block)
            in_threads = self.block_sums[:0] if check_after else self.block_sums
            plan = _ReadPlan(span_start=starts, span_len=lengths, span_need=need, row_lo=row_lo, row_hi=row_hi,
                             offsets=sorted_off, dest=sorted_dest, out=flat, block_sums=in_threads)

            results = self._run(plan)
            failure = _first_failure(results)
            if failure is not None and failure.errno == errno.EINVAL and self.direct_active:
                self._account(results, 0)
                self._fall_back_to_buffered()
                results = self._run(plan)
                failure = _first_failure(results)
            self._account(results, count if failure is None else 0)
            if failure is None and check_after:
                placed = np.arange(count, dtype=np.int64) if dest is None else dest
                bad = first_bad_row(out.view(np.uint8).reshape(len(out), self.row_bytes), placed, off,
                                    self.block_sums, self.check_block)
                if bad >= 0:
                    raise CorruptData(self.path, int(bad), f"the {self.check_block}-byte block")
            if failure is not None:
                at = failure.offset
                if failure.status == kernels.STATUS_CORRUPT:
                    raise CorruptData(self.path, at, f"the {self.check_block}-byte block")
                if failure.status == kernels.STATUS_EOF:
                    raise OSError(errno.EIO, f"file ends at byte {at}, before the requested rows (truncated?)",
                                  self.path)
                raise OSError(failure.errno, f"{os.strerror(failure.errno)} (pread at byte {at})", self.path)
            return RowReadStats(rows=count, reads=sum(r.reads for r in results),
                                bytes=sum(r.bytes for r in results), seconds=time.perf_counter() - t0)

    def _run(self, plan: _ReadPlan) -> list[ShareResult]:
        """Read ``plan``'s spans, in shares of about equal bytes on the pool's threads (or here, for a few)."""
        spans = len(plan.span_start)
        shares = 1 if self._pool is None or spans <= INLINE_MAX_SPANS else min(self.threads, spans)
        results = np.zeros((shares, kernels.RESULT_FIELDS), dtype=np.int64)
        if shares == 1:
            self._share(plan, 0, spans, self._bounce[0], results[0])
            return [ShareResult.from_kernel(results[0])]
        # contiguous shares of about equal bytes, so the threads finish together
        cum = np.cumsum(plan.span_len)
        cuts = np.searchsorted(cum, cum[-1] * np.arange(1, shares) / shares, side="left")
        bounds = np.concatenate(([0], cuts, [spans]))
        assert self._pool is not None
        futures: list[Future[None]] = []
        try:
            for k in range(shares):
                if bounds[k + 1] > bounds[k]:
                    futures.append(self._pool.submit(self._share, plan, int(bounds[k]), int(bounds[k + 1]),
                                                     self._bounce[k], results[k]))
        finally:
            # even when interrupted: reads in flight write into out and the bounce buffers
            wait(futures)
        for fut in futures:
            fut.result()
        # a share left without spans keeps its zeros: STATUS_OK, nothing read
        return [ShareResult.from_kernel(row) for row in results]

    def _share(self, plan: _ReadPlan, g0: int, g1: int, bounce: np.ndarray, result: np.ndarray) -> None:
        kernels.read_groups(self._fd, plan.span_start, plan.span_len, plan.span_need, plan.row_lo, plan.row_hi,
                            plan.offsets, plan.dest, self.row_bytes, plan.out, bounce, g0, g1, result,
                            plan.block_sums, self.check_block)

    def _account(self, results: list[ShareResult], rows: int) -> None:
        self.reads += sum(r.reads for r in results)
        self.bytes_read += sum(r.bytes for r in results)
        self.rows_read += rows

    def close(self) -> None:
        """Stop the pool, close the file and free the buffers; a second call does nothing."""
        with self._lock:
            if self._fd < 0:
                return
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            os.close(self._fd)
            self._fd = -1
            # dropped, not mmap.close()d: numba's first compile keeps its arguments (a bounce view)
            # alive until the next gc cycle, and close() refuses while a view exists
            self._bounce = []
            self._maps = []

    def __enter__(self) -> "RowReader":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _first_failure(results: list[ShareResult]) -> ShareResult | None:
    """The first share that failed, or None."""
    return next((r for r in results if r.status != kernels.STATUS_OK), None)
