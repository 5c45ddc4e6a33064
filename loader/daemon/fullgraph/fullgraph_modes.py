"""The two simplest full-graph modes: everything in RAM ("inmemory") and memory maps ("mmap").

``inmemory`` is the upper bound: the CSC and the feature matrix are read into RAM at startup
(refused when they exceed the memory budget). ``mmap`` is what PyG or DGL over ``np.memmap``
do (Ginex's "PyG+" baseline): each mini-batch is sampled on its own over a memory-mapped CSC and
its rows are gathered from the memory-mapped feature file, with readahead disabled
(``MADV_RANDOM``) because readahead multiplies the bytes read for scattered rows. The kernel's
page cache is the only cache; under a cgroup memory limit it is charged to the daemon.

Those training reads are the one place the daemon maps the dataset after startup: they are
unchecked, and a file that shrinks under the daemon kills it with SIGBUS (it says so at startup).
Its evaluation goes through a checked ``DiskGraph`` like the hierarchical mode's, opened at the
first evaluation so that a run that never evaluates (bench/compare) holds exactly what PyG+ holds.
"""

import logging
import threading
from dataclasses import dataclass

import numpy as np

from loader.daemon.budget_plan import BudgetPlan, budget_too_small
from loader.daemon.disk_graph import DiskGraph, eval_graph_bytes
from loader.daemon.eval_stream import EvalAccess, ModeEval
from loader.daemon.fullgraph.fullgraph import FullGraphMode, RowsFor
from loader.daemon.mapped_graph import MappedGraph, map_graph
from loader.daemon.mode import ModeSetup
from loader.daemon.read_metrics import EVAL
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import DenseRows, FileRows, RowSource
from loader.format.dataset import Dataset
from loader.format.partition_table import PartitionTable
from loader.format.read_checks import load_read_checks
from loader.sampling.inmemory import load_in_memory
from loader.sampling.sampling import CSCGraph, SampledPass, sample_pass
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["InMemoryMode", "MmapMode", "HeldBudget", "inmemory_bytes"]

log = logging.getLogger("megabatch.mmap")


def inmemory_bytes(dataset: Dataset) -> int:
    """Bytes ``InMemoryMode`` holds: indptr, indices and the dense feature matrix."""
    m = dataset.manifest
    index_itemsize = np.dtype(m.index_dtype.value).itemsize
    return 8 * (m.num_nodes + 1) + index_itemsize * m.num_edges + m.num_nodes * m.row_bytes


@dataclass(frozen=True)
class HeldBudget(BudgetPlan):
    """The budget of a mode that holds one thing besides node arrays and slots (or nothing)."""

    mode: str
    fixed_bytes: int
    """Node arrays and slots."""
    held_bytes: int
    held: str
    """What ``held_bytes`` is, for ``describe``."""

    @property
    def total(self) -> int:
        return self.fixed_bytes + self.held_bytes

    def describe(self) -> str:
        return f"memory plan ({self.mode}): {self.held}"


class InMemoryMode(FullGraphMode):
    """The whole graph in RAM; superbatches of ``[fullgraph] superbatch`` batches."""

    name = "inmemory"

    @classmethod
    def open(cls, setup: ModeSetup) -> "InMemoryMode":
        return cls(setup.serving, setup.dataset, cls.plan_budget(setup))

    @classmethod
    def plan_budget(cls, setup: ModeSetup) -> HeldBudget:
        fixed, need, budget = setup.fixed, inmemory_bytes(setup.dataset), setup.serving.config.memory.budget
        if fixed.total + need > budget:
            raise budget_too_small(budget, cls.name, [*fixed.parts(), ("graph and features", need)],
                                   "use an out-of-core mode, which holds neither")
        return HeldBudget(cls.name, fixed.total, need, f"graph and features {format_size(need)} in RAM")

    def __init__(self, serving: ServingContext, dataset: Dataset, plan: HeldBudget) -> None:
        super().__init__(serving)
        data = load_in_memory(dataset)
        self.graph = data.graph
        self.features = data.dense_features()
        self.superbatch = self.superbatch_for(serving.config)
        self.budget_plan = plan
        self.rows: RowSource = DenseRows(self.features.reshape(-1).view(np.uint8), dataset.manifest.row_bytes)

    def eval_access(self) -> EvalAccess:
        return ModeEval(self.slot_source(self.rows), self.sample)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self.graph, seeds, batch_size, fanouts, keys)

    def start_stream(self, stopped: threading.Event) -> RowsFor:
        return lambda sampled: self.rows

    def close(self) -> None:
        pass


