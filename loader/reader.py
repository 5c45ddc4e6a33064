"""Stage 2, the disk reader: each partition of a mega-batch as sequential reads into a buffer.

Features of a partition are one contiguous, page-aligned range of ``features.bin`` (the prepared
layout guarantees it), read with ``os.preadv`` straight into the buffer's region of the arena,
O_DIRECT when configured. Edge lists (``indices.npy``) and ``indptr`` slices are contiguous too and
are read into the buffer's preallocated index arrays. Ranges larger than ``read_block`` are split
so several reads are in flight on the dedicated read pool.
"""

import asyncio
import errno
import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from loader.arena import FeatureArena, MegaBatchBuffer
from loader.dataset import Dataset
from loader.memplan import PAGE, round_up
from loader.metrics import DaemonMetrics
from loader.npyio import NpyReader
from loader.schedule import MegaBatchPlan
from proto.errors import UserError

__all__ = ["LoadedMegaBatch", "PartitionReader", "ReadRequest"]

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
class LoadedMegaBatch:
    """Disk reader -> assembler: a mega-batch's raw data in ``buffer``."""

    plan: MegaBatchPlan
    buffer: MegaBatchBuffer
    feature_base: np.ndarray
    """int64 per partition of the plan: arena byte offset of its first feature row."""
    raw_edges: int
    """Edge-list entries read into ``buffer.raw_indices`` (partitions in plan order)."""
    bytes_read: int
    seconds: float


class PartitionReader:
    """Owns the dataset's file descriptors and the read pool."""

    def __init__(self, dataset: Dataset, arena: FeatureArena, partitions: np.ndarray, metrics: DaemonMetrics, *,
                 direct_io: bool, threads: int, read_block: int) -> None:
        self._arena = arena
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
        while done < req.need:
            got = os.preadv(req.fd, [req.dest[done:]], req.offset + done)
            if got == 0:
                raise UserError(f"{req.file}: file ends early (wanted {req.need} bytes at offset {req.offset}); "
                                f"run 'megabatch verify'")
            done += got
        self._metrics.disk_seconds.labels(req.file).observe(time.perf_counter() - t0)
        self._metrics.disk_reads.labels(req.file).inc()
        self._metrics.disk_bytes.labels(req.file).inc(done)
        return done

    def plan_reads(self, plan: MegaBatchPlan, buffer: MegaBatchBuffer) -> tuple[list[ReadRequest], np.ndarray, int]:
        """The reads of one mega-batch, its partitions' arena offsets, and its edge count."""
        parts = self._parts[plan.partitions]
        requests: list[ReadRequest] = []
        feature_base = np.empty(len(parts), dtype=np.int64)
        feat_pos = buffer.feature_offset
        edge_pos = 0
        ptr_pos = 0
        isz = self._index_itemsize
        raw = buffer.raw_indices.view(np.uint8)
        scratch = buffer.raw_indptr_scratch.view(np.uint8)
        for i, (node_begin, node_end, edge_begin, edge_end, feat_offset, feat_nbytes) in enumerate(parts.tolist()):
            padded = round_up(feat_nbytes, PAGE)
            if feat_pos + padded > buffer.feature_offset + buffer.feature_capacity:
                raise RuntimeError("mega-batch features exceed the planned buffer (memory plan bug)")
            feature_base[i] = feat_pos
            # O_DIRECT needs page-multiple lengths: read the padded range, require only the real bytes
            requests.extend(self._requests(self._feat_fd, feat_offset, self._arena.view(feat_pos, padded),
                                           feat_nbytes, "features"))
            feat_pos += padded
            n_edges = edge_end - edge_begin
            if n_edges:
                requests.extend(self._requests(self._indices_fd, self._indices_offset + edge_begin * isz,
                                               raw.data[edge_pos * isz:(edge_pos + n_edges) * isz],
                                               n_edges * isz, "indices"))
            edge_pos += n_edges
            n_ptr = node_end - node_begin + 1
            requests.extend(self._requests(self._indptr_fd, self._indptr_offset + node_begin * 8,
                                           scratch.data[ptr_pos * 8:(ptr_pos + n_ptr) * 8], n_ptr * 8, "indptr"))
            ptr_pos += n_ptr
        return requests, feature_base, edge_pos

    async def load(self, plan: MegaBatchPlan, buffer: MegaBatchBuffer) -> LoadedMegaBatch:
        """Issue every read of ``plan`` on the read pool and wait for all of them."""
        t0 = time.perf_counter()
        requests, feature_base, edges = self.plan_reads(plan, buffer)
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(self._pool, self._read, req) for req in requests]
        try:
            sizes = await asyncio.gather(*futures)
        except BaseException:
            # reads already running write into the buffer: let them land before it can be reused
            for fut in futures:
                fut.cancel()
            await asyncio.wait(futures)
            raise
        return LoadedMegaBatch(plan, buffer, feature_base, edges, int(sum(sizes)), time.perf_counter() - t0)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
