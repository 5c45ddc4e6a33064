"""The out-of-core full-graph modes: "exact" (Ginex), "static" (Ali+PG) and "staged", and their memory split.

Both hold only ``indptr`` of the graph in RAM, sample with ``ExactSampler`` (a neighbour cache
filled by the prepared out/in-degree ranking, missed lists read from disk, each list once per hop
per sample group) and read missed feature rows with ``RowReader`` (sorted, page-merged preads).
They differ in the feature cache:

* ``exact``: a cache of C rows run by Belady's plan over each superbatch (``loader.caches.changeset``),
  computed by the planner stage while the next superbatch is sampled and applied by the publisher
  as it gathers (``loader.caches.feature_cache``): the fewest row reads for that cache size within the
  superbatch's horizon. The plan is in the demand model (``prefetch=False``: rows enter the cache
  only from the batches that read them, and rows not needed again in the superbatch stay while
  nothing else wants their slot). With the short superbatches a budget allows (a few batches of
  ~60k nodes), read-ahead fills re-read rows each superbatch that a longer horizon would keep:
  measured on bench/compare, 0.769 rows read per row used with fills against 0.699 without (static:
  0.727).
* ``static``: the C rows of highest out-degree (PaGraph's choice), loaded once, never changed.
* ``staged`` (``staged.py``): static's degree-ranked feature cache; the planner stage stages each superbatch's other
  rows (``loader.staging``): one
  sequential O_DIRECT pass over the chunks of ``features.bin`` its batches use, each batch's rows
  written to its region of a staging file under ``[fullgraph] staging_dir``, which the publisher reads
  back sequentially (in reads of at most 4 MiB). A chunk holding too few of the superbatch's rows to pay for its pass
  (``choose_staged``, fed ``[io] sequential_rate`` and ``random_reads``) is not staged: its rows are
  read at random at publish, as in ``exact``. Sequential bytes instead of random reads: the disk moves the file's
  share (1/superbatch of the file per batch, at most) plus each batch's rows twice (written, read
  back), at its sequential rates. Long superbatches pay: the pass is shared by more batches.

Memory (``plan_outofcore``), Ginex §3.5 adapted to a pipeline where sampling and gathering run at
the same time, so both caches share the budget instead of taking turns::

    node arrays (21 B/node) + slots + indptr (8 B/node) + scratch (sampler 8 B/node, planner
    or static address table 4 B/node) + read-check block tables (8 B per check block of
    features.bin and per 4 KiB page of indices.npy) + the epoch's seed order (8 B per training
    node) + 3 superbatches in flight (sampling, planned, publishing: 40 B per sampled node + 16 B
    per edge, from a pilot sample) + read buffers (neighbour lists of one sample group's frontiers,
    the neighbour reader's staging buffer of 8 MiB and the longest list's pages, 32 row-read
    spans, a superbatch's seeds) + neighbour cache + feature cache <= budget

Every buffer the process maps counts, shared memory included (the slots; the reader's and the
stager's page-aligned buffers are anonymous shared mappings): under a memory cgroup they are all
charged alike. What is not charged is the interpreter, its libraries and numba's code
(``bench.harness.DAEMON_OVERHEAD`` states it).

``"auto"`` gives the neighbour cache all lists if they fit in half of what remains, else that
half, and the feature cache the rest. Lists first because they are cheap per read saved: a list
is tens of bytes and saves one random read each time its node is a frontier target, while a
feature row is a whole row for the same one read.
"""

import functools
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

import numpy as np

