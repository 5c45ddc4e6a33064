"""A superbatch of sampled batches whose structure lives on disk: RAM keeps the ids only (4 B per row).

A long superbatch is what makes staging pay (the pass over ``features.bin`` is shared by all its
batches), but held whole in RAM it costs 40 B per sampled node and 16 B per edge, three times over
(sampled, planned, published): at 128 batches of 12.7k nodes that is 290 MiB. So the staged mode
keeps in RAM only what its planner and publisher look up per node, the node ids (int32 below 2^31
nodes), and writes each batch's edges to a scratch file (``spill_batches``) as the superbatch is
sampled, one sample group at a time. The publisher reads a batch's edges back in one read when it
publishes the batch (``SpilledPass.batch``): a few hundred KiB against the megabytes of its rows.

Record of batch b in the spill file, at a 4 KiB-aligned offset (O_DIRECT both ways)::

    edge_src int32 [E_b] | edge_dst int32 [E_b]        (batch-local positions, as in SampledPass)

Each record's XXH3-64 is kept in RAM and checked on read, as staged rows are: the file is ours, the
disk under it is not. A ``SpilledPass`` quacks like ``SampledPass`` where the publisher looks
(``num_batches``, ``num_hops``, ``node_ptr``, ``nodes``, ``batch``, ``max_batch_nodes``), with
``nodes`` holding ids of the compact dtype.
"""

import mmap
import os
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from loader.format.read_checks import CorruptData
from loader.sampling.sampling import SampledBatch, SampledPass
from loader.staging.scratch_files import SCRATCH_ALIGN, ScratchFiles, aligned_buffer, read_exactly

__all__ = ["SpillFile", "SpilledPass", "spill_batches", "concat_spilled", "id_dtype", "SPILL_GROWTH"]

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
        self._base: list[int] = []
        self._edges: list[int] = []
        self._digest: list[int] = []
        self._lock = threading.Lock()
        self._reader = reader
        self._ahead: tuple[int, Future[mmap.mmap]] | None = None
        self.bytes_written = 0
        self.bytes_read = 0

    def append(self, sampled: SampledPass) -> np.ndarray:
        """Write every batch of ``sampled``'s edges as one record each (one write); their record numbers."""
        counts = np.diff(sampled.edge_ptr)
        lengths = -(-counts * 8 // SCRATCH_ALIGN) * SCRATCH_ALIGN
        total = int(lengths.sum())
        buffer = aligned_buffer(total)
        view = np.frombuffer(buffer, dtype=np.uint8)
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        with self._lock:
            first = len(self._base)
            for b, (start, count) in enumerate(zip(starts[:-1].tolist(), counts.tolist())):
                e0 = int(sampled.edge_ptr[b])
                record = view[start:start + 8 * count].view(np.int32)
                record[:count] = sampled.edge_src[e0:e0 + count]
                record[count:] = sampled.edge_dst[e0:e0 + count]
                self._base.append(self._end + start)
                self._edges.append(count)
                self._digest.append(xxhash.xxh3_64_intdigest(record.data))
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

    def read(self, record: int, ahead: int | None = None) -> np.ndarray:
        """Record ``record``'s edges: int64 [2, E]. Raises ``CorruptData`` if it differs from what was written.

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
            buffer = self._load(record)
        if ahead is not None and self._reader is not None:
            self._ahead = (ahead, self._reader.submit(self._load, ahead))
        base, count, digest = self._base[record], self._edges[record], self._digest[record]
        record_ints = np.frombuffer(buffer, dtype=np.int32, count=2 * count)
        if xxhash.xxh3_64_intdigest(record_ints.data) != digest:
            raise CorruptData(Path(self.directory or "") / "spill", base,
                              f"spilled record {record} ({8 * count} bytes of sampled edges)")
        return record_ints.astype(np.int64).reshape(2, count)

    def _load(self, record: int) -> mmap.mmap:
        """Record ``record``'s pages, read into a new buffer."""
        length = -(-self._edges[record] * 8 // SCRATCH_ALIGN) * SCRATCH_ALIGN
        buffer = aligned_buffer(length)
        read_exactly(self._read_fd, buffer, self._base[record], length, "spill")
        self.bytes_read += length  # one load at a time: the publisher's, or the one it asked ahead
        return buffer

    @property
    def records(self) -> int:
        return len(self._base)

    def close(self) -> None:
        """Give the file back (a read ahead in flight lands first: the file may be rewritten next)."""
        if self._ahead is not None:
            wait([self._ahead[1]])
            self._ahead = None
        self._closer()


@dataclass(frozen=True)
class SpilledPass:
    """Batches of one pass with their edges in ``spill``: batch b's nodes are ``nodes[node_ptr[b]:node_ptr[b+1]]``
    (ids, ``id_dtype``), its edges ``spill``'s record ``record[b]``."""

    num_batches: int
    num_hops: int
    node_ptr: np.ndarray
    nodes: np.ndarray
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
        nodes = self.nodes[self.node_ptr[b]:self.node_ptr[b + 1]].astype(np.int64)
        ahead = int(self.record[b + 1]) if b + 1 < self.num_batches else None
        return SampledBatch(nodes=nodes, edge_index=self.spill.read(int(self.record[b]), ahead),
                            num_sampled_nodes=self.num_sampled_nodes[b], num_sampled_edges=self.num_sampled_edges[b])

    def max_batch_nodes(self) -> int:
        return int(np.diff(self.node_ptr).max()) if self.num_batches else 0

    def max_batch_edges(self) -> int:
        return int(np.diff(self.edge_ptr).max()) if self.num_batches else 0

    @property
    def ram_bytes(self) -> int:
        """What this pass holds in RAM (the ids and the per-batch tables)."""
        return sum(a.nbytes for a in (self.node_ptr, self.nodes, self.edge_ptr, self.num_sampled_nodes,
                                      self.num_sampled_edges, self.record)) + 24 * self.num_batches

    def close(self) -> None:
        """Free the spill file (every batch is published, or the stream stopped)."""
        self.spill.close()


def spill_batches(sampled: SampledPass, spill: SpillFile, ids: np.dtype) -> SpilledPass:
    """``sampled``'s edges appended to ``spill``; the ids kept as ``ids``."""
    record = spill.append(sampled)
    return SpilledPass(sampled.num_batches, sampled.num_hops, sampled.node_ptr, sampled.nodes.astype(ids),
                       sampled.edge_ptr, sampled.num_sampled_nodes, sampled.num_sampled_edges, spill, record)


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

    return SpilledPass(sum(p.num_batches for p in spilled), hops.pop(), ptrs("node_ptr"),
                       np.concatenate([p.nodes for p in spilled]), ptrs("edge_ptr"),
                       np.concatenate([p.num_sampled_nodes for p in spilled]),
                       np.concatenate([p.num_sampled_edges for p in spilled]), spill,
                       np.concatenate([p.record for p in spilled]))
