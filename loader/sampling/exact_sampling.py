"""The exact out-of-core sampler (Ginex §3.1-3.2): superbatch sampling with only ``indptr`` in RAM.

``ExactSampler.sample_pass`` returns exactly, bit for bit, what ``loader.sampling.sampling.sample_pass``
returns on the whole graph held in RAM with ``global_ids = arange(N)`` (same seeds, batch size,
fanouts and keys; semantics, RNG and output layout are specified there). Neighbour lists come
from a ``NeighborCache`` (static, filled offline by rank) or, on a miss, from disk through a
``NeighborReader``.

Order of work (hop-major over groups): the pass is cut into groups of ``group_size`` batches
(default 16, as ``[fullgraph] sample_group``). For hop h of a group, the frontiers of all its batches are merged
into one ascending set (each list fetched once per hop per group, however many batches reach the node:
BatchGNN's macro-batch dedup); cached lists are addressed in place, the misses read in one
coalesced request; then every batch of the group picks (Floyd, from
``loader.sampling.sampling_kernels``) and relabels against that frontier set. A larger group shares more
fetches (and sorts fewer, longer requests) at the price of holding the group's sampled nodes
and edges until the group ends.

Costs: two scratch arrays of N int32 (int64 past 2^31 nodes), allocated once per sampler;
per group and hop O(frontier + union log union) to merge and sort the frontier set, plus one
read of its missed lists; per batch and hop O(batch nodes so far + hop edges), because a batch's
position map is rebuilt from its own node list and reset afterwards (never O(N)). Output
buffers grow geometrically towards the pass total extrapolated from the groups so far.

Counters (``stats``): lists served from the cache, lists read from disk (each non-empty list
counts once per hop per group that needs it; empty lists cost nothing and count as neither),
the reader's bytes and ``preadv`` calls spent on them, and wall seconds spent fetching (merging
frontiers, cache lookups, reads) and computing (picking, relabelling, assembling output).
One sampler runs one pass at a time (a lock serializes callers): the scratch arrays are shared.
"""

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from loader.format.dataset import Dataset
from loader.format.read_latency import ReadRecorder
from loader.sampling.exact_sampling_kernels import (
    STATUS_BAD_NEIGHBOUR,
    append_group,
    first_duplicate_seed,
    frontier_union,
    sample_group_hop,
)
from loader.sampling.neighbor_cache import NeighborCache
from loader.sampling.neighbor_reader import DEFAULT_GAP_BYTES, DEFAULT_READ_THREADS, NeighborReader
from loader.sampling.sampling import SampledPass, as_int, as_int_array, check_pass_args
from loader.sampling.sampling_kernels import pick_table_size

__all__ = ["ExactSampler", "ExactSamplingStats", "DEFAULT_GROUP_SIZE"]

DEFAULT_GROUP_SIZE = 16
"""Batches per hop-major group: enough that hub lists are fetched once for many batches; the same as the
daemon's ``[fullgraph] sample_group`` default (``loader.daemon.config.FullGraphConfig``)."""


@dataclass(frozen=True)
class ExactSamplingStats:
    """Cumulative counters of one ``ExactSampler`` (see the module docstring)."""

    passes: int
    lists_from_cache: int
    lists_from_disk: int
    bytes_read: int
    """Bytes the reader's ``preadv`` calls returned for this sampler (gaps and padding included)."""
    read_calls: int
    fetch_seconds: float
    compute_seconds: float


