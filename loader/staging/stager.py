"""Stage a window of batches' feature rows with one sequential pass over ``features.bin``.

The exact mode reads every missed row on its own: ~10k random 4 KiB reads per batch, which caps it
at a few batches/s on this disk however good the cache plan. A window of H batches (H in the
hundreds) needs most of the file's blocks anyway (docs/PERFORMANCE.md, "How dense a window's reads
get"), so this stager reads the file once per window, in large sequential O_DIRECT chunks, and
writes each batch's rows (``loader.staging.window_plan``: file order, one region per batch) into a
staging file: on SSD under ``staging_dir`` (an unnamed O_TMPFILE, gone when the stager closes or the
process dies, and rewritten by later windows meanwhile, ``ScratchFiles``; O_DIRECT where the
filesystem takes it, else written through the page cache and flushed every ``flush_bytes``), or in
RAM (a memfd) without one. The pass is a ``SequentialReader``'s (``loader.staging.sequential_reader``: read
ahead, checked, stopped between chunks when its stream stops), and the stager writes one chunk's rows out while
the next is read. At publish, ``read_batch`` reads a batch's region back sequentially, in pieces of at most
``READ_BACK_BYTES``, and gathers its rows into the sampled order. The batches are the exact mode's, so their
features equal the in-memory sampler's bitwise; only where they come from changes. This is DiskGNN's packed
per-batch layout (arXiv 2405.05231) built online per window, with AGNES's block reads (arXiv 2601.01473) as the
way in.

Every byte is checked where it is read: the file's chunks against the dataset's block checksums
(format 1.2, as the row reader does), each batch's region against the XXH3-64 of what was written
into it (a staging file is ours, but the disk under it is not). A window whose pass stops (``PassStopped``)
gives its staging file back and is never read.

Memory held (``stager_buffer_bytes``): the reader's (``reader_buffer_bytes``: two chunk buffers of
``chunk_bytes`` plus one row's pages each, O_DIRECT aligned, and a scatter buffer of ``scatter_bytes``), two
read-back buffers of a piece of a region each (``READ_BACK_BYTES`` at most: the next piece is read ahead while
one is gathered), and, with O_DIRECT writes, a second scatter buffer and a partial page per batch of the window,
else about twice ``flush_bytes`` of staging writes in the page cache (dirty, or written back and not yet dropped).
"""

import ctypes
import mmap
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from loader.caches.changeset_kernels import copy_rows
from loader.format.read_checks import CorruptData
from loader.staging.scratch_files import ScratchFile, ScratchFiles, aligned_buffer, read_exactly
from loader.staging.sequential_reader import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_SCATTER_BYTES,
    SequentialReader,
    StagingStats,
    equal_runs,
    reader_buffer_bytes,
    scatter_buffer_bytes,
)
from loader.staging.staging_kernels import scatter_pieces
from loader.staging.window_plan import STAGING_ALIGN, WindowPlan

# the pass's sizes and stats are the reader's; named here too for the stager's callers
__all__ = ["WindowStager", "StagedWindow", "StagingStats", "stager_buffer_bytes", "DEFAULT_CHUNK_BYTES",
           "DEFAULT_SCATTER_BYTES", "FLUSH_BYTES"]

FLUSH_BYTES = 64 << 20
"""Staging bytes written to a file on disk between two flushes. A flush starts the write-back of what is
dirty (``sync_file_range``, not waiting) and drops from the page cache what the previous flush wrote
back, so the page cache holds at most about twice this (it counts against a cgroup's memory) while the
disk writes behind the stager's pass instead of stopping it. The window's last flush does not wait
either: its batches are read back after the previous window's, by when the disk has written them
(an O_DIRECT read of a range still dirty writes it first); ``read_batch`` drops each region it read."""

WRITE_THREADS = 8
"""O_DIRECT staging writes in flight: each waits for the disk, and one at a time (a batch's run of a chunk, tens
of KiB) left the pass at 0.45x the disk's sequential rate, 52 ms a batch (bench/compare, 192M, 64 batches)."""

READ_BACK_BYTES = 4 << 20
"""Most bytes of a batch's region read back at once. A region is a batch's uncached rows (6.6 MB a batch on
bench/compare's 1M-node graph), and buffers sized for a whole batch's rows took 27 MiB of a 448M budget
that the feature cache now gets; 4 MiB O_DIRECT reads keep the disk at its sequential rate."""

