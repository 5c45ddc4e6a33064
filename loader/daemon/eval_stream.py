"""Evaluation batches over the full graph, and where they read from (``EvalAccess``).

Validation and test batches must see every neighbour a node has, not just a mega-batch's, so
they are sampled on the whole graph. Each daemon mode says how (``EvalAccess``): the
hierarchical and mmap modes through memory maps of the CSC and the feature file (``MemmapEval``,
opened per evaluation stream and dropped when it ends, so their pages stop counting toward the
daemon's resident memory between evaluations; ``MADV_RANDOM`` keeps readahead from pulling in
pages nobody asked for), the in-memory mode from RAM, the exact and static modes through their
neighbour cache, disk reads and (static) feature cache, so an evaluation stays inside their budget.
"""

import contextlib
import mmap
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from loader.daemon.slot_source import FileRows, SlotSource
from loader.format.dataset import Dataset
from loader.format.npyio import NpyReader
from loader.format.partition_table import PartitionTable
from loader.sampling.sampling import CSCGraph, SampledPass, sample_pass

__all__ = ["EvalData", "open_eval_data", "EvalAccess", "MemmapEval"]


class EvalAccess(Protocol):
    """How one evaluation stream samples its batches and fills their rows (dataset ids as local ids)."""

    source: SlotSource

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        ...

    def close(self) -> None:
        ...


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


def open_eval_data(dataset: Dataset, partitions: PartitionTable) -> EvalData:
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
    return EvalData(graph, features, partitions.node_begin, partitions.feat_offset, m.row_bytes)


class MemmapEval:
    """``EvalAccess`` through memory maps of the CSC and ``features.bin`` (opened now, dropped by ``close``)."""

    def __init__(self, dataset: Dataset, partitions: PartitionTable, labels: np.ndarray) -> None:
        m = dataset.manifest
        data = open_eval_data(dataset, partitions)
        self._data = data
        self.source = SlotSource(FileRows(data.features, data.row_bytes, data.node_begin, data.feat_offset), labels,
                                 None, m.feat_dim, np.dtype(m.feat_dtype.value))

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return sample_pass(self._data.graph, seeds, batch_size, fanouts, keys)

    def close(self) -> None:
        self._data.close()