from loader.caches.changeset import CachePlan, CachePlanner, CacheState
from loader.caches.changeset_kernels import copy_rows
from loader.caches.feature_cache import FeatureCache, row_words
from loader.caches.row_reader import DEFAULT_MAX_SPAN
from loader.daemon.budget_plan import BudgetPlan, budget_too_small
from loader.daemon.config import LoaderConfig
from loader.daemon.disk_graph import ROW_READ_THREADS, DiskGraph, DiskRows, expanded_share
from loader.daemon.eval_stream import EvalAccess, ModeEval
from loader.daemon.fullgraph.fullgraph import SUPERBATCHES_IN_FLIGHT, FullGraphMode, RowsFor
from loader.daemon.mode import ModeSetup
from loader.daemon.read_metrics import EVAL, STARTUP, TRAIN
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import RowSource
from loader.format.dataset import Dataset
from loader.format.read_checks import block_table_bytes, load_read_checks
from loader.sampling.neighbor_reader import max_degree, staging_bound
from loader.sampling.sampling import SampledBatches, SampledPass
from loader.staging.scratch_files import takes_direct_writes
from loader.staging.sequential_reader import SequentialReader, StagingStats, reader_buffer_bytes
from loader.staging.spilled_pass import id_dtype
from loader.staging.stager import stager_buffer_bytes
from loader.staging.window_plan import PLAN_SLICE_ROWS, plan_window_bytes
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["OutOfCoreBudget", "plan_outofcore", "OutOfCoreMode", "ExactMode", "BeladyStream",
           "BeladyRows", "StaticMode", "DegreeCache", "out_degree_ranking",
           "BYTES_PER_SAMPLED_NODE", "BYTES_PER_SAMPLED_EDGE", "SPILLED_BATCH_BYTES", "STAGING_CHUNK",
           "STAGING_CHUNK_SMALL", "STAGING_FLUSH", "STAGED_PLAN_BATCHES", "STAGED_PLAN_ROWS", "HYBRID_RESIDENT_SHARE",
           "HYBRID_BYTES_PER_SAMPLED_NODE"]

log = logging.getLogger("megabatch.outofcore")

BYTES_PER_SAMPLED_NODE = 40
"""Node id (8) + plan: next access (4), hit slot (4), worst-case update record (24)."""
BYTES_PER_SAMPLED_EDGE = 16
"""Source and target positions, int64 each."""
SPILLED_BATCH_BYTES = 320
"""Mode staged: RAM per batch of a spilled superbatch (its pointers and counts, its record's numbers in the spill
file, 192 B as Python ints, and its staging region and digest)."""
STAGING_CHUNK = 16 << 20
"""Mode staged: bytes of features.bin per read of the staging pass, where the budget allows (the scatter buffer is
as large). A chunk's rows go out as one write per batch, so a larger chunk makes larger writes and fewer Python
steps: on bench/compare's 1M-node graph (448M, 128 batches) 16 MiB staged at 24.2 batches/s where 4 MiB did 20.1,
and alone (staging a window, no daemon) 17 ms a batch against 34.7 at 4 MiB on the 500k-node graph."""
STAGING_CHUNK_SMALL = 4 << 20
"""Mode staged: the chunk where 16 MiB ones would take the neighbour lists' room (at 192M on the 500k-node graph
they did: 17.4 batches/s against 21.1, the sampler reading lists)."""
STAGING_FLUSH = 8 << 20
"""Mode staged: staging writes between two flushes (the page cache holds about twice this)."""
HYBRID_RESIDENT_SHARE = 0.5
"""Mode hybrid: the share of the feature bytes (``[fullgraph] feature_cache``) that goes to the superbatches' resident
partitions, split evenly between the ``SUPERBATCHES_IN_FLIGHT`` of them; the rest is the Belady cache. A design
default, not a measured optimum: bench/hybrid_bench found Belady serving more accesses per byte (0.52 of them at 10%
of the 1M-node graph's file, the best partitions 0.13), so the partitions pay only by loading sequentially what
the row path would read at random."""
HYBRID_BYTES_PER_SAMPLED_NODE = 16
"""Mode hybrid: per sampled node of a superbatch in flight beyond ``BYTES_PER_SAMPLED_NODE``: the id of a row the
resident partitions miss (the plan's trace, 8) and the running count that cuts it into batches (8)."""
STAGED_PLAN_BATCHES = 256
"""Mode staged: the staging plan (8 B per staged row) is charged for the rows of at most this many batches, not a
whole superbatch's: only the rows the feature cache misses are planned, and a superbatch whose misses do not fit is
staged in several windows of consecutive batches, a pass over the file each. So a longer superbatch costs the cache
nothing where its misses fit. Measured on bench/compare's 1M-node graph at 448M: superbatches of 512 batches with
256's feature cache (the budget raised by the 29 MiB a plan charged for 512 batches' rows took) ran at 49.4 and
55.4 batches/s against 44.1 and 43.1 at 256, reading 23% fewer bytes; 48% of their rows were misses, which fit."""
STAGED_PLAN_ROWS = 4 << 20
"""Mode staged: the most rows the staging plan is charged for, whatever the batch size (32 MiB at 8 B a row). The
measurements above were at batch 256 (256 batches of 12.7k rows: 3.3M); at bench/compare's default batch of 1024
on its 2M-node graph, 256 batches are 13.3M rows, 106 MiB of a 448M budget whose feature cache then got nothing,
so a window there is about 80 batches instead."""