KEPT_FILES = 3
"""Staging files kept for later windows: one is read back while the next is staged, and a third may wait staged
between them (the pipeline's superbatches in flight)."""

_libc = ctypes.CDLL(None, use_errno=True)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    _sync_file_range.restype = ctypes.c_int
_SYNC_FILE_RANGE_WRITE = 2


@dataclass
class StagedWindow:
    """One window's staging file, ready to read back; ``close`` gives the file back (to be rewritten by a later
    window, or closed)."""

    plan: WindowPlan
    file: ScratchFile
    digests: np.ndarray
    """uint64 [B]: XXH3-64 of each batch's region as written."""
    release: Callable[[ScratchFile], None] = ScratchFile.close
    """What ``close`` does with the file (``ScratchFiles.give``)."""
    stats: StagingStats = field(default_factory=StagingStats)
    reading: "Future[tuple[mmap.mmap, int, float]] | None" = None
    """A read ahead of a piece of one of its regions in flight (``close`` waits for it: it reads ``read_fd``)."""

    def __post_init__(self) -> None:
        # a window a stopped stream drops unread still gives its file back when it is collected
        self._closer = weakref.finalize(self, self.release, self.file)

    @property
    def fd(self) -> int:
        return self.file.fd

    @property
    def read_fd(self) -> int:
        return self.file.read_fd

    @property
    def direct_writes(self) -> bool:
        """Written with O_DIRECT: nothing of it is in the page cache (no flushes, no drops)."""
        return self.file.direct_writes

    def close(self) -> None:
        if self.reading is not None:
            wait([self.reading])
            self.reading = None
        self._closer()


