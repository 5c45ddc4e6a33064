"""Mode "staged": the exact mode's batches, each superbatch's rows staged by one sequential pass over ``features.bin``.

The mode is described with the other out-of-core modes (``loader.daemon.fullgraph.outofcore``, whose
``plan_outofcore`` also splits its budget) and in docs/CONFIG.md; the staging itself is ``loader.staging``.
"""

import bisect
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from loader.daemon.fullgraph.fullgraph import SUPERBATCHES_IN_FLIGHT, RowsFor
from loader.daemon.fullgraph.outofcore import STAGING_FLUSH, DegreeCache, OutOfCoreBudget, OutOfCoreMode
from loader.daemon.read_metrics import STARTUP, TRAIN
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import RowSource
from loader.format.dataset import Dataset
from loader.sampling.ranks import Pieces, sample_pieces_with
from loader.sampling.sampling import SampledBatches, SampledPass
from loader.staging.scratch_files import ScratchFiles
from loader.staging.sequential_reader import PassStopped
from loader.staging.spilled_pass import SpilledPass, SpillFile, concat_spilled, id_dtype
from loader.staging.stager import StagedWindow, WindowStager
from loader.staging.window_plan import PLAN_SLICE_ROWS, WindowPlan, batch_gather, plan_window
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["StagedMode", "STAGED_SUPERBATCH"]

log = logging.getLogger("megabatch.outofcore")

STAGED_SUPERBATCH = 512
"""``[fullgraph] superbatch`` when unset in this mode: its pass over the feature file is shared by more batches the
longer it is, and since its plan is charged for 256 batches' rows at most (``STAGED_PLAN_BATCHES``), a superbatch
of 512 costs the feature cache nothing where its uncached rows fit that. On bench/compare's 1M-node graph at 448M,
256 had run 47.9 batches/s against 45.6 at 128 and 46.8 at 512 when the plan was charged for every row of the
superbatch (29k rows of cache lost at 512); docs/PERFORMANCE.md."""


