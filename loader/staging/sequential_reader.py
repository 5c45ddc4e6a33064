"""One sequential, checked pass over the chunks of ``features.bin`` that hold a set of rows.

A chunk is ``chunk_bytes`` of the file from a multiple of ``chunk_bytes``, read past its end up to the last wanted
row that starts in it, in large O_DIRECT reads (buffered where the filesystem refuses them). A read-ahead thread
reads the next chunk while the caller copies rows out of the current one, so the disk and the copies overlap.
Every chunk is checked against the dataset's block checksums (format 1.2, as the row reader does) before a byte of
it is used; a failure raises ``CorruptData`` naming the file and the byte.

Two users: ``WindowStager`` stages a window's rows from such a pass (``chunks``), and a cache or a superbatch's
partitions load their rows by one (``read_rows``), which is how rows spread over the whole file load in seconds
instead of a random read each.

A pass is checked for a stop between chunks: a ``stop`` event set (its stream ended) or the reader closed raises
``PassStopped`` before the next chunk is used, once the read ahead in flight has landed. So a stream stopped
mid-pass waits for at most a chunk or two, not for the rest of a superbatch's pass.

Memory held (``reader_buffer_bytes``): two chunk buffers (``chunk_bytes`` plus one row's pages each, O_DIRECT
aligned) and a scatter buffer (``scatter_bytes``, at least a chunk's worth) that rows are gathered into.
"""

import errno
import mmap
import os
import threading
import time
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loader.format.read_checks import verify_blocks
from loader.staging.scratch_files import aligned_buffer, open_direct
from loader.staging.staging_kernels import copy_rows_from
from loader.staging.window_plan import STAGING_ALIGN

__all__ = ["SequentialReader", "PassStopped", "StagingStats", "reader_buffer_bytes", "scatter_buffer_bytes",
           "equal_runs", "DEFAULT_CHUNK_BYTES", "DEFAULT_SCATTER_BYTES"]

DEFAULT_CHUNK_BYTES = 8 << 20
"""Bytes of ``features.bin`` per sequential read: large enough for the disk's sequential rate."""
DEFAULT_SCATTER_BYTES = 32 << 20
"""Most bytes of rows gathered before they are written out (a chunk's rows times the batches that want them)."""


class PassStopped(Exception):
    """A pass given up between two chunks: its stream stopped, or its reader closed. Nothing it read is used."""


@dataclass
class StagingStats:
    """What a pass (and, staging a window, its writes) cost."""

    chunks: int = 0
    file_bytes_read: int = 0
    staged_bytes: int = 0
    writes: int = 0
    chunk_seconds: list[float] = field(default_factory=list)
    """Each chunk's read, issue to last byte (read ahead or not): one entry per chunk, for the daemon's read-latency
    histogram (a pass has at most a file's worth of chunks, so the list stays short)."""