@dataclass(frozen=True)
class OutOfCoreBudget(BudgetPlan):
    """The resolved split of the budget for an out-of-core mode; ``describe()`` is logged at startup."""

    mode: str
    budget: int
    fixed_bytes: int
    """Node arrays and slots (as in every mode)."""
    graph_bytes: int
    """indptr, the per-node scratch of sampler, planner and static address table, the read-check block tables and the
    epoch's seed order."""
    working_bytes: int
    """Superbatches in flight and read buffers (the neighbour reader's staging buffer, shared memory, included)."""
    neighbor_cache_bytes: int
    feature_cache_rows: int
    row_bytes: int
    staging_chunk: int = 0
    """Mode staged: bytes of ``features.bin`` per read of the staging pass (and of its scatter buffer)."""
    plan_rows: int = 0
    """Mode staged: most rows a staging window's plan holds (``STAGED_PLAN_BATCHES`` batches' worth, at most
    ``STAGED_PLAN_ROWS``)."""
    resident_bytes: int = 0
    """Mode hybrid: bytes of whole partitions each superbatch in flight holds (``SUPERBATCHES_IN_FLIGHT`` of them)."""

    @property
    def feature_cache_bytes(self) -> int:
        return self.feature_cache_rows * self.row_bytes

    @property
    def total(self) -> int:
        return (self.fixed_bytes + self.graph_bytes + self.working_bytes + self.neighbor_cache_bytes
                + self.feature_cache_bytes + SUPERBATCHES_IN_FLIGHT * self.resident_bytes)

    def describe(self) -> str:
        return (f"memory plan ({self.mode}): budget {format_size(self.budget)} = node arrays and slots "
                f"{format_size(self.fixed_bytes)} + indptr, scratch, read checks and seed order "
                f"{format_size(self.graph_bytes)} + "
                f"superbatches in flight and read buffers {format_size(self.working_bytes)} + neighbour cache "
                f"{format_size(self.neighbor_cache_bytes)} + feature cache {self.feature_cache_rows:,} rows "
                f"{format_size(self.feature_cache_bytes)}"
                + (f" + resident partitions {SUPERBATCHES_IN_FLIGHT} x {format_size(self.resident_bytes)}"
                   if self.resident_bytes else "")
                + f" = {format_size(self.total)} used"
                + (f" (staging chunks of {format_size(self.staging_chunk)})" if self.staging_chunk else ""))