class StagedMode(OutOfCoreMode):
    """The exact mode's batches, each superbatch's rows staged by one sequential pass (``loader.staging``), its
    sampled structure spilled beside them so that RAM holds 4 B per row of a superbatch in flight."""

    name = "staged"
    default_superbatch = STAGED_SUPERBATCH
    spills_superbatches = True
    lists_first = True
    """A cached row saves three sequential transfers of its bytes, a cached list one random read."""

    def __init__(self, serving: ServingContext, dataset: Dataset, plan: OutOfCoreBudget) -> None:
        super().__init__(serving, dataset, plan)
        config = serving.config
        m = dataset.manifest
        where = config.fullgraph.staging_dir
        if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
            self.close()
            raise UserError(f"[fullgraph] staging_dir: {where} is not a writable directory")
        checks = self.read_checks
        self.stager = WindowStager(dataset.file("features"), row_bytes=m.row_bytes, staging_dir=where,
                                   block_sums=None if checks is None else checks.feature_blocks,
                                   check_block=m.feature_check_bytes, direct=config.io.direct_io,
                                   direct_scratch=True,
                                   chunk_bytes=plan.staging_chunk, scatter_bytes=plan.staging_chunk,
                                   flush_bytes=STAGING_FLUSH)
        self._ids = id_dtype(m.num_nodes)
        # spill files are rewritten by later superbatches, as staging files are (ScratchFiles); both are O_DIRECT
        # wherever their filesystem takes it, whatever [io] direct_io says of the dataset's files: written once
        # and read once, through the page cache they cost flushes, drops and cgroup reclaim and save nothing
        self.spill_files = ScratchFiles(where, direct_reads=True, direct_writes=True, keep=SUPERBATCHES_IN_FLIGHT + 1)
        self.spill_reader = ThreadPoolExecutor(1, thread_name_prefix="megabatch-spill-read")
        # the staging pass waits on the disk most of its time (reads, writes): on a pool thread of the two it
        # left the publisher waiting for a thread (measured: publisher 53 ms a batch, 7 of them reading)
        self.planner_pool = ThreadPoolExecutor(1, thread_name_prefix="megabatch-stage")
        self.cache = DegreeCache(self, dataset, plan.feature_cache_rows)
        log.info("staged superbatches of %d batches in %s", self.superbatch, where)

    def sample_superbatch(self, order: np.ndarray, pieces: Pieces, batch_size: int, keys: np.ndarray,
                          fanouts: tuple[int, ...]) -> SpilledPass:
        """Sample the superbatch one sample group at a time, each group's edges spilled as it is sampled: the
        whole superbatch is never in RAM, only its ids (a ``SpilledPass``, which the later stages read as they
        read a ``SampledPass``: both are ``SampledBatches``)."""
        config = self.serving.config
        spill = SpillFile(config.fullgraph.staging_dir, files=self.spill_files,
                          reader=self.spill_reader)
        group = config.fullgraph.sample_group

        def spilled(parts: list[SpilledPass | SampledPass]) -> SpilledPass:
            try:
                return concat_spilled(parts, spill, self._ids)
            except OSError as err:  # the sampler's own read failures are reported by the sampler, not here
                raise UserError(f"spilling sampled batches in {config.fullgraph.staging_dir}: {err.strerror or err} "
                                f"(is the disk full?)") from err

        def sample(seeds: np.ndarray, size: int, piece_keys: np.ndarray) -> SpilledPass:
            return spilled([spilled([self.sample(seeds[g * size:(g + group) * size], size, fanouts,
                                                 piece_keys[g:g + group])])
                            for g in range(0, len(piece_keys), group)])

        try:
            sampled = sample_pieces_with(sample, order, pieces, batch_size, keys, len(fanouts), spilled)
            if not isinstance(sampled, SpilledPass):
                sampled = spilled([sampled])
        except BaseException:
            spill.close()
            raise
        self._metrics.staging_written_bytes.labels("edges").inc(spill.bytes_written)
        self._metrics.staging_file_bytes.labels("edges").set(self.spill_files.held_bytes)
        return sampled

    def stage(self, sampled: SampledBatches, stopped: threading.Event | None = None) -> RowSource:
        """Stage one superbatch's rows the cache does not hold (the planner stage's work), in one window where they
        fit the plan's charge, else in several; its batches are then read back in order. Raises ``PassStopped``
        within a chunk of ``stopped`` being set (its stream stopped), its staging and spill files given back."""
        started = time.perf_counter()
        # the ids come back from the spill file a slice at a time, never all at once
        ids_of = sampled.node_ids
        node_ptr = sampled.node_ptr
        windows: list[tuple[int, StagedWindow]] = []
        try:
            bounds, misses = self._window_bounds(node_ptr, ids_of)
            for b0, b1 in zip(bounds, bounds[1:]):
                if stopped is not None and stopped.is_set():  # a window's plan reads its ids back: not for nothing
                    raise PassStopped(f"staging stopped before batch {b0} of {len(node_ptr) - 1}")
                base = int(node_ptr[b0])

                def offsets_of(begin: int, end: int, base: int = base) -> np.ndarray:
                    return self._staged_offsets(ids_of(base + begin, base + end))

                plan = plan_window(node_ptr[b0:b1 + 1] - base, offsets_of, self._row_bytes, self.stager.chunk_bytes,
                                   sequential_rate=self.serving.config.io.sequential_rate,
                                   random_reads=self.serving.config.io.random_reads,
                                   max_rows=None if misses is None else int(misses[b0:b1].sum()))
                windows.append((b0, self._stage_window(plan, stopped)))
                # the staged window keeps its plan without the keys; the next window's keys must not meet these
                del plan
        except BaseException:
            for _, staged in windows:
                staged.close()
            if isinstance(sampled, SpilledPass):  # never published: nothing else gives its spill file back
                sampled.close()
            raise
        finally:
            self._metrics.stage_busy.labels("staging").inc(time.perf_counter() - started)
        for _, staged in windows:
            self.count_pass(staged.stats, TRAIN)
            self._metrics.staging_written_bytes.labels("rows").inc(staged.stats.staged_bytes)
        self._metrics.staging_file_bytes.labels("rows").set(self.stager.staging_file_bytes)
        spill = sampled.spill if isinstance(sampled, SpilledPass) else None
        return _StagedRows(self, windows, len(node_ptr) - 1, spill)

    def _window_bounds(self, node_ptr: np.ndarray, ids_of: Callable[[int, int], np.ndarray]
                       ) -> tuple[list[int], np.ndarray | None]:
        """(where the staging windows of a superbatch start, and its end; each batch's uncached rows, or None): one
        window where all its rows fit the plan's ``plan_rows``, else as many consecutive batches per window as their
        uncached rows fit (at least one), counted by one more pass over the ids."""
        count, total, capacity = len(node_ptr) - 1, int(node_ptr[-1]), self.budget_plan.plan_rows
        if total <= capacity:
            return [0, count], None
        misses = np.zeros(count, dtype=np.int64)
        for begin in range(0, total, PLAN_SLICE_ROWS):
            end = min(total, begin + PLAN_SLICE_ROWS)
            missed = np.flatnonzero(self.cache.slot_of[ids_of(begin, end)] < 0) + begin
            misses += np.bincount(np.searchsorted(node_ptr, missed, side="right") - 1, minlength=count)
        through = np.cumsum(misses)  # the uncached rows of batches 0..b
        bounds = [0]
        while bounds[-1] < count:
            b0 = bounds[-1]
            before = int(through[b0 - 1]) if b0 else 0
            bounds.append(max(b0 + 1, int(np.searchsorted(through, before + capacity, side="right"))))
        return bounds, misses

    def _stage_window(self, plan: WindowPlan, stopped: threading.Event | None) -> StagedWindow:
        try:
            return self.stager.stage(plan, stopped)
        except OSError as err:
            if err.filename == str(self.stager.path):  # the stager names the byte; one line, as read_rows says it
                raise UserError(f"{err.filename}: {err.strerror}; check the disk (dmesg) and run 'megabatch verify'"
                                ) from err
            raise UserError(f"staging in {self.stager.staging_dir}: {err.strerror or err} (is the disk full? "
                            f"a window stages {format_size(plan.staging_bytes)})") from err

    def _staged_offsets(self, ids: np.ndarray) -> np.ndarray:
        """Each node's row's byte offset in ``features.bin``, or -1 where the cache holds it (the planner asks for
        a slice of the superbatch at a time)."""
        offsets = np.full(len(ids), -1, dtype=np.int64)
        at = np.flatnonzero(self.cache.slot_of[ids] < 0)
        offsets[at] = self.row_offsets(ids[at])
        return offsets

    def row_offsets(self, ids: np.ndarray) -> np.ndarray:
        return self.disk.row_offsets(ids)

    def load_rows(self, ids: np.ndarray, out: np.ndarray) -> None:
        """The feature cache's rows at startup: one sequential pass over the chunks holding them where that costs
        less than a random read per page (by ``[io] sequential_rate`` and ``random_reads``), else as ``exact``
        reads its misses. Measured on bench/compare's 1M-node graph: 160k rows of highest out-degree (16% of
        the rows, in every chunk) took 9.1 s of row reads at startup."""
        offsets = self.row_offsets(ids)
        io, chunk = self.serving.config.io, self.stager.chunk_bytes
        passed = len(np.unique(offsets // chunk)) * chunk / io.sequential_rate
        pages = len(ids) * -(-self._row_bytes // 4096)
        if passed >= pages / io.random_reads:
            super().load_rows(ids, out)
            return
        stats = self.read_by_pass(self.stager.reader, offsets, out, STARTUP)
        log.info("staged feature cache loaded by one pass over %d chunks (%s)", stats.chunks,
                 format_size(stats.file_bytes_read))

    def start_stream(self, stopped: threading.Event) -> RowsFor:
        return lambda sampled: self.stage(sampled, stopped)

    def close(self) -> None:
        super().close()
        stager = getattr(self, "stager", None)
        if stager is not None:
            stager.close()
        spill_files = getattr(self, "spill_files", None)
        if spill_files is not None:
            spill_files.close()
            self.spill_reader.shutdown()


class _StagedRows(RowSource):
    """A staged superbatch's rows: batch b's cached rows copied, its region in its window read back, rows of chunks
    not worth the pass read at random; each window's staging file goes back after its last batch, the spill file
    after the superbatch's."""

    fills_any_subset = False

    def __init__(self, mode: StagedMode, windows: list[tuple[int, StagedWindow]], num_batches: int,
                 spill: SpillFile | None) -> None:
        self._mode, self._windows, self._spill = mode, windows, spill
        self._starts = [b0 for b0, _ in windows]
        self._num_batches = num_batches
        self._read_back = mode.serving.metrics.read_meter("staging", TRAIN)

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        mode = self._mode
        b0, staged = self._windows[bisect.bisect_right(self._starts, b) - 1]
        local = b - b0
        miss = mode.cache.copy_hits(nodes, x)
        lookups = mode.serving.metrics.feature_cache_lookups
        lookups.labels("hit").inc(len(nodes) - len(miss))
        lookups.labels("miss").inc(len(miss))
        offsets = mode.row_offsets(nodes[miss])
        on_pass = staged.plan.is_staged(offsets)
        if not on_pass.all():
            direct = miss[~on_pass]
            mode.read_rows(nodes[direct], direct, x)
        started = time.perf_counter()
        try:
            pieces = mode.stager.read_batch(staged, local, batch_gather(offsets[on_pass]), x, miss[on_pass])
        except OSError as err:
            raise UserError(f"reading back batch {b} staged in {mode.stager.staging_dir}: {err.strerror or err}; "
                            f"check the disk (dmesg)") from err
        finally:
            mode.serving.metrics.stage_busy.labels("rows").inc(time.perf_counter() - started)
        # each piece of the region one read request, and the spilled records read since the last batch (this batch's
        # ids and edges, which the publisher read just before its rows, and the read ahead) one each
        self._read_back.observe(pieces)
        self._read_back.count(staged.plan.region(local)[1], len(pieces))
        if self._spill is not None:
            spilled, seconds = self._spill.take_reads()
            self._read_back.observe(seconds)
            self._read_back.count(spilled, len(seconds))
        if local == staged.plan.num_batches - 1:
            staged.close()
        if b == self._num_batches - 1 and self._spill is not None:  # the publisher read its edges before its rows
            self._spill.close()
