"""Stage 2, the disk reader: each partition of a mega-batch as sequential reads into a buffer.

Features of a partition are one contiguous, page-aligned range of ``features.bin`` (the prepared
layout guarantees it), read with ``os.preadv`` straight into the buffer's region of the arena,
O_DIRECT when configured. Edge lists (``indices.npy``) and ``indptr`` slices are contiguous too and
are read into the buffer's preallocated index arrays. Ranges larger than ``read_block`` are split
so several reads are in flight on the dedicated read pool.

With read checks (format 1.1, ``[io] check_reads``), each partition's three ranges are hashed on the
read pool once they have landed and compared with ``partition_checksums.npy``; a mismatch fails the
mega-batch with ``CorruptData`` before the assembler sees a byte of it.
"""

import asyncio
import errno
import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loader.daemon.aggregate_rows import AggregateRows
from loader.daemon.hierarchical.arena import FeatureArena, MegaBatchBuffer
from loader.daemon.hierarchical.schedule import ScheduledMegaBatch
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.read_metrics import TRAIN
from loader.format.dataset import Dataset
from loader.format.fileio import read_failed
from loader.format.npyio import NpyReader
from loader.format.partition_table import PartitionTable
from loader.format.read_checks import PARTITION_CHECK_COLUMNS, ReadChecks, verify_blocks, verify_partition_range
from proto.errors import UserError

__all__ = ["LoadedMegaBatch", "MegaBatchReads", "PartitionReader", "ReadRequest",
           "AGGREGATES"]

AGGREGATES = "aggregates"
"""The aggregation cache's file as the reads name it (their metrics' ``file`` label, as the row reads' elsewhere)."""

log = logging.getLogger("megabatch.reader")


@dataclass(frozen=True)
class ReadRequest:
    """One preadv: ``nbytes`` at ``offset`` of ``fd`` into ``dest`` (at least ``need`` must arrive)."""

    fd: int
    offset: int
    dest: memoryview
    need: int
    file: str


@dataclass(frozen=True)
class RangeCheck:
    """One partition's range of one file, landed in ``data``, to be hashed against its checksum."""

    partition: int
    column: int
    data: memoryview
    file_offset: int


@dataclass(frozen=True)
class BlockCheck:
    """One partition's range of the aggregate file, landed in ``data``, to be checked block by block."""

    data: np.ndarray
    """uint8 view of the range (whole blocks: the padded range)."""
    file_offset: int


@dataclass(frozen=True)
class CopyRequest:
    """One partition's range already in the other buffer (the previous mega-batch's): copied, not read."""

    source: np.ndarray
    dest: np.ndarray
    """uint8 views of equal length."""


@dataclass(frozen=True)
class PartitionPlace:
    """Where a loaded partition's data sits in its buffer (what a later load may copy from)."""

    feature: int
    """Arena offset of its first feature row (``padded`` bytes follow)."""
    padded: int
    edge: int
    """Position of its first entry in ``raw_indices``."""
    ptr: int
    """Position of its ``indptr`` slice in ``raw_indptr_scratch``."""


@dataclass(frozen=True)
class MegaBatchReads:
    """Everything one mega-batch's load issues and records: the preads, the range checks, and where
    each partition's rows and edges land in the buffer."""

    requests: list[ReadRequest]
    feature_base: np.ndarray
    """int64 (N_d,): arena offset of each partition's first feature row, in schedule order."""
    edges: int
    """In-edges read, over all the mega-batch's partitions."""
    checks: list[RangeCheck]
    aggregate_base: np.ndarray | None = None
    """int64 (N_d,): arena offset of each partition's first aggregate row; None without the aggregation cache."""
    block_checks: list[BlockCheck] = field(default_factory=list)
    copies: list[CopyRequest] = field(default_factory=list)
    places: dict[int, PartitionPlace] = field(default_factory=dict)
    """Partition id -> where it lands."""


