"""The whole graph read from disk through checked preads: neighbour lists and feature rows, never a memory map.

``DiskGraph`` holds ``indptr`` in RAM and reads the rest when a pass asks for it:

* neighbour lists through ``ExactSampler`` (``loader.sampling.exact_sampling``) over a ``NeighborCache``
  (empty for evaluation) and a ``NeighborReader``: a pass equals ``loader.sampling.sampling.sample_pass`` over
  the whole CSC in RAM, bit for bit;
* feature rows through a ``RowReader`` (sorted, page-merged preads on ``ROW_READ_THREADS`` threads).

With read checks (``[io] check_reads``, dataset format 1.1+) every 4 KiB page of ``indices.npy`` and every
check block of ``features.bin`` a read touches is verified on the read threads, and a mismatch fails the pass
with ``CorruptData``. Why no mapping: a mapped file that shrinks under the daemon kills it with SIGBUS at the
first touch of a page past its new end, where a pread returns short and fails only the stream that asked, with
one line naming the file and the byte (``read_rows`` turns the row reader's errors into that line; the
neighbour reader words its own).

The out-of-core modes sample and read their missed rows through one (``loader.daemon.fullgraph.outofcore``);
the hierarchical and ``mmap`` modes evaluate through one (``disk_eval``), so a validation or test batch is
checked as a training batch is. ``eval_graph_bytes`` is what such an evaluation reader holds, for the memory plans.
"""

import functools
import threading
from pathlib import Path

import numpy as np

from loader.caches.row_reader import DEFAULT_MAX_SPAN, RowReader
from loader.daemon.config import IOConfig
from loader.daemon.eval_stream import EvalAccess, ModeEval
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.read_metrics import EVAL, STARTUP
from loader.daemon.row_reads import read_rows_counted
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import RowSource
from loader.format.checksum_kernels import PAGE_BYTES
from loader.format.dataset import Dataset
from loader.format.partition_table import row_offsets_for
from loader.format.read_checks import ReadChecks, block_table_bytes
from loader.sampling.exact_sampling import ExactSampler
from loader.sampling.neighbor_cache import NeighborCache
from loader.sampling.neighbor_reader import NeighborReader
from loader.sampling.sampling import SampledPass

__all__ = ["DiskGraph", "DiskRows", "disk_eval", "eval_graph_bytes", "expanded_share", "ROW_READ_THREADS",
           "SAMPLER_MAP_BYTES", "EVAL_SAMPLE_GROUP"]

ROW_READ_THREADS = 32
"""Preads in flight for rows read at random. Exact mode is bound by random reads: on bench/compare 16 threads
gave 1.96 batches/s, 32 gave 2.24-2.37 and 64 gave 2.43 (~70k 4 KiB reads/s at 16 in flight, ~78k at
32 on this virtual disk); 32 takes most of the gain for 8 MiB of bounce buffers."""
SAMPLER_MAP_BYTES = 8
"""Per node: the exact sampler's two int32 maps (frontier slots and batch marks), held while it lives."""
EVAL_SAMPLE_GROUP = 1
"""Batches per sample group of an evaluation sampler. Checked list reads are staged in whole pages, a group's
frontier at a time: one batch's is what ``eval_graph_bytes`` charges, where the out-of-core modes' default
of 16 would stage 16 batches' frontiers (tens of MiB each for 1024-seed batches on a large graph)."""


def expanded_share(fanouts: tuple[int, ...]) -> float:
    """Share of a batch's nodes whose lists are fetched (all but the last hop's), from the fanout bound."""
    if any(f < 0 for f in fanouts):
        return 1.0
    level, total = 1, 1
    for f in fanouts:
        level *= f
        total += level
    return (total - level) / total