class MmapMode(FullGraphMode):
    """Per-mini-batch sampling and gathering over memory maps (readahead off); evaluation through checked reads."""

    name = "mmap"
    superbatch = 1
    """PyG+ samples each mini-batch on its own, just before it is trained on."""

    @classmethod
    def open(cls, setup: ModeSetup) -> "MmapMode":
        return cls(setup.serving, setup.dataset, setup.resident.partitions, cls.plan_budget(setup))

    @classmethod
    def plan_budget(cls, setup: ModeSetup) -> HeldBudget:
        config, dataset, fixed, eval_batch = setup.serving.config, setup.dataset, setup.fixed, setup.pilot.eval
        if config.io.check_reads and dataset.manifest.has_read_checks:
            # a mapped row cannot be checked without hashing its whole check block (a read of the block per
            # row: no baseline), and a mapped file that shrinks kills the process: the mode runs only where
            # the operator has turned the daemon's promises off, knowingly
            raise UserError("[loader] mode = \"mmap\" reads training batches through unchecked memory maps (the "
                            "PyG-over-np.memmap baseline): set [io] check_reads = false to run it, knowing that a "
                            "changed byte is then served and a file that shrinks under the daemon kills it")
        eval_bytes = eval_graph_bytes(dataset, config.io, 0 if eval_batch is None else eval_batch.nodes,
                                      config.sampler.sampled_eval_fanouts)
        if fixed.total + eval_bytes > config.memory.budget:
            raise budget_too_small(config.memory.budget, cls.name,
                                   [*fixed.parts(), ("evaluation reads (indptr, read checks, buffers)", eval_bytes)],
                                   "lower [sampler] eval_batch_size, [publisher] slots or [server] max_clients")
        return HeldBudget(cls.name, fixed.total, eval_bytes,
                          f"evaluation reads (indptr, read checks, buffers) {format_size(eval_bytes)} from the first "
                          f"evaluation; the kernel's page cache holds what training reads")

    def __init__(self, serving: ServingContext, dataset: Dataset, partitions: PartitionTable, plan: HeldBudget) -> None:
        super().__init__(serving)
        self._data: MappedGraph = map_graph(dataset, partitions)
        self._dataset = dataset
        self.graph: CSCGraph = self._data.graph
        self.budget_plan = plan
        d = self._data
        self.rows: RowSource = FileRows(d.features, d.row_bytes, d.node_begin, d.feat_offset)
        self._eval_graph: DiskGraph | None = None
        self._eval_lock = threading.Lock()
        log.warning("mode mmap: training batches are read through memory maps of %s, unchecked: a changed byte "
                    "is served, and a file that shrinks under the daemon kills it (SIGBUS); a baseline, use another "
                    "mode in production", dataset.path)

    def eval_graph(self) -> DiskGraph:
        """The evaluation reader, opened by the first evaluation (on a pool thread: it reads indptr and the read
        checks' block tables, which the event loop must not wait for)."""
        with self._eval_lock:
            if self._eval_graph is None:
                io = self.serving.config.io
                checks = load_read_checks(self._dataset, blocks=True) if io.check_reads else None
                self._eval_graph = DiskGraph(self._dataset, io, self.serving.metrics, checks=checks,
                                             count_cache=False)
            return self._eval_graph

    def eval_access(self) -> EvalAccess:
        return ModeEval(self.slot_source(_EvalRows(self)), self._eval_sample)

    def _eval_sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray
                     ) -> SampledPass:
        return self.eval_graph().sample(seeds, batch_size, fanouts, keys, purpose=EVAL)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self.graph, seeds, batch_size, fanouts, keys)

    def start_stream(self, stopped: threading.Event) -> RowsFor:
        return lambda sampled: self.rows

    def close(self) -> None:
        self._data.close()
        with self._eval_lock:
            if self._eval_graph is not None:
                self._eval_graph.close()


class _EvalRows(RowSource):
    """Every evaluation row read by the mode's evaluation reader (a batch is sampled, so it is open, first)."""

    def __init__(self, mode: MmapMode) -> None:
        self._mode = mode

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        self._mode.eval_graph().read_rows(nodes, np.arange(len(nodes), dtype=np.int64), x, purpose=EVAL)
