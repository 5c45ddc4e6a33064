"""Mode "hybrid": the exact mode's batches, each superbatch's rows from whole partitions loaded sequentially where
they pay, the rest through the exact mode's Belady-planned row path.

The seeds, keys and sampler are the exact mode's (batches bitwise the in-memory sampler's, in its order: nothing is
regrouped). What changes is where a row comes from. The planner stage takes a sampled superbatch and

1. counts, per partition, the superbatch's accesses and its distinct rows (``choose_resident``);
2. picks the partitions with the most accesses per byte, as many as ``resident_bytes`` holds, among those whose
   one sequential pass (``[io] sequential_rate``) costs less than reading their distinct rows at random
   (``[io] random_reads``);
3. loads them whole: one pass over their contiguous ranges of ``features.bin`` (the prepared layout keeps a
   partition's rows together), read ahead and checked as the staged mode's passes are
   (``SequentialReader.read_rows``);
4. plans the Belady cache over the accesses those partitions do not serve, from the state the previous superbatch
   left.

The publisher then copies each batch's resident rows from RAM and gathers the rest as the exact mode does (cache
hits copied, misses read at random). A superbatch's partitions live as long as it does, so the budget holds
``SUPERBATCHES_IN_FLIGHT`` sets of them (the planner loads the next while the publisher gathers from this one: the
double-buffered mega-batch of HierBatching, with Ginex's cache beside it).

Where it stands: with a uniformly random schedule, a partition's share of a superbatch's accesses is about its share
of the file (bench/hybrid_bench), so resident partitions serve fewer accesses per byte than a row cache does; they
pay where a partition is dense enough in a superbatch's rows that its pass beats their random reads. The staged
mode reads every such chunk sequentially and caches rows by degree, and measures faster (docs/PERFORMANCE.md).
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from loader.caches.changeset_kernels import copy_rows
from loader.caches.feature_cache import row_words
from loader.daemon.fullgraph.outofcore import (
    HYBRID_BYTES_PER_SAMPLED_NODE,
    HYBRID_RESIDENT_SHARE,
    STAGING_CHUNK_SMALL,
    BeladyRows,
    BeladyStream,
    ExactMode,
    OutOfCoreBudget,
)
from loader.daemon.read_metrics import TRAIN
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import RowSource
from loader.format.dataset import Dataset
from loader.format.partition_table import PartitionTable
from loader.sampling.sampling import SampledBatches
from loader.staging.sequential_reader import SequentialReader

__all__ = ["HybridMode", "ResidentPartitions", "choose_resident"]

log = logging.getLogger("megabatch.hybrid")

PAGE = 4096


def choose_resident(accesses: np.ndarray, distinct: np.ndarray, ram_bytes: np.ndarray, pass_bytes: np.ndarray,
                    capacity: int, *, row_pages: int, sequential_rate: float, random_reads: float) -> np.ndarray:
    """Which partitions a superbatch loads whole (a bool mask): by ``accesses`` per byte of RAM (``ram_bytes``), the
    longest prefix of that order that fits ``capacity``, among the partitions whose pass over ``pass_bytes`` at
    ``sequential_rate`` takes less time than ``distinct`` rows of ``row_pages`` pages each at ``random_reads``."""
    accesses = np.asarray(accesses, dtype=np.float64)
    ram = np.asarray(ram_bytes, dtype=np.int64)
    worth = np.asarray(distinct) * row_pages / random_reads > np.asarray(pass_bytes) / sequential_rate
    order = np.argsort(-accesses / np.maximum(ram, 1), kind="stable")
    order = order[worth[order]]
    fits = np.cumsum(ram[order]) <= capacity
    chosen = np.zeros(len(ram), dtype=bool)
    chosen[order[fits]] = True
    return chosen


@dataclass(frozen=True)
class ResidentPartitions:
    """One superbatch's partitions in RAM: ``rows`` holds each chosen partition's rows in order, from ``base[p]``
    (-1: partition p is not resident)."""

    rows: np.ndarray
    base: np.ndarray
    partitions: PartitionTable

    def positions(self, nodes: np.ndarray) -> np.ndarray:
        """Each node's row in ``rows``, or -1 where its partition is not resident."""
        part = self.partitions.partition_of(nodes)
        base = self.base[part]
        return np.where(base >= 0, base + nodes - self.partitions.node_begin[part], -1)