class DiskGraph:
    """``indptr`` in RAM, lists and rows read (and checked) on demand; see the module docstring.

    checks: the dataset's read checks with their block tables (``load_read_checks(blocks=True)``), or None
    (unchecked); neighbor_cache_bytes: lists cached by the prepared ranking (0: every list read);
    group_size: the sampler's batches per sample group; count_cache: count lists as neighbour-cache hits and
    misses in the metrics (False where the mode has no neighbour cache to report on).
    """

    def __init__(self, dataset: Dataset, io: IOConfig, metrics: DaemonMetrics, *, checks: ReadChecks | None,
                 neighbor_cache_bytes: int = 0, group_size: int = EVAL_SAMPLE_GROUP, count_cache: bool = True
                 ) -> None:
        m = dataset.manifest
        self._metrics = metrics
        self._count_cache = count_cache
        self.checks = checks
        self.row_bytes = m.row_bytes
        partitions = dataset.partitions()
        self.node_begin, self.feat_offset = partitions.node_begin, partitions.feat_offset
        direct = io.direct_io
        indptr = dataset.read("indptr", np.int64, 1)
        # O_DIRECT reads whole pages anyway; buffered reads gain nothing from reading gaps between lists
        reader = NeighborReader(indptr, Path(dataset.file("indices")), gap_bytes=4096 if direct else 0,
                                read_threads=max(8, io.read_threads), direct_io=direct,
                                page_sums=None if checks is None else checks.index_pages)
        try:
            if neighbor_cache_bytes:
                cache = NeighborCache.build(dataset.read("neighbor_rank", np.int64, 1), reader, neighbor_cache_bytes)
            else:
                cache = NeighborCache.empty(indptr, np.dtype(m.index_dtype.value))
            self.sampler = ExactSampler(indptr, cache, reader, group_size=group_size, owns_reader=True)
            # the neighbour cache's fill: bulk reads once, not worth a latency each
            metrics.read_meter("indices", STARTUP).count(reader.bytes_read, reader.read_calls)
        except BaseException:
            reader.close()
            raise
        try:
            self.rows = RowReader(dataset.file("features"), row_bytes=m.row_bytes, direct=direct,
                                  threads=ROW_READ_THREADS,
                                  block_sums=None if checks is None else checks.feature_blocks,
                                  check_block=m.feature_check_bytes)
        except BaseException:
            self.sampler.close()
            raise
        self.cache_bytes = cache.nbytes
        # the sampler's counters are cumulative and several streams sample: each call reports what it added
        self._counted = self.sampler.stats
        self._count_lock = threading.Lock()

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray, *,
               purpose: str) -> SampledPass:
        """``sample_pass`` over the whole graph; its list reads counted in the metrics under ``purpose``."""
        try:
            return self.sampler.sample_pass(seeds, batch_size, fanouts, keys,
                                            on_read=self._metrics.read_meter("indices", purpose))
        finally:
            with self._count_lock:
                before, after = self._counted, self.sampler.stats
                self._counted = after
            m = self._metrics
            if self._count_cache:
                m.neighbor_cache_lookups.labels("hit").inc(after.lists_from_cache - before.lists_from_cache)
                m.neighbor_cache_lookups.labels("miss").inc(after.lists_from_disk - before.lists_from_disk)

    def row_offsets(self, ids: np.ndarray) -> np.ndarray:
        """Each dataset id's row's byte offset in ``features.bin``."""
        return row_offsets_for(ids, self.node_begin, self.feat_offset, self.row_bytes)

    def read_rows(self, ids: np.ndarray, positions: np.ndarray, out: np.ndarray, *, purpose: str) -> None:
        """Rows of dataset ids ``ids`` from disk into ``out[positions]``, one read request counted under
        ``purpose``."""
        read_rows_counted(self.rows, self.row_offsets(ids), out, positions, self._metrics, "features", purpose)

    def close(self) -> None:
        self.sampler.close()
        self.rows.close()


class DiskRows(RowSource):
    """Every row read from disk, counted under ``purpose``."""

    def __init__(self, graph: DiskGraph, purpose: str) -> None:
        self._graph, self._purpose = graph, purpose

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        self._graph.read_rows(nodes, np.arange(len(nodes), dtype=np.int64), x, purpose=self._purpose)


def disk_eval(graph: DiskGraph, serving: ServingContext) -> EvalAccess:
    """An evaluation stream's access through ``graph``: its sampler, every row read (local ids are dataset ids)."""
    source = serving.slot_source(DiskRows(graph, EVAL), serving.labels, None)
    return ModeEval(source, functools.partial(graph.sample, purpose=EVAL))


def eval_graph_bytes(dataset: Dataset, io: IOConfig, batch_nodes: int, fanouts: tuple[int, ...]) -> int:
    """RAM an evaluation ``DiskGraph`` (no neighbour cache, ``EVAL_SAMPLE_GROUP``) holds at most, for batches of
    about ``batch_nodes`` nodes sampled with ``fanouts``: indptr (8 B per node), the sampler's maps
    (``SAMPLER_MAP_BYTES``), the read checks' block tables (8 B per check block of features.bin and per page of
    indices.npy), the row reads' bounce buffers, and one sample group's lists (read into an array, and with
    checks or O_DIRECT staged first in the whole pages they lie in)."""
    m = dataset.manifest
    n = m.num_nodes
    itemsize = np.dtype(m.index_dtype.value).itemsize
    lists = int(EVAL_SAMPLE_GROUP * batch_nodes * expanded_share(fanouts))
    list_bytes = int(lists * m.num_edges / max(1, n) * itemsize)
    staged = 0
    if io.check_reads or io.direct_io:  # a list is staged in its page(s); no more pages than the file has
        staged = min(m.files["indices.npy"].bytes + PAGE_BYTES, lists * PAGE_BYTES + list_bytes)
    return (8 * (n + 1) + SAMPLER_MAP_BYTES * n + (block_table_bytes(dataset) if io.check_reads else 0)
            + ROW_READ_THREADS * DEFAULT_MAX_SPAN + list_bytes + staged)