@dataclass(frozen=True)
class LoadedMegaBatch:
    """Disk reader -> assembler: a mega-batch's raw data in ``buffer``."""

    scheduled: ScheduledMegaBatch
    buffer: MegaBatchBuffer
    feature_base: np.ndarray
    """int64 per partition of the mega-batch: arena byte offset of its first feature row."""
    aggregate_base: np.ndarray | None
    """The same for its aggregate rows (``MegaBatchReads.aggregate_base``)."""
    raw_edges: int
    """Edge-list entries read into ``buffer.raw_indices`` (partitions in schedule order)."""
    bytes_read: int
    seconds: float


class PartitionReader:
    """Owns the dataset's file descriptors and the read pool."""

    def __init__(self, dataset: Dataset, arena: FeatureArena, partitions: PartitionTable, metrics: DaemonMetrics, *,
                 direct_io: bool, threads: int, read_block: int, checks: ReadChecks | None = None,
                 aggregates: AggregateRows | None = None) -> None:
        self._arena = arena
        self._checks = checks
        self._aggregates = aggregates
        self._paths = {name: dataset.file(name) for name in PARTITION_CHECK_COLUMNS}
        if aggregates is not None:
            self._paths[AGGREGATES] = aggregates.path
        self._parts = partitions
        self._metrics = metrics
        self._block = read_block
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="megabatch-read")
        self._fds: list[int] = []
        self.direct_io = direct_io
        self._feat_fd = self._open(dataset.file("features"), direct=direct_io)
        with NpyReader(dataset.file("indices")) as idx, NpyReader(dataset.file("indptr"), expect_dtype=np.int64) as ptr:
            self._indices_offset, self._index_itemsize = idx.data_offset, idx.dtype.itemsize
            self._indptr_offset = ptr.data_offset
        self._indices_fd = self._open(dataset.file("indices"), direct=False)
        self._indptr_fd = self._open(dataset.file("indptr"), direct=False)
        self._aggregate_fd = -1 if aggregates is None else self._open(aggregates.path, direct=direct_io)
        self._last: tuple[MegaBatchBuffer, dict[int, PartitionPlace]] | None = None
        """The last mega-batch loaded whole: its buffer and where each of its partitions sits. Only this reader
        writes a buffer, one load at a time, so those bytes hold until it loads into that buffer again; a load into
        the other buffer copies the partitions the two share instead of reading them (consecutive states of a link
        buffer order share most of theirs). Without the aggregation cache only (its rows are not tracked)."""

    def _open(self, path: os.PathLike[str], *, direct: bool) -> int:
        flags = os.O_RDONLY | os.O_CLOEXEC
        if direct:
            try:
                fd = os.open(path, flags | os.O_DIRECT)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise UserError(f"{path}: cannot open ({err.strerror})") from None
                log.warning("%s: the filesystem refuses O_DIRECT; reading through the page cache", path)
                self.direct_io = False
            else:
                self._fds.append(fd)
                return fd
        try:
            fd = os.open(path, flags)
        except OSError as err:
            raise UserError(f"{path}: cannot open ({err.strerror})") from None
        self._fds.append(fd)
        return fd

    def _requests(self, fd: int, offset: int, dest: memoryview, need: int, file: str) -> Iterable[ReadRequest]:
        for start in range(0, len(dest), self._block):
            chunk = dest[start:start + self._block]
            yield ReadRequest(fd, offset + start, chunk, max(0, min(len(chunk), need - start)), file)

    def _read(self, req: ReadRequest) -> int:
        done = 0
        t0 = time.perf_counter()
        path = self._paths[req.file]
        while done < req.need:
            try:
                got = os.preadv(req.fd, [req.dest[done:]], req.offset + done)
            except OSError as err:
                raise read_failed(path, len(req.dest) - done, req.offset + done, err) from err
            if got == 0:
                raise UserError(f"{path}: file ends early (wanted {req.need} bytes at byte {req.offset}; it shrank "
                                f"after the daemon started?); run 'megabatch verify'")
            done += got
        self._metrics.read_meter(req.file, TRAIN).record(time.perf_counter() - t0, done, 1)
        return done

    def plan_reads(self, scheduled: ScheduledMegaBatch, buffer: MegaBatchBuffer) -> MegaBatchReads:
        """The reads of one mega-batch, its partitions' arena offsets, its edge count and its range checks."""
        parts = self._parts.take(scheduled.partitions)
        requests: list[ReadRequest] = []
        checks: list[RangeCheck] = []
        feature_base = np.empty(len(parts), dtype=np.int64)
        aggregated = self._aggregates is not None
        aggregate_base = np.empty(len(parts), dtype=np.int64) if aggregated else None
        block_checks: list[BlockCheck] = []
        agg_pos = buffer.aggregate_offset
        feat_pos = buffer.feature_offset
        edge_pos = 0
        ptr_pos = 0
        isz = self._index_itemsize
        raw = buffer.raw_indices.view(np.uint8)
        scratch = buffer.raw_indptr_scratch.view(np.uint8)
        copies: list[CopyRequest] = []
        places: dict[int, PartitionPlace] = {}
        last = self._last if self._last is not None and self._last[0] is not buffer and not aggregated else None
        for i, part in enumerate(parts.rows()):
            node_begin, node_end, edge_begin, edge_end = part.node_begin, part.node_end, part.edge_begin, part.edge_end
            feat_offset, feat_nbytes, padded = part.feat_offset, part.feat_nbytes, part.feat_padded
            if feat_pos + padded > buffer.feature_offset + buffer.feature_capacity:
                raise RuntimeError("mega-batch features exceed the planned buffer (memory plan bug)")
            feature_base[i] = feat_pos
            n_edges, n_ptr = edge_end - edge_begin, node_end - node_begin + 1
            pid = int(scheduled.partitions[i])
            places[pid] = PartitionPlace(feat_pos, padded, edge_pos, ptr_pos)
            held = None if last is None else last[1].get(pid)
            if held is not None:  # in the previous mega-batch's buffer: three copies, checked when they were read
                old_buffer = last[0] if last is not None else buffer
                old_raw = old_buffer.raw_indices.view(np.uint8)
                old_scratch = old_buffer.raw_indptr_scratch.view(np.uint8)
                data = self._arena.data
                copies += [CopyRequest(data[held.feature:held.feature + padded], data[feat_pos:feat_pos + padded]),
                           CopyRequest(old_raw[held.edge * isz:(held.edge + n_edges) * isz],
                                       raw[edge_pos * isz:(edge_pos + n_edges) * isz]),
                           CopyRequest(old_scratch[held.ptr * 8:(held.ptr + n_ptr) * 8],
                                       scratch[ptr_pos * 8:(ptr_pos + n_ptr) * 8])]
                feat_pos += padded
                edge_pos += n_edges
                ptr_pos += n_ptr
                continue
            # per file (PARTITION_CHECK_COLUMNS order): fd, file offset, destination, bytes that must arrive;
            # O_DIRECT needs page-multiple lengths: features read the padded range and need only the real bytes
            ranges = ((self._feat_fd, feat_offset, self._arena.view(feat_pos, padded), feat_nbytes),
                      (self._indices_fd, self._indices_offset + edge_begin * isz,
                       raw.data[edge_pos * isz:(edge_pos + n_edges) * isz], n_edges * isz),
                      (self._indptr_fd, self._indptr_offset + node_begin * 8,
                       scratch.data[ptr_pos * 8:(ptr_pos + n_ptr) * 8], n_ptr * 8))
            for column, (name, (fd, offset, dest, need)) in enumerate(zip(PARTITION_CHECK_COLUMNS, ranges)):
                requests.extend(self._requests(fd, offset, dest, need, name))
                if self._checks is not None:
                    checks.append(RangeCheck(int(scheduled.partitions[i]), column, dest, offset))
            if aggregate_base is not None:  # the same range of the aggregate file (features.bin's layout)
                if agg_pos + padded > buffer.aggregate_offset + buffer.aggregate_capacity:
                    raise RuntimeError("mega-batch aggregates exceed the planned buffer (memory plan bug)")
                aggregate_base[i] = agg_pos
                requests.extend(self._requests(self._aggregate_fd, feat_offset, self._arena.view(agg_pos, padded),
                                               feat_nbytes, AGGREGATES))
                assert self._aggregates is not None
                if self._aggregates.block_sums is not None:
                    block_checks.append(BlockCheck(self._arena.data[agg_pos:agg_pos + padded], feat_offset))
                agg_pos += padded
            feat_pos += padded
            edge_pos += n_edges
            ptr_pos += n_ptr
        return MegaBatchReads(requests, feature_base, edge_pos, checks, aggregate_base, block_checks, copies, places)

    @staticmethod
    def _copy(copies: list[CopyRequest]) -> int:
        for copy in copies:
            copy.dest[:] = copy.source
        return sum(len(copy.dest) for copy in copies)

    def _verify(self, check: RangeCheck) -> None:
        assert self._checks is not None
        verify_partition_range(self._checks, check.partition, check.column, check.data,
                               self._paths[PARTITION_CHECK_COLUMNS[check.column]], check.file_offset)

    def _verify_blocks(self, check: BlockCheck) -> None:
        assert self._aggregates is not None and self._aggregates.block_sums is not None
        # a range ends on a page, so in whole blocks, or where the file does (its last block, zero-padded)
        length = np.array([len(check.data)], dtype=np.int64)
        verify_blocks(self._aggregates.block_sums, self._aggregates.check_block, check.data,
                      np.zeros(1, dtype=np.int64), length, np.array([check.file_offset], dtype=np.int64),
                      self._aggregates.path)

    async def load(self, scheduled: ScheduledMegaBatch, buffer: MegaBatchBuffer) -> LoadedMegaBatch:
        """Issue every read of ``plan`` on the read pool and wait for all of them."""
        t0 = time.perf_counter()
        reads = self.plan_reads(scheduled, buffer)
        self._last = None  # ``buffer`` is being overwritten: until this load lands, no later one copies from it
        # the pool's own futures, not asyncio's wrappers: cancelling a wrapper returns at once even while its
        # thread still reads, so only these can say when a read has really landed
        jobs: list[Future[Any]] = [self._pool.submit(self._read, req) for req in reads.requests]
        if reads.copies:
            jobs.append(self._pool.submit(self._copy, reads.copies))
        try:
            sizes = await asyncio.gather(*map(asyncio.wrap_future, jobs))
            # hashing only reads the buffer, but a failed batch must not hand it on while a hash still runs
            jobs = [self._pool.submit(self._verify, check) for check in reads.checks]
            jobs += [self._pool.submit(self._verify_blocks, check) for check in reads.block_checks]
            await asyncio.gather(*map(asyncio.wrap_future, jobs))
        except BaseException:
            for job in jobs:
                job.cancel()  # a read not started never starts
            # reads already running write into the buffer: let them land before it can be reused
            landed = [asyncio.wrap_future(job) for job in jobs]
            if landed:
                await asyncio.wait(landed)
            for fut in landed:
                if not fut.cancelled():
                    fut.exception()  # retrieved: the first failure is the one raised
            raise
        copied = len(reads.copies) // 3
        loaded = self._metrics.partitions_loaded
        loaded.labels("disk").inc(len(reads.places) - copied)
        loaded.labels("previous").inc(copied)
        self._last = (buffer, reads.places)
        read = int(sum(sizes)) - (sizes[-1] if reads.copies else 0)  # the copy's bytes came from RAM
        return LoadedMegaBatch(scheduled, buffer, reads.feature_base, reads.aggregate_base, reads.edges, read,
                               time.perf_counter() - t0)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
