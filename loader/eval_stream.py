"""Evaluation over the full graph through memory maps (the exact mode will replace this path).

Validation and test batches must see every neighbour a node has, not just a mega-batch's, so
they are sampled on the whole CSC. The maps are opened per evaluation stream and dropped when
it ends, so their pages stop counting toward the daemon's resident memory between evaluations;
``MADV_RANDOM`` keeps readahead from pulling in pages nobody asked for.
"""

import contextlib
import mmap
from dataclasses import dataclass

import numpy as np

from loader.dataset import Dataset
from loader.npyio import NpyReader
from loader.sampling import CSCGraph

__all__ = ["EvalData", "open_eval_data"]


def _advise_random(array: np.ndarray) -> None:
    base = getattr(array, "_mmap", None)
    if isinstance(base, mmap.mmap):
        base.madvise(mmap.MADV_RANDOM)


@dataclass
class EvalData:
    """The full graph and the feature file, memory-mapped for one evaluation stream."""

    graph: CSCGraph
    features: np.ndarray
    """uint8 view of ``features.bin``."""
    node_begin: np.ndarray
    feat_offset: np.ndarray
    row_bytes: int

    def close(self) -> None:
        for array in (self.graph.indptr, self.graph.indices, self.features):
            base = getattr(array, "_mmap", None)
            if isinstance(base, mmap.mmap):
                # still viewed by a batch being written: it is unmapped when that view goes
                with contextlib.suppress(BufferError):
                    base.close()


def open_eval_data(dataset: Dataset, partitions: np.ndarray) -> EvalData:
    m = dataset.manifest
    arrays = []
    for name, dtype in (("indptr", np.dtype(np.int64)), ("indices", np.dtype(m.index_dtype.value))):
        with NpyReader(dataset.file(name), expect_dtype=dtype, expect_ndim=1) as reader:
            offset, shape = reader.data_offset, reader.shape
        arrays.append(np.memmap(dataset.file(name), dtype=dtype, mode="r", offset=offset, shape=shape))
    features = np.memmap(dataset.file("features"), dtype=np.uint8, mode="r")
    for array in (*arrays, features):
        _advise_random(array)
    graph = CSCGraph(indptr=arrays[0], indices=arrays[1], global_ids=np.arange(m.num_nodes, dtype=np.int64))
    return EvalData(graph, features, np.ascontiguousarray(partitions[:, 0]), np.ascontiguousarray(partitions[:, 4]),
                    m.row_bytes)
