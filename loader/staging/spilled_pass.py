"""A superbatch of sampled batches that lives on disk: RAM keeps a few numbers per batch, nothing per node.

A long superbatch is what makes staging pay (the pass over ``features.bin`` is shared by all its
batches), but held whole in RAM it costs 40 B per sampled node and 16 B per edge, three times over
(sampled, planned, published): at 128 batches of 12.7k nodes that is 290 MiB. Even its ids alone (4 B
per node) take 80 MiB for three superbatches of 512 batches, and a longer superbatch is the cheapest
way to fewer bytes of ``features.bin`` read per batch. So the staged mode writes each batch's ids and
edges to a scratch file (``spill_batches``) as the superbatch is sampled, one sample group at a time,
and keeps in RAM only per-batch tables. The planner reads the ids back a slice at a time
(``SpilledPass.node_ids``: the ids part of each record, a few pages); the publisher reads a batch's
record in one read when it publishes the batch (``SpilledPass.batch``, the next one read ahead): a few
hundred KiB against the megabytes of its rows.

Record of batch b in the spill file, at a 4 KiB-aligned offset (O_DIRECT both ways)::

    ids [N_b] (int32 below 2^31 nodes, else int64), zero-padded to 8 B | edge_src int32 [E_b] |
    edge_dst int32 [E_b]                                (batch-local positions, as in SampledPass)

The XXH3-64 of each record's ids and of its edges are kept in RAM and checked on read, as staged rows
are: the file is ours, the disk under it is not. A ``SpilledPass`` is ``SampledBatches``
(``loader.sampling.sampling``), as a ``SampledPass`` is: the stages after the sampler take either; its
``nodes`` reads every batch's ids back (for callers that need them all at once), ``node_ids`` a slice.
"""

import mmap
import os
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from loader.format.read_checks import CorruptData
from loader.sampling.sampling import SampledBatch, SampledBatches, SampledPass
from loader.staging.scratch_files import SCRATCH_ALIGN, ScratchFiles, aligned_buffer, read_exactly

__all__ = ["SpillFile", "SpilledPass", "spill_batches", "concat_spilled", "id_dtype", "SPILL_GROWTH",
           "SPILL_RECORD_BYTES"]

SPILL_RECORD_BYTES = 192
"""RAM per record besides the pass's tables: its base, two counts and two digests, Python ints in lists (36 B
each with the list's pointer)."""
SPILL_GROWTH = 64 << 20
"""Bytes the spill file grows by when an append runs past its end (it starts at the first group's size)."""


def id_dtype(num_nodes: int) -> np.dtype:
    """The compact dtype node ids are kept in: int32 below 2^31 nodes, else int64."""
    return np.dtype(np.int32 if num_nodes < 2**31 else np.int64)


