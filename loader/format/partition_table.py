"""``partitions.npy`` by column name: what each partition holds and where it lies in the files.

The file is an int64 (P, 6) array (docs/FORMAT.md); code that indexed it by column number read
``parts[:, 4]`` where it meant the feature offsets. ``PartitionTable`` names the columns, derives
the sizes every caller recomputed, and keeps the raw array for kernels and files.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

__all__ = ["FEATURE_ALIGNMENT", "PARTITION_COLUMNS", "PartitionRow", "PartitionTable", "row_offsets_for"]

PARTITION_COLUMNS = ("node_begin", "node_end", "edge_begin", "edge_end", "feat_offset", "feat_nbytes")
"""Columns of ``partitions.npy`` (int64, shape (P, 6))."""

FEATURE_ALIGNMENT = 4096
"""Byte alignment of each partition's first feature row (one page; O_DIRECT-friendly): each feature
range starts on it and is zero-padded up to the next (docs/FORMAT.md)."""


@dataclass(frozen=True)
class PartitionRow:
    """One partition: nodes ``[node_begin, node_end)``, in-edges ``[edge_begin, edge_end)`` of
    ``indices.npy``, and ``feat_nbytes`` bytes of rows at ``feat_offset`` of ``features.bin``."""

    node_begin: int
    node_end: int
    edge_begin: int
    edge_end: int
    feat_offset: int
    feat_nbytes: int

    @property
    def feat_padded(self) -> int:
        """The feature range rounded up to whole pages (rows plus the zero padding after them)."""
        return -(-self.feat_nbytes // FEATURE_ALIGNMENT) * FEATURE_ALIGNMENT


@dataclass(frozen=True)
class PartitionTable:
    """The (P, 6) partition table with named columns (each a contiguous int64 array)."""

    array: np.ndarray
    """int64 (P, 6), columns ``PARTITION_COLUMNS``: what ``partitions.npy`` holds."""

    def __post_init__(self) -> None:
        table = np.ascontiguousarray(self.array, dtype=np.int64)
        if table.ndim != 2 or table.shape[1] != len(PARTITION_COLUMNS):
            raise ValueError(f"a partition table is (P, {len(PARTITION_COLUMNS)}), got shape {table.shape}")
        object.__setattr__(self, "array", table)

    def __len__(self) -> int:
        return len(self.array)

    def _column(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self.array[:, PARTITION_COLUMNS.index(name)])

    @cached_property
    def node_begin(self) -> np.ndarray:
        return self._column("node_begin")

    @cached_property
    def node_end(self) -> np.ndarray:
        return self._column("node_end")

    @cached_property
    def edge_begin(self) -> np.ndarray:
        return self._column("edge_begin")

    @cached_property
    def edge_end(self) -> np.ndarray:
        return self._column("edge_end")

    @cached_property
    def feat_offset(self) -> np.ndarray:
        return self._column("feat_offset")

    @cached_property
    def feat_nbytes(self) -> np.ndarray:
        return self._column("feat_nbytes")

    @property
    def num_nodes(self) -> np.ndarray:
        """Nodes per partition."""
        return self.node_end - self.node_begin

    @property
    def num_edges(self) -> np.ndarray:
        """In-edges per partition."""
        return self.edge_end - self.edge_begin

    @property
    def feat_padded(self) -> np.ndarray:
        """Feature bytes per partition rounded up to whole pages (what one partition read covers)."""
        return -(-self.feat_nbytes // FEATURE_ALIGNMENT) * FEATURE_ALIGNMENT

    def partition_of(self, nodes: npt.ArrayLike) -> np.ndarray:
        """The partition of each node id (partitions hold consecutive, ascending ranges of ids)."""
        return np.searchsorted(self.node_end, np.asarray(nodes), side="right").astype(np.int64)

    def count_in(self, sorted_nodes: np.ndarray) -> np.ndarray:
        """How many of ``sorted_nodes`` (ascending ids) fall in each partition."""
        return np.searchsorted(sorted_nodes, self.node_end) - np.searchsorted(sorted_nodes, self.node_begin)

    def take(self, partitions: npt.ArrayLike) -> "PartitionTable":
        """The rows of ``partitions``, in that order."""
        return PartitionTable(self.array[np.asarray(partitions, dtype=np.int64)])

    def rows(self) -> Iterator[PartitionRow]:
        """Each partition in order, by name."""
        for values in self.array.tolist():
            yield PartitionRow(*values)


def row_offsets_for(global_ids: np.ndarray, part_node_begin: np.ndarray, part_feat_offset: np.ndarray,
                    row_bytes: int) -> np.ndarray:
    """Byte offset in ``features.bin`` of each node's row (int64, one per global id).

    part_node_begin: int64 [P], each partition's first global id, ascending; part_feat_offset:
    int64 [P], each partition's first byte. A node belongs to the last partition whose first
    id is <= its id. Raises ValueError for an id below the first partition or mismatched tables.
    """
    ids = np.asarray(global_ids, dtype=np.int64)
    begin = np.asarray(part_node_begin, dtype=np.int64)
    feat_offset = np.asarray(part_feat_offset, dtype=np.int64)
    if begin.ndim != 1 or begin.shape != feat_offset.shape or len(begin) == 0:
        raise ValueError(f"part_node_begin/part_feat_offset: shapes {begin.shape} and {feat_offset.shape}, "
                         f"expected equal non-empty 1-D")
    if row_bytes < 0:
        raise ValueError(f"row_bytes: {row_bytes} is negative")
    part = np.searchsorted(begin, ids, side="right") - 1
    if ids.size and part.min() < 0:
        raise ValueError(f"global_ids: id {ids[part < 0][0]} precedes the first partition ({begin[0]})")
    return feat_offset[part] + (ids - begin[part]) * row_bytes