def _piece_rows(row_bytes: int) -> int:
    """Rows of a region read back at once (``READ_BACK_BYTES``, at least one row)."""
    return max(1, READ_BACK_BYTES // row_bytes)


def _piece_buffer_bytes(row_bytes: int, rows: int) -> int:
    """Most bytes an O_DIRECT read of ``rows`` consecutive rows of a region takes: their pages, and one more where
    their first row starts inside a page."""
    return -(-rows * row_bytes // STAGING_ALIGN) * STAGING_ALIGN + (STAGING_ALIGN if rows else 0)


def _start_writeback(fd: int) -> None:
    """Start writing back ``fd``'s dirty pages without waiting for them (``fdatasync`` where the libc lacks
    ``sync_file_range``)."""
    if _sync_file_range is None or _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
        os.fdatasync(fd)


def stager_buffer_bytes(*, row_bytes: int, batch_rows: int, chunk_bytes: int, scatter_bytes: int, flush_bytes: int,
                        on_disk: bool, direct_writes: bool = False, window_batches: int = 0) -> int:
    """RAM a ``WindowStager`` of these sizes holds: its reader's (``reader_buffer_bytes``), two read-back buffers
    of a piece of a region, at most ``READ_BACK_BYTES`` or a batch of ``batch_rows`` distinct rows (one read
    ahead) and, staging on disk, either a second scatter buffer and a partial page per batch of a window of
    ``window_batches`` (``direct_writes``: O_DIRECT, nothing in the page cache) or twice ``flush_bytes`` of the
    page cache (the writes since the last flush, and those it sent to the disk, dropped at the next)."""
    reader = reader_buffer_bytes(row_bytes=row_bytes, chunk_bytes=chunk_bytes, scatter_bytes=scatter_bytes)
    scatter = scatter_buffer_bytes(row_bytes=row_bytes, chunk_bytes=chunk_bytes, scatter_bytes=scatter_bytes)
    back = 2 * _piece_buffer_bytes(row_bytes, min(batch_rows, _piece_rows(row_bytes)))
    if not on_disk:
        pages = 0
    elif direct_writes:
        pages = window_batches * STAGING_ALIGN + scatter  # and the second scatter buffer
    else:
        pages = 2 * flush_bytes
    return reader + back + pages


class WindowStager:
    """Stages windows of one ``features.bin``; see the module docstring.

    block_sums / check_block: the file's read checks (``ReadChecks.feature_blocks`` and
    ``feature_block``), or None (unchecked); staging_dir: where staging files go (None: RAM);
    direct: O_DIRECT for the file's chunks (falls back to buffered where refused); direct_scratch:
    O_DIRECT for the staging files' writes and read-backs where their filesystem takes it (default: as
    ``direct``); chunk_bytes, scatter_bytes, flush_bytes: the buffers (``stager_buffer_bytes`` sums what
    they hold). ``stage`` calls are serialized with each other and with ``reader``'s passes, ``read_batch`` calls
    with each other; one of each may run at once.
    """

    def __init__(self, features_path: str | os.PathLike[str], *, row_bytes: int, staging_dir: Path | None,
                 block_sums: np.ndarray | None = None, check_block: int = 4096, direct: bool = True,
                 direct_scratch: bool | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 scatter_bytes: int = DEFAULT_SCATTER_BYTES, flush_bytes: int = FLUSH_BYTES) -> None:
        self.reader = SequentialReader(features_path, row_bytes=row_bytes, block_sums=block_sums,
                                       check_block=check_block, direct=direct, chunk_bytes=chunk_bytes,
                                       scatter_bytes=scatter_bytes)
        """The file's checked sequential passes (a cache's rows load by its ``read_rows``)."""
        self.path, self.row_bytes, self.chunk_bytes = self.reader.path, row_bytes, chunk_bytes
        self.file_size, self.scatter_bytes = self.reader.file_size, self.reader.scatter_bytes
        self.staging_dir = staging_dir
        self.flush_bytes = flush_bytes
        # a window is staged from the reader's buffers, so it holds the reader's lock throughout
        self._stage_lock = self.reader.lock
        self._read_lock = threading.Lock()
        # staging files are rewritten by later windows (O_DIRECT writes into holes are slow; ScratchFiles)
        scratch = direct if direct_scratch is None else direct_scratch
        self._files = ScratchFiles(staging_dir, direct_reads=scratch, direct_writes=scratch, keep=KEPT_FILES)
        self._writers = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="megabatch-stage-write")
        self._flusher = ThreadPoolExecutor(1, thread_name_prefix="megabatch-flush")
        self._flushing: Future[None] | None = None
        # O_DIRECT writes leave from the scatter buffers: one is filled while the other's writes are in flight
        # (the second is touched only by direct writes, so only they hold its pages)
        self._scatters = [self.reader.scatter, np.frombuffer(aligned_buffer(self.scatter_bytes), dtype=np.uint8)]
        self._scatter = self._scatters[0]  # the buffered path's, and the last pages'
        self._writing: list[list[Future[None]]] = [[], []]
        self._turn = 0
        # two read-back buffers: the next piece (of this batch's region or the next batch's) is read ahead while
        # one is gathered
        self._piece_rows = _piece_rows(row_bytes)
        self._backs: list[mmap.mmap | None] = [None, None]
        self._back_turn = 0
        self._read_back = ThreadPoolExecutor(1, thread_name_prefix="megabatch-readback")
        self._ahead: tuple[StagedWindow, int, int, Future[tuple[mmap.mmap, int, float]]] | None = None
        self._unflushed = 0

    @property
    def direct(self) -> bool:
        """The file's chunks are read with O_DIRECT."""
        return self.reader.direct

    def stage(self, plan: WindowPlan, stop: threading.Event | None = None) -> StagedWindow:
        """Read every chunk of the file holding a row of ``plan`` once, in order, and write the rows out. Raises
        ``PassStopped`` between two chunks once ``stop`` is set (or the stager closes), its staging file given
        back and its writes landed."""
        if plan.row_bytes != self.row_bytes:
            raise ValueError(f"plan: rows of {plan.row_bytes} bytes, the file has {self.row_bytes}")
        if plan.chunk_bytes != self.chunk_bytes:
            raise ValueError(f"plan: chunks of {plan.chunk_bytes} bytes, the stager reads {self.chunk_bytes}")
        starts, los, his = plan.chunk_runs()
        if len(starts) and int(starts[-1]) + self._need(plan, int(los[-1]), int(his[-1])) > self.file_size:
            raise ValueError(f"plan: a row lies past the end of {self.path} ({self.file_size} bytes)")
        with self._stage_lock:
            if self.reader.closed:
                raise ValueError(f"{self.path}: the stager is closed")
            staged = StagedWindow(plan, self._files.take(plan.staging_bytes),
                                  np.zeros(plan.num_batches, dtype=np.uint64), self._files.give)
            try:
                self._fill(staged, stop)
            except BaseException:
                staged.close()
                raise
            return staged

    def _fill(self, staged: StagedWindow, stop: threading.Event | None) -> None:
        plan, stats = staged.plan, staged.stats
        hashers = [xxhash.xxh3_64() for _ in range(plan.num_batches)]
        # bytes of each batch's region written, sent to the disk by a flush, and dropped from the page cache
        self._written_to = np.zeros(plan.num_batches, dtype=np.int64)
        self._flushed_to = np.zeros(plan.num_batches, dtype=np.int64)
        self._dropped_to = np.zeros(plan.num_batches, dtype=np.int64)
        self._unflushed = 0
        # O_DIRECT writes go out in whole pages: each batch's last partial page waits here for its next rows
        self._tails = np.zeros((plan.num_batches if staged.direct_writes else 0, STAGING_ALIGN), dtype=np.uint8)
        self._tail_len = np.zeros(plan.num_batches, dtype=np.int64)
        starts, los, his = plan.chunk_runs()  # only the chunks holding a staged row are read
        needs = [self._need(plan, lo, hi) for lo, hi in zip(los.tolist(), his.tolist())]
        try:
            with closing(self.reader.chunks(starts.tolist(), needs, stats, stop)) as chunks:
                for (_, chunk), lo, hi in zip(chunks, los.tolist(), his.tolist()):
                    batch, source = plan.fields(lo, hi)
                    self._scatter_chunk(staged, hashers, chunk, batch, source)
            self._settle(0)
            self._settle(1)
        except BaseException:
            if self._flushing is not None:  # a failed (or stopped) window's file goes back: its flush lands first
                wait([self._flushing])
                self._flushing = None
            raise
        finally:
            # writes in flight read the scatter buffers and write the file, which a failed window gives back
            wait(self._writing[0] + self._writing[1])
            self._writing = [[], []]
        for b, hasher in enumerate(hashers):
            staged.digests[b] = hasher.intdigest()
        if staged.direct_writes:
            last = np.flatnonzero(self._tail_len)  # the regions' last pages, zero-padded
            per = self.scatter_bytes // STAGING_ALIGN
            for g in range(0, len(last), per):
                group = last[g:g + per]
                pages = self._scatter[:len(group) * STAGING_ALIGN].reshape(-1, STAGING_ALIGN)
                pages[:] = self._tails[group]
                self._writing[0] = self._submit_writes(staged.fd, [
                    (pages[k].data, int(plan.batch_base[b]) + int(self._written_to[b]))
                    for k, b in enumerate(group.tolist())])
                self._settle(0)
            self._tails = self._tails[:0]
        elif self.staging_dir is not None:
            self._flush(staged)
            # the staging fd must outlive the flusher's call on it (a closed number may be reused)
            assert self._flushing is not None
            self._flushing.result()
            self._flushing = None
        staged.plan = plan.without_keys()  # read-back needs the regions only

    def _need(self, plan: WindowPlan, lo: int, hi: int) -> int:
        """Bytes of a chunk to read: up to the end of the last row starting in it that the pass wants."""
        return int(plan.fields(lo, hi)[1].max()) + self.row_bytes

    def _scatter_chunk(self, staged: StagedWindow, hashers: list["xxhash.xxh3_64"], chunk: np.ndarray,
                       batch: np.ndarray, source: np.ndarray) -> None:
        """Copy the chunk's rows (``source``: their offsets in it, grouped by ``batch``) into the scatter buffer
        batch by batch and write each batch's run out at the end of what its region holds so far."""
        first, end = equal_runs(batch)
        if staged.direct_writes:
            self._scatter_direct(staged, hashers, chunk, batch, source, first, end)
            return
        plan, stats = staged.plan, staged.stats
        cap = self.scatter_bytes // self.row_bytes
        i = 0
        while i < len(first):
            # as many batches as the scatter buffer holds, at least one (a run never exceeds a chunk's rows)
            j = i + max(1, int(np.searchsorted(end[i:] - first[i], cap, side="right")))
            s0, s1 = int(first[i]), int(end[j - 1])
            self.reader.gather(chunk, source[s0:s1], 0)
            at = 0
            for k0, k1 in zip(first[i:j].tolist(), end[i:j].tolist()):
                b = int(batch[k0])
                nbytes = (k1 - k0) * self.row_bytes
                piece = self._scatter[at:at + nbytes].data
                self._pwrite(staged.fd, piece, int(plan.batch_base[b]) + int(self._written_to[b]))
                hashers[b].update(piece)
                self._written_to[b] += nbytes
                stats.writes += 1
                at += nbytes
            stats.staged_bytes += at
            self._unflushed += at
            if self.staging_dir is not None and self._unflushed >= self.flush_bytes:
                self._flush(staged)
            i = j

    def _scatter_direct(self, staged: StagedWindow, hashers: list["xxhash.xxh3_64"], chunk: np.ndarray,
                        batch: np.ndarray, source: np.ndarray, first: np.ndarray, end: np.ndarray) -> None:
        """``_scatter_chunk`` with O_DIRECT writes: each batch's run goes behind its held partial page, at a
        page boundary of the scatter buffer; its whole pages are written, the rest is held for its next run.
        A direct write returns when the disk has the data, so a group's writes (one per batch, tens of KiB)
        are issued together, ``WRITE_THREADS`` at once, and waited for before the buffer is reused: groups alternate
        between two buffers, so one is laid out while the other's writes are in flight."""
        plan, stats = staged.plan, staged.stats
        runs = (end - first) * self.row_bytes
        held = self._tail_len[batch[first]]
        # each batch's piece of the scatter buffer: its held bytes and its run, rounded up to pages
        span = -(-(held + runs) // STAGING_ALIGN) * STAGING_ALIGN
        unit = 8 if self.row_bytes % 8 == 0 else 1  # rows, pages and partial pages in words where they can be
        words = (lambda a: a.view(np.uint64)) if unit == 8 else (lambda a: a)
        owner = batch[first]
        i = 0
        while i < len(first):
            k, self._turn = self._turn, self._turn ^ 1
            self._settle(k)  # buffer k's writes are done: it may be filled again
            scatter = self._scatters[k]
            j = i + max(1, int(np.searchsorted(np.cumsum(span[i:]), self.scatter_bytes, side="right")))
            at = np.zeros(j - i, dtype=np.int64)
            np.cumsum(span[i:j - 1], out=at[1:])
            whole = np.empty(j - i, dtype=np.int64)
            held_units = self._tail_len // unit  # the kernel counts in units; the stager keeps bytes
            scatter_pieces(words(chunk), source // unit, first[i:j], end[i:j], owner[i:j], at // unit,
                           self.row_bytes // unit, STAGING_ALIGN // unit, words(self._tails), held_units,
                           words(scatter), whole)
            self._tail_len[:] = held_units * unit
            whole *= unit
            writes: list[tuple[memoryview, int]] = []
            for b, a, t, n, w in zip(owner[i:j].tolist(), at.tolist(), held[i:j].tolist(), runs[i:j].tolist(),
                                     whole.tolist()):
                hashers[b].update(scatter[a + t:a + t + n].data)
                if w:
                    writes.append((scatter[a:a + w].data, int(plan.batch_base[b]) + int(self._written_to[b])))
                    self._written_to[b] += w
                stats.staged_bytes += n
            stats.writes += len(writes)
            self._writing[k] = self._submit_writes(staged.fd, writes)  # the next group fills the other buffer
            i = j

    def _submit_writes(self, fd: int, writes: list[tuple[memoryview, int]]) -> list[Future[None]]:
        """``writes`` (data, offset) in ``WRITE_THREADS`` runs, one task each: a future per write cost more than
        the copies."""
        return [self._writers.submit(self._pwrite_all, fd, writes[r::WRITE_THREADS])
                for r in range(min(WRITE_THREADS, len(writes)))]

    def _settle(self, k: int) -> None:
        """Wait for scatter buffer ``k``'s writes; raises the first failure (ENOSPC, EIO)."""
        tasks, self._writing[k] = self._writing[k], []
        wait(tasks)
        for task in tasks:
            task.result()

    @classmethod
    def _pwrite_all(cls, fd: int, writes: list[tuple[memoryview, int]]) -> None:
        for data, at in writes:
            cls._pwrite(fd, data, at)

    @staticmethod
    def _pwrite(fd: int, data: memoryview, at: int) -> None:
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], at + written)

    def _flush(self, staged: StagedWindow) -> None:
        """Drop from the page cache what the previous flush sent to the disk (only those ranges: a whole-file
        DONTNEED walks every cached page of the file), then have the flusher thread start writing back what
        is dirty now (``sync_file_range`` blocks while the disk's queue is full: not the stager's time)."""
        fd, base = staged.fd, staged.plan.batch_base
        if self._flushing is not None:
            self._flushing.result()
        drop = np.flatnonzero(self._flushed_to > self._dropped_to)
        for b, begin, end in zip(drop.tolist(), self._dropped_to[drop].tolist(), self._flushed_to[drop].tolist()):
            os.posix_fadvise(fd, int(base[b]) + begin, end - begin, os.POSIX_FADV_DONTNEED)
        self._dropped_to[drop] = self._flushed_to[drop]
        self._flushed_to[:] = self._written_to
        self._flushing = self._flusher.submit(_start_writeback, fd)
        self._unflushed = 0

    def read_batch(self, staged: StagedWindow, b: int, gather: np.ndarray, out: np.ndarray,
                   rows: np.ndarray | None = None) -> list[float]:
        """Batch ``b``'s staged rows into ``out`` (2-D, C-contiguous, rows of ``row_bytes``): staged row
        ``gather[k]`` of the batch (``window_plan.batch_gather``) to ``out[rows[k]]`` (default: ``out[k]``;
        ``rows`` distinct). Raises ``CorruptData`` when the region read back differs from what was written.
        Returns the seconds each piece of the region took to read (read ahead or not), one per piece."""
        plan = staged.plan
        if not 0 <= b < plan.num_batches:
            raise ValueError(f"b: {b} is outside the window's {plan.num_batches} batches")
        gather = np.asarray(gather)
        count = len(gather)
        staged_rows = int(plan.staged_counts[b])
        if gather.ndim != 1 or (count and (gather.dtype.kind not in "iu" or gather.min() < 0
                                           or gather.max() >= staged_rows)):
            raise ValueError(f"gather: expected indices of batch {b}'s {staged_rows} staged rows")
        if out.ndim != 2 or out.shape[1] * out.itemsize != self.row_bytes or not out.flags.c_contiguous:
            raise ValueError(f"out: {out.dtype} {out.shape}, expected C-contiguous rows of {self.row_bytes} bytes")
        if rows is None:
            if out.shape[0] < count:
                raise ValueError(f"out: {out.shape[0]} rows, batch {b} has {count}")
        else:
            rows = np.asarray(rows)
            if rows.shape != (count,) or (count and (rows.dtype.kind not in "iu" or rows.min() < 0
                                                      or rows.max() >= out.shape[0])):
                raise ValueError(f"rows: expected {count} row numbers of out's {out.shape[0]}")
            rows = rows.astype(np.int64, copy=False)
        with self._read_lock:
            return self._read_region(staged, b, gather.astype(np.int64, copy=False), out, rows)

    def _read_region(self, staged: StagedWindow, b: int, gather: np.ndarray, out: np.ndarray,
                     rows: np.ndarray | None) -> list[float]:
        plan = staged.plan
        base, nbytes = plan.region(b)
        per = self._piece_rows
        pieces = [(lo, min(lo + per, nbytes // self.row_bytes)) for lo in range(0, nbytes // self.row_bytes, per)]
        dest = out.view(np.uint8).reshape(len(out), self.row_bytes)
        words = self.row_bytes % 8 == 0 and dest.ctypes.data % 8 == 0  # words: 4x a byte-wise copy
        if words:
            dest = dest.view(np.uint64)
        targets = np.arange(len(gather), dtype=np.int64) if rows is None else rows
        piece_of = gather // per if len(pieces) > 1 else None
        hasher = xxhash.xxh3_64()
        seconds: list[float] = []
        for k, (lo, hi) in enumerate(pieces):
            back, skip, took = self._take_piece(staged, b, k)
            seconds.append(took)
            self._read_ahead_after(staged, b, k, len(pieces))
            piece = np.frombuffer(back, dtype=np.uint8, count=(hi - lo) * self.row_bytes, offset=skip)
            hasher.update(piece.data)
            source = piece.reshape(-1, self.row_bytes)
            if words:
                source = source.view(np.uint64)
            if piece_of is None:
                copy_rows(source, gather - lo, dest, targets)
            else:
                mine = np.flatnonzero(piece_of == k)
                copy_rows(source, gather[mine] - lo, dest, targets[mine])
        if not pieces and self._ahead is None:  # an empty region: a read ahead in flight is already past it
            self._read_ahead_after(staged, b, 0, 0)
        # checked as it streams by (a region's pieces are never all in RAM at once); a mismatch fails the batch,
        # whose slot is then never published
        if hasher.intdigest() != int(staged.digests[b]):
            # named "staging" (the metric's file label): the staging file has no name of its own
            raise CorruptData(Path(self.staging_dir or "") / "staging", base,
                              f"batch {b}'s staged rows ({nbytes} bytes)")
        if self.staging_dir is not None and not staged.direct_writes:
            # the region's pages in the page cache (written back by now) are never read again
            os.posix_fadvise(staged.fd, base, -(-nbytes // STAGING_ALIGN) * STAGING_ALIGN, os.POSIX_FADV_DONTNEED)
        return seconds

    def _take_piece(self, staged: StagedWindow, b: int, k: int) -> tuple[mmap.mmap, int, float]:
        """Piece ``k`` of batch ``b``'s region, from the read ahead where it is that one: (buffer, offset of its
        first row in it, seconds its read took)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead[0] is staged and ahead[1:3] == (b, k):
                return ahead[3].result()
            wait([ahead[3]])  # read out of order: the read ahead lands in a buffer, let it finish first
        return self._load(staged, b, k)

    def _read_ahead_after(self, staged: StagedWindow, b: int, k: int, pieces: int) -> None:
        """Start reading the piece after piece ``k`` of batch ``b`` (of ``pieces``): the region's next, else the
        first of the window's next batch with staged rows (batches are published in order)."""
        if k + 1 < pieces:
            b, k = b, k + 1
        else:
            later = np.flatnonzero(staged.plan.staged_counts[b + 1:])
            if not len(later):
                return
            b, k = b + 1 + int(later[0]), 0
        staged.reading = self._read_back.submit(self._load, staged, b, k)
        self._ahead = (staged, b, k, staged.reading)

    def _load(self, staged: StagedWindow, b: int, k: int) -> tuple[mmap.mmap, int, float]:
        """Piece ``k`` of batch ``b``'s region read into the next read-back buffer (grown as needed): (buffer,
        offset of the piece's first row in it, seconds the read took)."""
        base, nbytes = staged.plan.region(b)
        begin = k * self._piece_rows * self.row_bytes
        end = min(nbytes, begin + self._piece_rows * self.row_bytes)
        first = begin // STAGING_ALIGN * STAGING_ALIGN
        # O_DIRECT reads whole pages: the region's last page is zero-padded on disk
        size = -(-end // STAGING_ALIGN) * STAGING_ALIGN - first
        turn, self._back_turn = self._back_turn, self._back_turn ^ 1
        back = self._backs[turn]
        if back is None or len(back) < size:
            back = self._backs[turn] = aligned_buffer(max(size, len(back or b"")))
        started = time.perf_counter()
        read_exactly(staged.read_fd, back, base + first, size, "staging")
        return back, begin - first, time.perf_counter() - started

    @property
    def staging_file_bytes(self) -> int:
        """Bytes the staging files take on disk: the windows' in use and those kept for later ones."""
        return self._files.held_bytes

    def close(self) -> None:
        # first the reader: a window being staged stops at its next chunk instead of staging to its end
        self.reader.close()
        with self._stage_lock, self._read_lock:
            self._flusher.shutdown()
            self._read_back.shutdown()  # waits for a read ahead in flight (it reads a staging file's fd)
            self._writers.shutdown()
            self._ahead = None
            self._files.close()

    def __enter__(self) -> "WindowStager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