class SpillFile:
    """An unnamed scratch file of batch edge records (``directory``: on SSD; None: a memfd, in RAM).

    ``append`` (the sampler's thread) and ``read`` (the publisher's) may run at once: a record is
    read only after the append that wrote it returned.
    """

    def __init__(self, directory: Path | None, direct: bool = True, *, files: ScratchFiles | None = None,
                 reader: Executor | None = None) -> None:
        """``files``: where the file comes from and goes back to when closed (default: a new file, closed then);
        ``reader``: where ``read`` reads the record it is told comes next (default: none read ahead)."""
        self.directory = directory
        if files is None:
            files = ScratchFiles(directory, direct_reads=direct, direct_writes=direct, keep=0)
        self._file = files.take(SPILL_GROWTH)
        self._fd, self._read_fd = self._file.fd, self._file.read_fd
        self._closer = weakref.finalize(self, files.give, self._file)
        self._end = 0
        self._ids: np.dtype | None = None  # the ids' dtype, set by the first append
        self._base: list[int] = []
        self._nodes: list[int] = []
        self._edges: list[int] = []
        self._ids_digest: list[int] = []
        self._edges_digest: list[int] = []
        self._lock = threading.Lock()
        self._reader = reader
        self._ahead: tuple[int, Future[mmap.mmap]] | None = None
        self._count = threading.Lock()  # bytes_read: the publisher, its read ahead and the planner count into it
        self.bytes_written = 0
        self.bytes_read = 0
        # the reads ``take_reads`` has not handed out yet: their bytes and each one's seconds
        self._untaken_bytes = 0
        self._untaken_seconds: list[float] = []

    def append(self, sampled: SampledPass, ids: np.dtype) -> np.ndarray:
        """Write every batch of ``sampled`` (its ids as ``ids``, its edges) as one record each, in one write; their
        record numbers."""
        ids = np.dtype(ids)
        if self._ids is None:
            self._ids = ids
        elif ids != self._ids:
            raise ValueError(f"spill file of {self._ids} ids: cannot append {ids} ids")
        nodes = np.diff(sampled.node_ptr)
        counts = np.diff(sampled.edge_ptr)
        id_bytes = -(-nodes * ids.itemsize // 8) * 8
        lengths = -(-(id_bytes + counts * 8) // SCRATCH_ALIGN) * SCRATCH_ALIGN
        total = int(lengths.sum())
        buffer = aligned_buffer(total)
        view = np.frombuffer(buffer, dtype=np.uint8)
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        with self._lock:
            first = len(self._base)
            for b, (start, n, pad, count) in enumerate(zip(starts[:-1].tolist(), nodes.tolist(), id_bytes.tolist(),
                                                            counts.tolist())):
                n0, e0 = int(sampled.node_ptr[b]), int(sampled.edge_ptr[b])
                record_ids = view[start:start + n * ids.itemsize].view(ids)
                record_ids[:] = sampled.nodes[n0:n0 + n]
                edges = view[start + pad:start + pad + 8 * count].view(np.int32)
                edges[:count] = sampled.edge_src[e0:e0 + count]
                edges[count:] = sampled.edge_dst[e0:e0 + count]
                self._base.append(self._end + start)
                self._nodes.append(n)
                self._edges.append(count)
                self._ids_digest.append(xxhash.xxh3_64_intdigest(record_ids.data))
                self._edges_digest.append(xxhash.xxh3_64_intdigest(edges.data))
            if total:
                at = self._end
                if at + total > self._file.size:
                    self._file.grow(max(self._file.size + SPILL_GROWTH, at + total))
                self._write(buffer, total, at)
            self._end += total
            self.bytes_written += total
        return np.arange(first, first + len(counts), dtype=np.int64)

    def _write(self, buffer: mmap.mmap, total: int, at: int) -> None:
        view = memoryview(buffer)[:total]
        done = 0
        while done < total:
            done += os.pwritev(self._fd, [view[done:]], at + done)

    def read(self, record: int, ahead: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Record ``record``: (its ids as int64, its edges: int64 [2, E]). Raises ``CorruptData`` if either differs
        from what was written.

        ``ahead``: the record the next call will ask for, read meanwhile on the ``reader`` (the publisher
        takes batches in order; under staging's writes a small read waited about 2 ms a batch)."""
        pending, self._ahead = self._ahead, None
        buffer = None
        if pending is not None:
            if pending[0] == record:
                buffer = pending[1].result()
            else:  # asked out of order: the read ahead is dropped once it is done
                wait([pending[1]])
        if buffer is None:
            buffer = self._load(record, self._length(record))
        if ahead is not None and self._reader is not None:
            self._ahead = (ahead, self._reader.submit(self._load, ahead, self._length(ahead)))
        ids = self._checked_ids(record, buffer)
        count, at = self._edges[record], self._id_bytes(record)
        edges = np.frombuffer(buffer, dtype=np.int32, count=2 * count, offset=at)
        if xxhash.xxh3_64_intdigest(edges.data) != self._edges_digest[record]:
            raise CorruptData(Path(self.directory or "") / "spill", self._base[record] + at,
                              f"spilled record {record} ({8 * count} bytes of sampled edges)")
        return ids.astype(np.int64), edges.astype(np.int64).reshape(2, count)

    def read_ids(self, record: int) -> np.ndarray:
        """Record ``record``'s ids, in the dtype they were spilled as (its first pages only). Raises ``CorruptData``
        if they differ from what was written."""
        if not self._nodes[record]:
            return np.empty(0, dtype=self._ids)
        return self._checked_ids(record, self._load(record, self._id_bytes(record)))

    def _id_bytes(self, record: int) -> int:
        assert self._ids is not None
        return -(-self._nodes[record] * self._ids.itemsize // 8) * 8

    def _length(self, record: int) -> int:
        return self._id_bytes(record) + 8 * self._edges[record]

    def _checked_ids(self, record: int, buffer: mmap.mmap) -> np.ndarray:
        ids = np.frombuffer(buffer, dtype=self._ids, count=self._nodes[record])
        if xxhash.xxh3_64_intdigest(ids.data) != self._ids_digest[record]:
            raise CorruptData(Path(self.directory or "") / "spill", self._base[record],
                              f"spilled record {record} ({ids.nbytes} bytes of sampled ids)")
        return ids

    def _load(self, record: int, nbytes: int) -> mmap.mmap:
        """The first ``nbytes`` of record ``record`` (whole pages), read into a new buffer."""
        length = max(SCRATCH_ALIGN, -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN)
        buffer = aligned_buffer(length)
        started = time.perf_counter()
        read_exactly(self._read_fd, buffer, self._base[record], length, "spill")
        seconds = time.perf_counter() - started
        with self._count:
            self.bytes_read += length
            self._untaken_bytes += length
            self._untaken_seconds.append(seconds)
        return buffer

    def take_reads(self) -> tuple[int, list[float]]:
        """(bytes, each read's seconds) of the reads since the last call: the publisher reports them with the batch
        that read them (reads of the planner and of the read ahead included), once each."""
        with self._count:
            taken = (self._untaken_bytes, self._untaken_seconds)
            self._untaken_bytes, self._untaken_seconds = 0, []
        return taken

    @property
    def records(self) -> int:
        return len(self._base)

    @property
    def ids(self) -> np.dtype:
        """The dtype the ids are spilled as (int64 before the first append)."""
        return self._ids if self._ids is not None else np.dtype(np.int64)

    def close(self) -> None:
        """Give the file back (a read ahead in flight lands first: the file may be rewritten next)."""
        if self._ahead is not None:
            wait([self._ahead[1]])
            self._ahead = None
        self._closer()


@dataclass(frozen=True)
class SpilledPass:
    """Batches of one pass spilled to ``spill``: batch b's ids and edges are ``spill``'s record ``record[b]``, its
    nodes ``node_ptr[b]:node_ptr[b + 1]`` of the pass."""

    num_batches: int
    num_hops: int
    node_ptr: np.ndarray
    edge_ptr: np.ndarray
    """int64 [B + 1]: the edge counts' running sum (the records' sizes, for slot checks)."""
    num_sampled_nodes: np.ndarray
    num_sampled_edges: np.ndarray
    spill: SpillFile
    record: np.ndarray

    def batch(self, b: int) -> SampledBatch:
        """Batch ``b``: its ids as int64 and its edges read back (``SampledPass.batch``'s result)."""
        if not 0 <= b < self.num_batches:
            raise IndexError(f"batch {b} outside [0, {self.num_batches})")
        ahead = int(self.record[b + 1]) if b + 1 < self.num_batches else None
        nodes, edges = self.spill.read(int(self.record[b]), ahead)
        return SampledBatch(nodes=nodes, edge_index=edges, num_sampled_nodes=self.num_sampled_nodes[b],
                            num_sampled_edges=self.num_sampled_edges[b])

    def node_ids(self, begin: int, end: int) -> np.ndarray:
        """The ids of nodes ``begin:end`` of the pass (the spilled dtype), read back from the records holding them."""
        if not 0 <= begin <= end <= int(self.node_ptr[-1]):
            raise IndexError(f"nodes {begin}:{end} outside the pass's {int(self.node_ptr[-1])}")
        if begin == end:
            return np.empty(0, dtype=self.spill.ids)
        first = int(np.searchsorted(self.node_ptr, begin, side="right")) - 1
        last = int(np.searchsorted(self.node_ptr, end, side="left"))
        parts = [self.spill.read_ids(int(r)) for r in self.record[first:last].tolist()]
        at = begin - int(self.node_ptr[first])
        return np.concatenate(parts)[at:at + end - begin]

    @property
    def nodes(self) -> np.ndarray:
        """Every batch's ids, read back (for callers that plan over a whole pass at once: the trainer cache)."""
        return self.node_ids(0, int(self.node_ptr[-1]))

    def max_batch_nodes(self) -> int:
        return int(np.diff(self.node_ptr).max()) if self.num_batches else 0

    def max_batch_edges(self) -> int:
        return int(np.diff(self.edge_ptr).max()) if self.num_batches else 0

    @property
    def ram_bytes(self) -> int:
        """What this pass holds in RAM (its per-batch tables, and the spill file's per-record numbers)."""
        return sum(a.nbytes for a in (self.node_ptr, self.edge_ptr, self.num_sampled_nodes, self.num_sampled_edges,
                                      self.record)) + SPILL_RECORD_BYTES * self.num_batches

    def close(self) -> None:
        """Free the spill file (every batch is published, or the stream stopped)."""
        self.spill.close()


if TYPE_CHECKING:  # mypy checks here, not only where a stage takes one, that a SpilledPass is SampledBatches
    _spilled: type[SampledBatches] = SpilledPass


def spill_batches(sampled: SampledPass, spill: SpillFile, ids: np.dtype) -> SpilledPass:
    """``sampled`` appended to ``spill``, its ids as ``ids``."""
    record = spill.append(sampled, ids)
    return SpilledPass(sampled.num_batches, sampled.num_hops, sampled.node_ptr, sampled.edge_ptr,
                       sampled.num_sampled_nodes, sampled.num_sampled_edges, spill, record)


def concat_spilled(parts: Sequence[SpilledPass | SampledPass], spill: SpillFile, ids: np.dtype) -> SpilledPass:
    """``parts`` (at least one; all spilled to ``spill``, or plain passes, which are spilled there now) as one pass."""
    if not parts:
        raise ValueError("concat_spilled: no pass")
    spilled = [p if isinstance(p, SpilledPass) else spill_batches(p, spill, ids) for p in parts]
    if any(p.spill is not spill for p in spilled):
        raise ValueError("concat_spilled: the passes are spilled to different files")
    if len(spilled) == 1:
        return spilled[0]
    hops = {p.num_hops for p in spilled}
    if len(hops) != 1:
        raise ValueError(f"concat_spilled: hop counts differ ({sorted(hops)})")

    def ptrs(name: str) -> np.ndarray:
        sizes = np.concatenate([np.diff(getattr(p, name)) for p in spilled])
        out = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=out[1:])
        return out

    return SpilledPass(sum(p.num_batches for p in spilled), hops.pop(), ptrs("node_ptr"), ptrs("edge_ptr"),
                       np.concatenate([p.num_sampled_nodes for p in spilled]),
                       np.concatenate([p.num_sampled_edges for p in spilled]), spill,
                       np.concatenate([p.record for p in spilled]))
