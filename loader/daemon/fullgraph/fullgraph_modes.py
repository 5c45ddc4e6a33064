"""The two simplest full-graph modes: everything in RAM ("inmemory") and memory maps ("mmap").

``inmemory`` is the upper bound: the CSC and the feature matrix are read into RAM at startup
(refused when they exceed the memory budget). ``mmap`` is what PyG or DGL over ``np.memmap``
do (Ginex's "PyG+" baseline): each mini-batch is sampled on its own over a memory-mapped CSC and
its rows are gathered from the memory-mapped feature file, with readahead disabled
(``MADV_RANDOM``) because readahead multiplies the bytes read for scattered rows. The kernel's
page cache is the only cache; under a cgroup memory limit it is charged to the daemon.
"""

import numpy as np

from loader.daemon.eval_stream import EvalAccess, EvalData, MemmapEval, open_eval_data
from loader.daemon.fullgraph.fullgraph import ModeEval, labelled_source
from loader.daemon.gather_kernels import row_offsets_for
from loader.daemon.publisher import SlotSource, gather_from
from loader.format.dataset import Dataset
from loader.format.partition_table import PartitionTable
from loader.sampling.inmemory import load_in_memory
from loader.sampling.sampling import CSCGraph, SampledPass, sample_pass
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["InMemoryMode", "MmapMode", "inmemory_bytes"]


def inmemory_bytes(dataset: Dataset) -> int:
    """Bytes ``InMemoryMode`` holds: indptr, indices and the dense feature matrix."""
    m = dataset.manifest
    index_itemsize = np.dtype(m.index_dtype.value).itemsize
    return 8 * (m.num_nodes + 1) + index_itemsize * m.num_edges + m.num_nodes * m.row_bytes


class InMemoryMode:
    """The whole graph in RAM; superbatches of ``superbatch`` batches."""

    name = "inmemory"

    def __init__(self, dataset: Dataset, labels: np.ndarray, superbatch: int, budget: int) -> None:
        need = inmemory_bytes(dataset)
        if need > budget:
            raise UserError(f"[loader] mode = \"inmemory\" holds the graph and features ({format_size(need)}) in RAM, "
                            f"more than [memory] budget {format_size(budget)}; raise the budget or use \"exact\"")
        data = load_in_memory(dataset)
        self.graph = data.graph
        self.features = data.features
        self.superbatch = superbatch
        self.nbytes = need
        m = dataset.manifest
        self._labels, self._dim, self._dtype, self._row_bytes = labels, m.feat_dim, np.dtype(m.feat_dtype.value), \
            m.row_bytes
        self._rows = self.features.reshape(-1).view(np.uint8)

    def describe(self) -> str:
        return f"memory plan (inmemory): graph and features {format_size(self.nbytes)} in RAM"

    def eval_access(self) -> EvalAccess:
        source, _ = self.plan_source()
        return ModeEval(source, self.sample)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self.graph, seeds, batch_size, fanouts, keys)

    def plan(self, sampled: SampledPass, state: object) -> tuple[SlotSource, object]:
        return self.plan_source()

    def plan_source(self) -> tuple[SlotSource, object]:
        row_bytes = self._row_bytes
        fill = gather_from(self._rows, lambda nodes: nodes * row_bytes, row_bytes)
        return labelled_source(fill, self._labels, self._dim, self._dtype, fills_any_subset=True), None

    def restart(self) -> object:
        return None

    def close(self) -> None:
        pass


class MmapMode:
    """Per-mini-batch sampling and gathering over memory maps (readahead off)."""

    name = "mmap"
    superbatch = 1
    """PyG+ samples each mini-batch on its own, just before it is trained on."""

    def __init__(self, dataset: Dataset, partitions: PartitionTable, labels: np.ndarray) -> None:
        self._data: EvalData = open_eval_data(dataset, partitions)
        self._dataset, self._partitions = dataset, partitions
        self.graph: CSCGraph = self._data.graph
        m = dataset.manifest
        self._labels, self._dim, self._dtype = labels, m.feat_dim, np.dtype(m.feat_dtype.value)

    def describe(self) -> str:
        return "memory plan (mmap): nothing cached by the daemon; the kernel's page cache holds what it reads"

    def eval_access(self) -> EvalAccess:
        return MemmapEval(self._dataset, self._partitions, self._labels)

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self.graph, seeds, batch_size, fanouts, keys)

    def plan(self, sampled: SampledPass, state: object) -> tuple[SlotSource, object]:
        d = self._data

        def offsets(nodes: np.ndarray) -> np.ndarray:
            return row_offsets_for(nodes, d.node_begin, d.feat_offset, d.row_bytes)

        fill = gather_from(d.features, offsets, d.row_bytes)
        return labelled_source(fill, self._labels, self._dim, self._dtype, fills_any_subset=True), None

    def restart(self) -> object:
        return None

    def close(self) -> None:
        self._data.close()
