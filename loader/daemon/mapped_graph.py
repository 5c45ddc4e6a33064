"""The full graph and the feature file as memory maps: the startup pilot's and mode ``mmap``'s training reads.

Maps cost nothing to open and the kernel's page cache is their only cache, which is what the pilot
sample at startup (``loader.daemon.slot_sizing``) and the ``mmap`` baseline (what PyG over
``np.memmap`` does) want. ``MADV_RANDOM`` keeps readahead from pulling in pages nobody asked for.
A mapped file that shrinks kills the process with SIGBUS at the first touch past its new end, so
no stream but mode ``mmap``'s training reads through these (docs/DEPLOY.md, "Security and failure
model"); evaluation reads through ``loader.daemon.disk_graph``.
"""

import contextlib
import mmap
from dataclasses import dataclass

import numpy as np

from loader.format.dataset import Dataset
from loader.format.npyio import NpyReader
from loader.format.partition_table import PartitionTable
from loader.sampling.sampling import CSCGraph

__all__ = ["MappedGraph", "map_graph"]


def _advise_random(array: np.ndarray) -> None:
    base = getattr(array, "_mmap", None)
    if isinstance(base, mmap.mmap):
        base.madvise(mmap.MADV_RANDOM)


@dataclass
class MappedGraph:
    """The full graph and the feature file, memory-mapped."""

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


def map_graph(dataset: Dataset, partitions: PartitionTable) -> MappedGraph:
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
    return MappedGraph(graph, features, partitions.node_begin, partitions.feat_offset, m.row_bytes)