def plan_outofcore(mode: "type[OutOfCoreMode]", config: LoaderConfig, dataset: Dataset, fixed_bytes: int,
                   batch_nodes: int, batch_edges: int) -> OutOfCoreBudget:
    """Split ``[memory] budget`` for the out-of-core ``mode``, from its class's budget hooks (``OutOfCoreMode``);
    UserError when it cannot fit."""
    m, fg = dataset.manifest, config.fullgraph
    superbatch = mode.superbatch_for(config)
    n = m.num_nodes
    index_itemsize = np.dtype(m.index_dtype.value).itemsize
    # the read checks' block tables (8 B per block of features.bin and page of indices.npy) live as long as the mode;
    # the sampler stage holds the epoch's shuffled training ids (8 B each) for the whole epoch
    graph_bytes = (8 * (n + 1) + mode.scratch_bytes_per_node * n
                   + (block_table_bytes(dataset) if config.io.check_reads else 0) + 8 * m.splits.train)
    sampled_batch = batch_nodes * BYTES_PER_SAMPLED_NODE + batch_edges * BYTES_PER_SAMPLED_EDGE
    mean_degree = m.num_edges / max(1, n)
    list_staging = int(fg.sample_group * batch_nodes * expanded_share(config.sampler.sampled_fanouts) * mean_degree
                       * index_itemsize)
    # lists read from disk pass through the reader's staging buffer (whole pages, shared memory), bounded by its
    # rounds; a superbatch's seeds are gathered from the epoch's order before it is sampled
    working = (list_staging + ROW_READ_THREADS * DEFAULT_MAX_SPAN + _reader_staging_bytes(dataset)
               + 8 * superbatch * config.sampler.batch_size)
    all_lists = 8 * n + index_itemsize * m.num_edges
    staging_chunk = plan_rows = 0
    if mode.spills_superbatches:
        # a superbatch in flight is per-batch tables (its ids and edges are spilled, its rows staged); the planner
        # plans one at a time, reading its ids back a slice at a time; the sampler holds one sample group before
        # spilling it; the publisher holds a batch's record and the next one's, read ahead
        ids = id_dtype(n).itemsize
        id_slice = 2 * ids * (PLAN_SLICE_ROWS + 2 * batch_nodes)  # the records' pages and their concatenation
        records = 2 * (batch_nodes * ids + batch_edges * 8)
        # a sample group's records are laid out in one buffer (whole pages each) to be written in one go
        group_records = fg.sample_group * (records // 2 + 2 * 4096)
        plan_rows = min(STAGED_PLAN_ROWS, min(superbatch, STAGED_PLAN_BATCHES) * batch_nodes)
        plan_rows = max(plan_rows, batch_nodes)  # a window holds at least one batch
        working += (SUPERBATCHES_IN_FLIGHT * superbatch * SPILLED_BATCH_BYTES
                    + plan_window_bytes(plan_rows) + id_slice + records
                    + fg.sample_group * sampled_batch + group_records)
        direct_writes = _takes_direct_writes(fg.staging_dir)  # scratch files: O_DIRECT wherever taken

        def stager_bytes(chunk: int) -> int:
            return stager_buffer_bytes(row_bytes=m.row_bytes, batch_rows=batch_nodes, chunk_bytes=chunk,
                                       scatter_bytes=chunk, flush_bytes=STAGING_FLUSH, on_disk=True,
                                       direct_writes=direct_writes, window_batches=superbatch)

        # large chunks where the budget still gives the neighbour cache every list after them, else small ones
        fits = config.memory.budget - fixed_bytes - graph_bytes - working - stager_bytes(STAGING_CHUNK) >= all_lists
        staging_chunk = STAGING_CHUNK if fits else STAGING_CHUNK_SMALL
        working += stager_bytes(staging_chunk)
    else:
        working += SUPERBATCHES_IN_FLIGHT * superbatch * (sampled_batch
                                                          + mode.bytes_per_sampled_node_beside * batch_nodes)
    if mode.resident_share:
        # the partitions' pass has a sequential reader's chunk and scatter buffers (nothing staged or read back)
        working += reader_buffer_bytes(row_bytes=m.row_bytes, chunk_bytes=STAGING_CHUNK_SMALL,
                                       scatter_bytes=STAGING_CHUNK_SMALL)
    fixed_parts = [("node arrays and slots", fixed_bytes),
                   ("indptr, scratch, read checks and seed order", graph_bytes),
                   (f"{SUPERBATCHES_IN_FLIGHT} superbatches of {superbatch} batches in flight and read buffers",
                    working)]
    left = config.memory.budget - fixed_bytes - graph_bytes - working
    if left < 0:
        raise budget_too_small(config.memory.budget, mode.name, fixed_parts,
                               "lower [fullgraph] superbatch / sample_group")
    neighbor = fg.neighbor_cache if fg.neighbor_cache is not None else \
        min(all_lists, left if mode.lists_first else left // 2)
    feature = fg.feature_cache if fg.feature_cache is not None else left - neighbor
    if neighbor + feature > left:
        raise budget_too_small(config.memory.budget, mode.name,
                               [*fixed_parts, ("neighbour cache", neighbor), ("feature cache", feature)],
                               "lower [fullgraph] neighbor_cache / feature_cache or leave them \"auto\"")
    # the feature bytes split between the superbatches' resident partitions and the feature cache
    resident = int(feature * mode.resident_share) // SUPERBATCHES_IN_FLIGHT
    feature -= SUPERBATCHES_IN_FLIGHT * resident
    rows = min(n, feature // m.row_bytes) if m.row_bytes else 0
    return OutOfCoreBudget(mode.name, config.memory.budget, fixed_bytes, graph_bytes, working, neighbor, rows,
                           m.row_bytes, staging_chunk, plan_rows, resident)


def _reader_staging_bytes(dataset: Dataset) -> int:
    """Most bytes the neighbour reader's staging buffer maps (``NeighborReader.max_staging_bytes``), from the
    longest list (``indptr`` read through a memory map: nothing per node is held)."""
    m = dataset.manifest
    longest = max_degree(np.load(dataset.file("indptr"), mmap_mode="r"))
    return staging_bound(longest, np.dtype(m.index_dtype.value).itemsize, m.files["indices.npy"].bytes)


def _takes_direct_writes(directory: Path) -> bool:
    """Whether staging files under ``directory`` take O_DIRECT writes (a directory that cannot be used is reported
    by the mode, with its name, when it opens)."""
    try:
        return takes_direct_writes(directory)
    except OSError:
        return False


def out_degree_ranking(dataset: Dataset, chunk: int = 1 << 23) -> np.ndarray:
    """Node ids by decreasing out-degree (ties to the lower id), counting ``indices.npy`` in chunks."""
    m = dataset.manifest
    indices = np.load(dataset.file("indices"), mmap_mode="r")
    degree = np.zeros(m.num_nodes, dtype=np.int64)
    for begin in range(0, len(indices), chunk):
        degree += np.bincount(indices[begin:begin + chunk], minlength=m.num_nodes)
    return np.argsort(-degree, kind="stable")


class OutOfCoreMode(FullGraphMode):
    """What the out-of-core modes share: the graph on disk (``DiskGraph``: the exact sampler over the neighbour
    cache, the row reader for missed rows, both checked), and the budget hooks ``plan_outofcore`` reads from the
    class (so a mode's plan is made, and refused, before anything is opened)."""

    scratch_bytes_per_node: ClassVar[int] = 8 + 4
    """Per-node scratch besides indptr: the sampler's two int32 maps and the planner's int32 map (exact) or the static
    cache's address table."""
    spills_superbatches: ClassVar[bool] = False
    """A superbatch in flight is per-batch tables in RAM, its ids and edges spilled and its rows staged on disk
    (``staged.py``), instead of its sampled pass in RAM."""
    bytes_per_sampled_node_beside: ClassVar[int] = 0
    """RAM per sampled node a superbatch in flight holds beside its sampled pass (where not spilled)."""
    lists_first: ClassVar[bool] = False
    """``"auto"`` caches: the neighbour cache takes every list it can before the feature cache gets anything (else
    at most half of what is left)."""
    resident_share: ClassVar[float] = 0.0
    """The share of the feature bytes that goes to the superbatches' whole partitions (loaded by a sequential pass),
    split between the ``SUPERBATCHES_IN_FLIGHT`` of them; the rest is the feature cache."""

    @classmethod
    def open(cls, setup: ModeSetup) -> Self:
        return cls(setup.serving, setup.dataset, cls.plan_budget(setup))

    @classmethod
    def plan_budget(cls, setup: ModeSetup) -> OutOfCoreBudget:
        batch = setup.pilot.train_or_zero
        return plan_outofcore(cls, setup.serving.config, setup.dataset, setup.fixed.total, batch.nodes, batch.edges)

    def __init__(self, serving: ServingContext, dataset: Dataset, plan: OutOfCoreBudget) -> None:
        super().__init__(serving)
        config = serving.config
        self.budget_plan: OutOfCoreBudget = plan
        self.superbatch = self.superbatch_for(config)
        self._metrics = serving.metrics
        self._row_bytes = dataset.manifest.row_bytes
        self.read_checks = load_read_checks(dataset, blocks=True) if config.io.check_reads else None
        self.disk = DiskGraph(dataset, config.io, serving.metrics, checks=self.read_checks,
                              neighbor_cache_bytes=plan.neighbor_cache_bytes, group_size=config.fullgraph.sample_group)
        self._metrics.neighbor_cache_bytes.set(self.disk.cache_bytes)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        """A training superbatch's pass (evaluation samples through ``eval_access``, its reads counted apart)."""
        return self.disk.sample(seeds, batch_size, fanouts, keys, purpose=TRAIN)

    def read_rows(self, ids: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        """Rows of dataset ids ``ids`` from disk into ``out[positions]`` for the training stream (a
        ``feature_cache.RowFetcher``)."""
        self.disk.read_rows(ids, positions, out, purpose=TRAIN)

    def load_rows(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Rows of dataset ids ``ids`` into ``out`` (a cache being filled at startup)."""
        self.disk.read_rows(ids, np.arange(len(ids), dtype=np.int64), out, purpose=STARTUP)

    def count_pass(self, stats: StagingStats, purpose: str) -> None:
        """A sequential pass over ``features.bin`` (staging, or a cache or partitions loaded) into the disk metrics."""
        self._metrics.read_meter("features", purpose).record_pass(stats)

    def read_by_pass(self, reader: SequentialReader, offsets: np.ndarray, out: np.ndarray, purpose: str
                     ) -> StagingStats:
        """The rows at ``offsets`` into ``out``, in that order, by ``reader``'s one sequential, checked pass (its
        time charged to the staging stage, its reads counted under ``purpose``); a disk error as one line."""
        started = time.perf_counter()
        try:
            stats = reader.read_rows(offsets, out, np.arange(len(offsets), dtype=np.int64))
        except OSError as err:  # the reader names the byte; one line, as read_rows says it
            raise UserError(f"{err.filename}: {err.strerror}; check the disk (dmesg) and run 'megabatch verify'"
                            ) from err
        finally:
            self._metrics.stage_busy.labels("staging").inc(time.perf_counter() - started)
        self.count_pass(stats, purpose)
        return stats

    def eval_rows(self) -> RowSource:
        """Rows for evaluation batches (never the training stream's cache plan, whose state is the stream's): read
        from disk, unless the mode has a cache that evaluation may share."""
        return DiskRows(self.disk, EVAL)

    def eval_access(self) -> EvalAccess:
        """Evaluation through the same sampler and row reads, counted as evaluation's."""
        return ModeEval(self.slot_source(self.eval_rows()), functools.partial(self.disk.sample, purpose=EVAL))

    def close(self) -> None:
        self.disk.close()
        if self.planner_pool is not None:
            self.planner_pool.shutdown()


class ExactMode(OutOfCoreMode):
    """Ginex: Belady-optimal feature cache from per-superbatch changesets."""

    name = "exact"

    def __init__(self, serving: ServingContext, dataset: Dataset, plan: OutOfCoreBudget) -> None:
        super().__init__(serving, dataset, plan)
        self.cache = FeatureCache.empty(plan.feature_cache_rows, serving.feat_dim, serving.feat_dtype)
        self.planner = CachePlanner(dataset.manifest.num_nodes, plan.feature_cache_rows)
        self._metrics.feature_cache_bytes.set(self.cache.rows.nbytes)

    def start_stream(self, stopped: threading.Event) -> RowsFor:
        self.cache.reset()
        return self.stream().rows_for

    def stream(self) -> "BeladyStream":
        """A new training stream's plans (the cache was just reset)."""
        return BeladyStream(self)


class BeladyStream:
    """One training stream's cache plans: each superbatch's starts from the state the previous one left."""

    def __init__(self, mode: ExactMode) -> None:
        self._mode = mode
        self._state = CacheState()

    def plan(self, trace_ptr: np.ndarray, trace_ids: np.ndarray) -> "BeladyRows":
        """The next superbatch's plan over the rows its batches take from the cache (``trace_ptr`` cuts
        ``trace_ids`` into batches), and the rows they are gathered by."""
        cache_plan = self._mode.planner.plan(trace_ptr, trace_ids, prior=self._state, prefetch=False)
        self._state = cache_plan.final_state
        return BeladyRows(self._mode, cache_plan)

    def rows_for(self, sampled: SampledBatches) -> RowSource:
        return self.plan(sampled.node_ptr, sampled.nodes)


class BeladyRows(RowSource):
    """A superbatch's rows: cache hits copied, misses read, the cache updated as ``cache_plan`` says."""

    fills_any_subset = False

    def __init__(self, mode: ExactMode, cache_plan: CachePlan) -> None:
        self._mode, self._plan = mode, cache_plan

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        mode, cache_plan = self._mode, self._plan
        lookups = mode.serving.metrics.feature_cache_lookups
        # batches of a superbatch are published in order, after the previous superbatch's last one,
        # so the cache is exactly in this plan's prior state when batch 0 arrives (the demand plan
        # reads nothing ahead; fill() only checks and adopts the plan)
        if b == 0:
            mode.cache.fill(cache_plan, mode.read_rows)
            lookups.labels("fill").inc(cache_plan.num_fill)
        mode.cache.gather(cache_plan, b, x, mode.read_rows)
        hits = int(np.count_nonzero(cache_plan.hit_slots(b) >= 0))
        lookups.labels("hit").inc(hits)
        lookups.labels("miss").inc(len(nodes) - hits)


class DegreeCache:
    """The ``capacity`` rows of highest out-degree (PaGraph's choice), read once at startup, never changed."""

    def __init__(self, mode: OutOfCoreMode, dataset: Dataset, capacity: int) -> None:
        m = dataset.manifest
        cached = np.sort(out_degree_ranking(dataset)[:capacity])
        # int32 like exact's planner scratch, so the modes get the same caches from the same budget
        self.slot_of = np.full(m.num_nodes, -1, dtype=np.int32 if capacity < 2**31 else np.int64)
        self.slot_of[cached] = np.arange(capacity, dtype=self.slot_of.dtype)
        self.rows = np.empty((capacity, m.feat_dim), dtype=mode.serving.feat_dtype)
        if capacity:
            mode.load_rows(cached, self.rows)
        self._words = row_words(self.rows)
        mode.serving.metrics.feature_cache_bytes.set(self.rows.nbytes)
        log.info("%s feature cache: %s rows of highest out-degree", mode.name, f"{capacity:,}")

    def copy_hits(self, nodes: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Copy the cached rows of ``nodes`` into their places in ``x``; the positions of the others."""
        slots = self.slot_of[nodes]
        hit = np.flatnonzero(slots >= 0)
        copy_rows(self._words, slots[hit], row_words(x), hit)
        return np.flatnonzero(slots < 0)


class StaticMode(OutOfCoreMode):
    """Ali+PG: the highest out-degree rows cached once (PaGraph), the Aligraph-style neighbour cache."""

    name = "static"

    def __init__(self, serving: ServingContext, dataset: Dataset, plan: OutOfCoreBudget) -> None:
        super().__init__(serving, dataset, plan)
        self.cache = DegreeCache(self, dataset, plan.feature_cache_rows)

    def fill(self, nodes: np.ndarray, x: np.ndarray, purpose: str) -> tuple[int, int]:
        """Rows of ``nodes`` into ``x``: hits copied from the cache, misses read for ``purpose``; (hits, misses)."""
        miss = self.cache.copy_hits(nodes, x)
        if miss.size:
            self.disk.read_rows(nodes[miss], miss, x, purpose=purpose)
        return len(nodes) - len(miss), len(miss)

    def start_stream(self, stopped: threading.Event) -> RowsFor:
        rows = _StaticRows(self, TRAIN)
        return lambda sampled: rows

    def eval_rows(self) -> RowSource:
        return _StaticRows(self, EVAL)


class _StaticRows(RowSource):
    """Rows from the static cache, misses read for ``purpose``; hits and misses go to the cache's metrics for
    training only, so the hit rate is the training stream's."""

    def __init__(self, mode: StaticMode, purpose: str) -> None:
        self._mode, self._purpose = mode, purpose
        self._counted = purpose == TRAIN

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        hits, misses = self._mode.fill(nodes, x, self._purpose)
        if self._counted:
            lookups = self._mode.serving.metrics.feature_cache_lookups
            lookups.labels("hit").inc(hits)
            lookups.labels("miss").inc(misses)