def _tail_bytes(row_bytes: int) -> int:
    """A chunk's read runs past its end by the pages of a row that starts inside it."""
    return -(-row_bytes // STAGING_ALIGN) * STAGING_ALIGN


def _scatter_size(row_bytes: int, chunk_bytes: int, scatter_bytes: int) -> int:
    """The scatter buffer: at least a chunk's rows for one batch, after that batch's partial page and up to a page
    of padding."""
    return max(scatter_bytes, chunk_bytes + _tail_bytes(row_bytes) + 2 * STAGING_ALIGN)


def scatter_buffer_bytes(*, row_bytes: int, chunk_bytes: int, scatter_bytes: int) -> int:
    """RAM a scatter buffer of a reader of these sizes holds, in whole pages."""
    return -(-_scatter_size(row_bytes, chunk_bytes, scatter_bytes) // STAGING_ALIGN) * STAGING_ALIGN


def reader_buffer_bytes(*, row_bytes: int, chunk_bytes: int, scatter_bytes: int) -> int:
    """RAM a ``SequentialReader`` of these sizes holds: two chunk buffers and the scatter buffer, in whole pages."""
    chunk = -(-(chunk_bytes + _tail_bytes(row_bytes)) // STAGING_ALIGN) * STAGING_ALIGN
    return 2 * chunk + scatter_buffer_bytes(row_bytes=row_bytes, chunk_bytes=chunk_bytes, scatter_bytes=scatter_bytes)


def equal_runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, end) positions of each run of equal values in ``keys`` (non-empty)."""
    first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return first, np.append(first[1:], len(keys))


class SequentialReader:
    """Checked sequential passes over one file of rows of ``row_bytes``; see the module docstring.

    block_sums / check_block: the file's read checks (``ReadChecks.feature_blocks`` and ``feature_block``), or
    None (unchecked); direct: O_DIRECT reads (falls back to buffered where refused); chunk_bytes, scatter_bytes:
    the buffers (``reader_buffer_bytes`` sums what they hold). One pass at a time: ``lock`` is held through it.
    """

    def __init__(self, path: str | os.PathLike[str], *, row_bytes: int, block_sums: np.ndarray | None = None,
                 check_block: int = 4096, direct: bool = True, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 scatter_bytes: int = DEFAULT_SCATTER_BYTES) -> None:
        if row_bytes <= 0:
            raise ValueError(f"row_bytes: {row_bytes} is not positive")
        if chunk_bytes < STAGING_ALIGN or chunk_bytes % STAGING_ALIGN:
            raise ValueError(f"chunk_bytes: {chunk_bytes} is not a positive multiple of {STAGING_ALIGN}")
        self.path = Path(path)
        self.row_bytes = row_bytes
        self.block_sums = block_sums
        self.check_block = check_block
        self.chunk_bytes = chunk_bytes
        self.scatter_bytes = _scatter_size(row_bytes, chunk_bytes, scatter_bytes)
        self.lock = threading.Lock()
        """Held through a pass: the chunk buffers and ``scatter`` are one pass's at a time."""
        self._closing = threading.Event()
        self._fd, self.direct = open_direct(self.path, os.O_RDONLY, direct)
        self.file_size = os.fstat(self._fd).st_size
        tail = _tail_bytes(row_bytes)
        self._chunks = (aligned_buffer(chunk_bytes + tail), aligned_buffer(chunk_bytes + tail))
        self.scatter = np.frombuffer(aligned_buffer(self.scatter_bytes), dtype=np.uint8)
        """Where rows are gathered from a chunk (a stager writes them out from here)."""
        self._read_ahead = ThreadPoolExecutor(1, thread_name_prefix="megabatch-staging")

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def chunks(self, starts: list[int], needs: list[int], stats: StagingStats,
               stop: threading.Event | None = None) -> Generator[tuple[int, np.ndarray], None, None]:
        """(start, bytes) of each chunk at ``starts`` (page aligned, ascending; at least ``needs`` bytes each), read
        in order, counted in ``stats`` and checked against the block sums. Raises ``PassStopped`` before a chunk
        once ``stop`` is set or the reader closes. Call it holding ``lock``, and close the iterator
        (``contextlib.closing``) so that a read in flight lands before its buffer is used again."""
        if self.closed:
            raise ValueError(f"{self.path}: the reader is closed")
        def stopped() -> bool:
            return self._closing.is_set() or (stop is not None and stop.is_set())

        pending: Future[tuple[int, float]] | None = None
        try:
            for i, (c0, need) in enumerate(zip(starts, needs)):
                if stopped():
                    raise PassStopped(f"{self.path}: pass stopped before chunk {i} of {len(starts)}")
                buffer = self._chunks[i % 2]
                got, seconds = pending.result() if pending is not None else self._read_chunk(buffer, c0, need)
                pending = None
                if i + 1 < len(starts) and not stopped():  # a read the pass would throw away is not started
                    pending = self._read_ahead.submit(self._read_chunk, self._chunks[(i + 1) % 2], starts[i + 1],
                                                      needs[i + 1])
                stats.chunks += 1
                stats.file_bytes_read += got
                stats.chunk_seconds.append(seconds)
                chunk = np.frombuffer(buffer, dtype=np.uint8)
                if self.block_sums is not None:
                    verify_blocks(self.block_sums, self.check_block, chunk, np.zeros(1, np.int64),
                                  np.array([min(got, self.file_size - c0)], np.int64), np.array([c0], np.int64),
                                  self.path)
                yield c0, chunk
        finally:
            if pending is not None:
                wait([pending])

    def _read_chunk(self, buffer: mmap.mmap, at: int, need: int) -> tuple[int, float]:
        """Read at least ``need`` bytes of the file from ``at`` (page aligned) into ``buffer``: (bytes read, seconds
        the read took)."""
        length = min(-(-need // STAGING_ALIGN) * STAGING_ALIGN, len(buffer))
        view = memoryview(buffer)
        started = time.perf_counter()
        done = 0
        while done < need:
            try:
                got = os.preadv(self._fd, [view[done:length]], at + done)
            except OSError as err:
                raise OSError(err.errno, f"{err.strerror} (read at byte {at + done})", str(self.path)) from err
            if got == 0:
                raise OSError(errno.EIO, f"the file ends at byte {at + done}, before the rows staged from it (it "
                                         f"shrank after the daemon started?)", str(self.path))
            done += got
        return done, time.perf_counter() - started

    def gather(self, chunk: np.ndarray, source: np.ndarray, at: int) -> None:
        """The chunk's rows at ``source`` (byte offsets in it) to ``scatter`` from byte ``at`` on."""
        if self.row_bytes % 8 == 0 and at % 8 == 0:  # rows start 8-aligned in the chunk (pages, whole rows): words
            copy_rows_from(chunk.view(np.uint64), source // 8, self.scatter[at:].view(np.uint64),
                           self.row_bytes // 8)
        else:
            copy_rows_from(chunk, source, self.scatter[at:], self.row_bytes)

    def read_rows(self, offsets: np.ndarray, out: np.ndarray, rows: np.ndarray,
                  stop: threading.Event | None = None) -> StagingStats:
        """The rows at byte ``offsets`` of the file into ``out[rows]`` (2-D, C-contiguous rows of ``row_bytes``;
        ``rows`` distinct) by one pass over the chunks holding them. ``offsets`` distinct, in any order. Returns
        what it read (``chunks``, ``file_bytes_read``); raises ``PassStopped`` as ``chunks`` does (``out`` then
        holds some of the rows)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        if out.ndim != 2 or out.shape[1] * out.itemsize != self.row_bytes or not out.flags.c_contiguous:
            raise ValueError(f"out: {out.dtype} {out.shape}, expected C-contiguous rows of {self.row_bytes} bytes")
        if offsets.shape != rows.shape or offsets.ndim != 1:
            raise ValueError("offsets and rows: expected two 1-D arrays of one length")
        stats = StagingStats()
        if not len(offsets):
            return stats
        if offsets.min() < 0 or int(offsets.max()) + self.row_bytes > self.file_size:
            raise ValueError(f"offsets: a row lies outside {self.path} ({self.file_size} bytes)")
        if rows.min() < 0 or rows.max() >= len(out):
            raise ValueError(f"rows: expected row numbers of out's {len(out)}")
        order = np.argsort(offsets, kind="stable")
        offsets, rows = offsets[order], rows[order]
        if np.any(offsets[1:] == offsets[:-1]):  # a chunk's rows must fit the scatter buffer
            raise ValueError("offsets: a row is asked for twice")
        dest = out.view(np.uint8).reshape(len(out), self.row_bytes)
        # a chunk starts at a multiple of chunk_bytes and holds the rows starting in it (read past its end)
        chunk_of = offsets // self.chunk_bytes
        firsts, ends = equal_runs(chunk_of)
        starts = (chunk_of[firsts] * self.chunk_bytes).tolist()
        needs = (offsets[ends - 1] + self.row_bytes - chunk_of[firsts] * self.chunk_bytes).tolist()
        with self.lock, closing(self.chunks(starts, needs, stats, stop)) as chunks:
            for (c0, chunk), lo, hi in zip(chunks, firsts.tolist(), ends.tolist()):
                self.gather(chunk, offsets[lo:hi] - c0, 0)  # into the scatter buffer, in file order
                dest[rows[lo:hi]] = self.scatter[:(hi - lo) * self.row_bytes].reshape(hi - lo, self.row_bytes)
        return stats

    def close(self) -> None:
        """Stop a pass in flight at its next chunk, wait for it, and close the file."""
        self._closing.set()
        with self.lock:
            self._read_ahead.shutdown()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> "SequentialReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
