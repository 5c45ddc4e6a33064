"""The two simplest full-graph modes: everything in RAM ("inmemory") and memory maps ("mmap").

``inmemory`` is the upper bound: the CSC and the feature matrix are read into RAM at startup
(refused when they exceed the memory budget). ``mmap`` is what PyG or DGL over ``np.memmap``
do (Ginex's "PyG+" baseline): each mini-batch is sampled on its own over a memory-mapped CSC and
its rows are gathered from the memory-mapped feature file, with readahead disabled
(``MADV_RANDOM``) because readahead multiplies the bytes read for scattered rows. The kernel's
page cache is the only cache; under a cgroup memory limit it is charged to the daemon.
"""

from dataclasses import dataclass

import numpy as np

from loader.daemon.budget_plan import BudgetPlan
from loader.daemon.eval_stream import EvalAccess, EvalData, MemmapEval, open_eval_data
from loader.daemon.fullgraph.fullgraph import FullGraphMode, ModeEval, RowsFor
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import DenseRows, FileRows, RowSource
from loader.format.dataset import Dataset
from loader.format.partition_table import PartitionTable
from loader.sampling.inmemory import load_in_memory
from loader.sampling.sampling import CSCGraph, SampledPass, sample_pass
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["InMemoryMode", "MmapMode", "HeldBudget", "inmemory_bytes"]


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
    """The whole graph in RAM; superbatches of ``[exact] superbatch`` batches."""

    name = "inmemory"

    def __init__(self, serving: ServingContext, dataset: Dataset, fixed_bytes: int) -> None:
        super().__init__(serving)
        need = inmemory_bytes(dataset)
        budget = serving.config.memory.budget - fixed_bytes
        if need > budget:
            raise UserError(f"[loader] mode = \"inmemory\" holds the graph and features ({format_size(need)}) in RAM, "
                            f"more than [memory] budget {format_size(budget)}; raise the budget or use \"exact\"")
        data = load_in_memory(dataset)
        self.graph = data.graph
        self.features = data.features
        self.superbatch = serving.config.exact.superbatch
        self.budget_plan = HeldBudget(self.name, fixed_bytes, need,
                                    f"graph and features {format_size(need)} in RAM")
        self.rows: RowSource = DenseRows(self.features.reshape(-1).view(np.uint8), dataset.manifest.row_bytes)

    def eval_access(self) -> EvalAccess:
        return ModeEval(self.slot_source(self.rows), self.sample)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self.graph, seeds, batch_size, fanouts, keys)

    def start_stream(self) -> RowsFor:
        return lambda sampled: self.rows

    def close(self) -> None:
        pass


class MmapMode(FullGraphMode):
    """Per-mini-batch sampling and gathering over memory maps (readahead off)."""

    name = "mmap"
    superbatch = 1
    """PyG+ samples each mini-batch on its own, just before it is trained on."""

    def __init__(self, serving: ServingContext, dataset: Dataset, partitions: PartitionTable, fixed_bytes: int
                 ) -> None:
        super().__init__(serving)
        self._data: EvalData = open_eval_data(dataset, partitions)
        self._dataset, self._partitions = dataset, partitions
        self.graph: CSCGraph = self._data.graph
        self.budget_plan = HeldBudget(self.name, fixed_bytes, 0, "nothing cached by the daemon; the kernel's page "
                                                               "cache holds what it reads")
        d = self._data
        self.rows: RowSource = FileRows(d.features, d.row_bytes, d.node_begin, d.feat_offset)

    def eval_access(self) -> EvalAccess:
        return MemmapEval(self._dataset, self._partitions, self.serving.labels)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self.graph, seeds, batch_size, fanouts, keys)

    def start_stream(self) -> RowsFor:
        return lambda sampled: self.rows

    def close(self) -> None:
        self._data.close()
