"""The feature arena and the two mega-batch buffers (double buffering).

One anonymous, page-aligned mapping holds the static features once, then the feature regions
of buffer 0 and buffer 1 (each followed, with ``[sampler] aggregation_cache``, by its partitions'
aggregate rows), so O_DIRECT reads land in place and the gather kernel addresses any row (static or
dynamic, x or x_agg) with one byte offset into one array. Index arrays of a buffer are
allocated once too; nothing per mega-batch grows beyond what ``memplan`` charged.
"""

import contextlib
import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loader.daemon.hierarchical.memplan import PAGE, BufferSizes, round_up
from loader.daemon.resident import StaticCache

__all__ = ["MegaBatchBuffer", "FeatureArena"]


@dataclass
class MegaBatchBuffer:
    """One of the two buffers: where the reader puts a mega-batch and the assembler builds on it."""

    index: int
    """0 or 1 (for logs and metrics)."""
    feature_offset: int
    """Byte offset of this buffer's feature region in the arena (page aligned)."""
    feature_capacity: int
    raw_indices: np.ndarray
    """Edge lists as read (dataset ids, the file's index dtype)."""
    raw_indptr_scratch: np.ndarray
    """int64: the partitions' ``indptr`` slices as read (n_p + 1 entries each)."""
    aggregate_offset: int = 0
    """Byte offset of this buffer's aggregation cache region (its partitions' x_agg rows), after its features."""
    aggregate_capacity: int = 0
    """0 where batches carry no x_agg (or read it from disk)."""


class FeatureArena:
    """Owns the mapping; ``buffers`` are handed out and returned through the pipeline's free queue."""

    def __init__(self, static: StaticCache, row_bytes: int, sizes: BufferSizes, index_dtype: np.dtype,
                 fill_static_aggregates: Callable[[np.ndarray, np.ndarray], None] | None = None) -> None:
        """``fill_static_aggregates(ids, out)``: with the aggregation cache, writes the static nodes' aggregate
        rows into ``out`` ((S, D), in the arena after the static features)."""
        self.row_bytes = row_bytes
        static_rows = round_up(static.num_nodes * row_bytes)
        self.static_bytes = static_rows * (2 if fill_static_aggregates is not None else 1)
        features, aggregates = round_up(sizes.feature_bytes), round_up(sizes.aggregate_bytes)
        self.nbytes = self.static_bytes + 2 * (features + aggregates)
        self._map = mmap.mmap(-1, max(self.nbytes, PAGE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.data = np.frombuffer(self._map, dtype=np.uint8)
        """The whole arena as bytes: the gather kernel's source array."""
        if static.num_nodes:
            flat = np.ascontiguousarray(static.features).reshape(-1).view(np.uint8)
            self.data[:len(flat)] = flat
        self.static_row_offsets = np.arange(static.num_nodes, dtype=np.int64) * row_bytes
        self.static_aggregate_offsets: np.ndarray | None = None
        """Byte offset of each static node's aggregate row (after the static features); None without the cache."""
        if fill_static_aggregates is not None:
            self.static_aggregate_offsets = static_rows + self.static_row_offsets
            if static.num_nodes:
                rows = self.data[static_rows:static_rows + static.num_nodes * row_bytes]
                fill_static_aggregates(static.nodes, rows.view(static.features.dtype).reshape(static.num_nodes, -1))
        stride = features + aggregates
        self.buffers = [
            MegaBatchBuffer(i, self.static_bytes + i * stride, features,
                            np.empty(sizes.max_raw_edges, dtype=index_dtype),
                            np.empty(sizes.max_nodes + sizes.partitions, dtype=np.int64),
                            self.static_bytes + i * stride + features, aggregates)
            for i in range(2)]

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Writable bytes of the arena (the destination of a feature read)."""
        return memoryview(self._map)[offset:offset + nbytes]

    def close(self) -> None:
        del self.data
        self.buffers.clear()
        # a view may still be exported (a batch being written); the mapping then goes with the last view
        with contextlib.suppress(BufferError):
            self._map.close()