class HybridMode(ExactMode):
    """Exact batches; per superbatch, the partitions worth a pass loaded whole, the rest from the exact mode's
    Belady cache and row reads (the module docstring)."""

    name = "hybrid"
    scratch_bytes_per_node = ExactMode.scratch_bytes_per_node + 1
    """And the map of a superbatch's distinct nodes (which partitions are worth their pass)."""
    bytes_per_sampled_node_beside = HYBRID_BYTES_PER_SAMPLED_NODE
    resident_share = HYBRID_RESIDENT_SHARE

    def __init__(self, serving: ServingContext, dataset: Dataset, plan: OutOfCoreBudget) -> None:
        super().__init__(serving, dataset, plan)
        try:
            m = dataset.manifest
            checks = self.read_checks
            # the staged mode's checked, read-ahead pass over the file (nothing is staged)
            self.partition_reader = SequentialReader(dataset.file("features"), row_bytes=m.row_bytes,
                                                     block_sums=None if checks is None else checks.feature_blocks,
                                                     check_block=m.feature_check_bytes,
                                                     direct=serving.config.io.direct_io,
                                                     chunk_bytes=STAGING_CHUNK_SMALL, scatter_bytes=STAGING_CHUNK_SMALL)
            self.partitions = dataset.partitions()
            self._seen = np.zeros(m.num_nodes, dtype=bool)
            # the partitions' pass waits on the disk most of its time: a thread of its own, as staged's stager
            self.planner_pool = ThreadPoolExecutor(1, thread_name_prefix="megabatch-hybrid")
        except BaseException:
            self.close()
            raise
        log.info("hybrid: up to %s of whole partitions per superbatch, a Belady cache of %s rows",
                 f"{plan.resident_bytes:,} B", f"{plan.feature_cache_rows:,}")

    def load_resident(self, sampled: SampledBatches) -> ResidentPartitions:
        """The partitions worth a pass for ``sampled``, loaded (the planner stage's work)."""
        started = time.perf_counter()
        parts, row_bytes, io = self.partitions, self._row_bytes, self.serving.config.io
        nodes = sampled.nodes
        self._seen[nodes] = True
        distinct_ids = np.flatnonzero(self._seen)
        self._seen[distinct_ids] = False
        counts = parts.num_nodes.astype(np.int64)
        chosen = choose_resident(np.bincount(parts.partition_of(nodes), minlength=len(parts)),
                                 parts.count_in(distinct_ids), counts * row_bytes, parts.feat_padded,
                                 self.budget_plan.resident_bytes, row_pages=-(-row_bytes // PAGE),
                                 sequential_rate=io.sequential_rate, random_reads=io.random_reads)
        which = np.flatnonzero(chosen)
        sizes = counts[which]
        base = np.full(len(parts), -1, dtype=np.int64)
        base[which] = np.cumsum(sizes) - sizes
        total = int(sizes.sum())
        rows = np.empty((total, self.serving.feat_dim), dtype=self.serving.feat_dtype)
        # every row of the chosen partitions: partition p's k-th row at feat_offset[p] + k * row_bytes
        first = np.repeat(parts.feat_offset[which] - base[which] * row_bytes, sizes)
        offsets = first + np.arange(total, dtype=np.int64) * row_bytes
        # the choice's time here; the pass charges its own
        self._metrics.stage_busy.labels("staging").inc(time.perf_counter() - started)
        self.read_by_pass(self.partition_reader, offsets, rows, TRAIN)
        return ResidentPartitions(rows, base, parts)

    def stream(self) -> BeladyStream:
        return _HybridStream(self)

    def close(self) -> None:
        super().close()
        reader = getattr(self, "partition_reader", None)
        if reader is not None:
            reader.close()


class _HybridStream(BeladyStream):
    """One training stream's plans: each superbatch's partitions, and its Belady plan over the rest from the state
    the previous one left."""

    def __init__(self, mode: HybridMode) -> None:
        super().__init__(mode)
        self._hybrid = mode

    def rows_for(self, sampled: SampledBatches) -> RowSource:
        resident = self._hybrid.load_resident(sampled)
        elsewhere = resident.positions(sampled.nodes) < 0
        through = np.zeros(len(elsewhere) + 1, dtype=np.int64)
        np.cumsum(elsewhere, out=through[1:])
        return _HybridRows(self._hybrid, resident, self.plan(through[sampled.node_ptr], sampled.nodes[elsewhere]))


class _HybridRows(RowSource):
    """A superbatch's rows: resident ones copied from its partitions, the others gathered as ``exact`` gathers them
    (``BeladyRows``: cache hits copied, misses read, the cache updated as its plan says)."""

    fills_any_subset = False

    def __init__(self, mode: HybridMode, resident: ResidentPartitions, cached: BeladyRows) -> None:
        self._mode, self._resident, self._cached = mode, resident, cached
        self._resident_words = row_words(resident.rows)

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        positions = self._resident.positions(nodes)
        here = np.flatnonzero(positions >= 0)
        x_words = row_words(x)
        copy_rows(self._resident_words, positions[here], x_words, here)
        self._mode.serving.metrics.feature_cache_lookups.labels("resident").inc(len(here))
        # the plan's batch b is this batch's other rows, in order; gathered whole, then put in their places
        elsewhere = np.flatnonzero(positions < 0)
        gathered = np.empty((len(elsewhere), x.shape[1]), dtype=x.dtype)
        self._cached.fill(b, nodes[elsewhere], gathered)
        copy_rows(row_words(gathered), np.arange(len(elsewhere), dtype=np.int64), x_words, elsewhere)