class ExactSampler:
    """Samples passes over a graph whose neighbour lists stay on disk; see the module docstring.

    indptr: int64 [N+1], the CSC offsets in RAM (the same offsets the cache and the reader
    use); neighbor_cache, neighbor_reader: the list sources; group_size (default 16): batches
    per hop-major group; owns_reader (default False): ``close`` closes the reader too (as for
    a sampler made by ``from_dataset``).
    """

    def __init__(self, indptr: np.ndarray, neighbor_cache: NeighborCache, neighbor_reader: NeighborReader, *,
                 group_size: int = DEFAULT_GROUP_SIZE, owns_reader: bool = False) -> None:
        self.indptr = as_int_array("indptr", indptr, (np.int64,))
        if len(self.indptr) == 0 or self.indptr[0] != 0:
            raise ValueError("indptr: expected N+1 >= 1 entries starting at 0")
        if not isinstance(neighbor_cache, NeighborCache):
            raise ValueError(f"neighbor_cache: expected a NeighborCache, got {type(neighbor_cache).__name__}")
        if not isinstance(neighbor_reader, NeighborReader):
            raise ValueError(f"neighbor_reader: expected a NeighborReader, got {type(neighbor_reader).__name__}")
        for name, other in (("neighbor_cache", neighbor_cache.indptr), ("neighbor_reader", neighbor_reader.indptr)):
            # Lists are addressed through these offsets: different ones would silently mix graphs.
            if other is not self.indptr and not np.array_equal(other, self.indptr):
                raise ValueError(f"{name}: built over a different indptr than the sampler's")
        size = as_int("group_size", group_size)
        if size < 1:
            raise ValueError(f"group_size: {size}, expected >= 1")
        self.cache = neighbor_cache
        self.reader = neighbor_reader
        self.group_size = size
        num_nodes = len(self.indptr) - 1
        scratch = np.int32 if num_nodes < 2**31 else np.int64
        self._mark = np.full(num_nodes, -1, dtype=scratch)
        self._slot = np.full(num_nodes, -1, dtype=scratch)
        self._lock = threading.Lock()
        self._owns_reader = owns_reader
        self._passes = 0
        self._from_cache = 0
        self._from_disk = 0
        self._bytes_read = 0
        self._read_calls = 0
        self._fetch_seconds = 0.0
        self._compute_seconds = 0.0

    @classmethod
    def from_dataset(cls, dataset: Dataset, *, cache_budget_bytes: int, group_size: int = DEFAULT_GROUP_SIZE,
                     gap_bytes: int = DEFAULT_GAP_BYTES, read_threads: int = DEFAULT_READ_THREADS,
                     direct_io: bool = False) -> "ExactSampler":
        """A sampler over a prepared dataset: reads ``indptr`` and ``neighbor_rank``, builds the cache.

        The sampler owns its reader; ``close`` it (or use it as a context manager).
        """
        indptr = dataset.read("indptr", np.int64, 1)
        reader = NeighborReader(indptr, Path(dataset.file("indices")), gap_bytes=gap_bytes,
                                read_threads=read_threads, direct_io=direct_io)
        try:
            cache = NeighborCache.build(dataset.read("neighbor_rank", np.int64, 1), reader, cache_budget_bytes)
            return cls(indptr, cache, reader, group_size=group_size, owns_reader=True)
        except BaseException:
            reader.close()
            raise

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def stats(self) -> ExactSamplingStats:
        return ExactSamplingStats(self._passes, self._from_cache, self._from_disk, self._bytes_read,
                                  self._read_calls, self._fetch_seconds, self._compute_seconds)

    def _fetch(self, union: np.ndarray, on_read: ReadRecorder | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(list starts, degrees, read lists) of the ascending frontier set ``union``; its one read request (the
        missed lists, coalesced) reported to ``on_read``.

        Starts are in the two-array space of ``loader.sampling.exact_sampling_kernels``: a cached list at
        its place in the cache, a read one after the cache's end.
        """
        degrees = self.indptr[union + 1] - self.indptr[union]
        starts = self.cache.address[union] if self.cache.has_table else np.full(len(union), -1, dtype=np.int64)
        nonempty = degrees > 0
        missed = (starts < 0) & nonempty
        self._from_cache += int(np.count_nonzero(nonempty)) - int(np.count_nonzero(missed))
        starts[~missed & (starts < 0)] = 0  # empty lists: any in-range start, nothing is read from it
        if not missed.any():
            return starts, degrees, np.empty(0, dtype=self.reader.dtype)
        calls, nbytes = self.reader.read_calls, self.reader.bytes_read
        started = time.perf_counter()
        lists = self.reader.read(union[missed])
        calls, nbytes = self.reader.read_calls - calls, self.reader.bytes_read - nbytes
        if on_read is not None:
            on_read.record(time.perf_counter() - started, nbytes, calls)
        self._read_calls += calls
        self._bytes_read += nbytes
        self._from_disk += lists.num_lists
        starts[missed] = len(self.cache.lists) + lists.offsets[:-1]
        return starts, degrees, lists.lists

    def sample_pass(self, seeds: np.ndarray, batch_size: int, fanouts: Sequence[int], keys: np.ndarray, *,
                    on_read: ReadRecorder | None = None) -> SampledPass:
        """Sample every batch of a pass: ``loader.sampling.sampling.sample_pass`` on the full graph, from cache
        and disk.

        seeds: node ids in batch order, cut into batches of ``batch_size`` (the last may be
        smaller), distinct within a batch; fanouts[h]: most neighbours per target at hop h+1,
        -1 for all; keys: one uint64 per batch (``loader.sampling.sampling.batch_keys``); on_read: told of each
        read request (one per hop per group that misses the cache), so a caller can tell apart the passes of
        several callers sharing this sampler (training and evaluation).
        """
        seed_array, size, fanout_list, key_array = check_pass_args(seeds, batch_size, fanouts, keys, self.num_nodes)
        num_batches = len(key_array)
        with self._lock:
            return self._sample(seed_array, size, fanout_list, key_array, num_batches, on_read)

    def _sample(self, seeds: np.ndarray, batch_size: int, fanouts: list[int], keys: np.ndarray, num_batches: int,
                on_read: ReadRecorder | None) -> SampledPass:
        mark, slot = self._mark, self._slot
        batch, seed = first_duplicate_seed(seeds, batch_size, mark)
        if batch >= 0:
            raise ValueError(f"seeds: local id {seed} occurs twice in batch {batch}")
        num_hops = len(fanouts)
        max_fanout = max([1, *fanouts])
        table = np.empty(pick_table_size(max_fanout), dtype=np.int64)
        chosen = np.empty(max_fanout, dtype=np.int64)
        node_ptr = np.zeros(num_batches + 1, dtype=np.int64)
        edge_ptr = np.zeros(num_batches + 1, dtype=np.int64)
        num_sampled_nodes = np.zeros((num_batches, num_hops + 1), dtype=np.int64)
        num_sampled_edges = np.zeros((num_batches, num_hops), dtype=np.int64)
        nodes = np.empty(max(1, len(seeds)), dtype=np.int64)
        edge_src = np.empty(1, dtype=np.int64)
        edge_dst = np.empty(1, dtype=np.int64)
        node_used = edge_used = 0
        gnodes = np.empty(1, dtype=np.int64)
        gsrc = np.empty(1, dtype=np.int64)
        gdst = np.empty(1, dtype=np.int64)
        # One set of group buffers serves every group of the pass (they only grow).
        for first_batch in range(0, num_batches, self.group_size):
            group = min(self.group_size, num_batches - first_batch)
            seed_begin = first_batch * batch_size
            seed_end = min(seed_begin + group * batch_size, len(seeds))
            started = time.perf_counter()
            if len(gnodes) < seed_end - seed_begin:
                gnodes = np.empty(2 * (seed_end - seed_begin), dtype=np.int64)
            gnodes[:seed_end - seed_begin] = seeds[seed_begin:seed_end]
            nptr = np.zeros((num_hops + 1, group + 1), dtype=np.int64)
            nptr[0] = np.minimum(np.arange(group + 1) * batch_size, seed_end - seed_begin)
            eptr = np.zeros((num_hops, group + 1), dtype=np.int64)
            group_keys = keys[first_batch:first_batch + group]
            fetch = 0.0
            for h, fanout in enumerate(fanouts):
                t0 = time.perf_counter()
                union = frontier_union(gnodes, nptr[h, 0], nptr[h, group], slot) if fanout != 0 else \
                    np.empty(0, dtype=np.int64)
                # slot marks the frontier until the hop is sampled; a failed read must clear it too, or the
                # next pass (a retried epoch) starts from a dirty map
                try:
                    if fanout != 0:
                        starts, degrees, read_lists = self._fetch(union, on_read)
                    else:
                        starts = degrees = np.empty(0, dtype=np.int64)
                        read_lists = np.empty(0, dtype=self.reader.dtype)
                    t1 = time.perf_counter()
                    status, detail0, detail1, gnodes, gsrc, gdst = sample_group_hop(
                        h, fanout, group_keys, gnodes, nptr, gsrc, gdst, eptr, slot, starts, degrees,
                        self.cache.lists, read_lists, mark, table, chosen)
                finally:
                    slot[union] = -1
                if status == STATUS_BAD_NEIGHBOUR:
                    raise ValueError(f"indices: in-neighbour {detail1} of local node {detail0} is outside "
                                     f"[0, {self.num_nodes})")
                fetch += t1 - t0
            nodes, edge_src, edge_dst, node_used, edge_used = append_group(
                first_batch, gnodes, nptr, gsrc, gdst, eptr, nodes, node_used, edge_src, edge_dst, edge_used,
                node_ptr, edge_ptr, num_sampled_nodes, num_sampled_edges)
            self._fetch_seconds += fetch
            self._compute_seconds += time.perf_counter() - started - fetch
        self._passes += 1
        return SampledPass(num_batches=num_batches, num_hops=num_hops, node_ptr=node_ptr, nodes=nodes[:node_used],
                           edge_ptr=edge_ptr, edge_src=edge_src[:edge_used], edge_dst=edge_dst[:edge_used],
                           num_sampled_nodes=num_sampled_nodes, num_sampled_edges=num_sampled_edges)

    def close(self) -> None:
        """Close the reader if this sampler owns it."""
        if self._owns_reader:
            self.reader.close()

    def __enter__(self) -> "ExactSampler":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
