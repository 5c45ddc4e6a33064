"""What the daemon keeps in RAM for its whole life: per-node arrays and the static cache.

Per node: labels, the train mask, the local-id map the assembler reuses and the split ids (21 bytes/node).
The static cache (HierBatching §3.2) holds the features of the prepared highest-degree nodes and
their in-edge lists; we keep the lists resident (charged once) instead of re-reading them per
mega-batch as Appendix C.1 does, since they are read for every mega-batch anyway.
"""

from dataclasses import dataclass

import numpy as np

from loader.format.dataset import Dataset
from loader.format.partition_table import PartitionTable

__all__ = ["NODE_ARRAY_BYTES", "StaticCache", "ResidentData", "load_resident"]

NODE_ARRAY_BYTES = 8 + 4 + 1 + 8
"""Per dataset node, held for the daemon's life in every mode: label (int64), local-id map (int32), train mask, and
its id in its split's sorted list (int64; a node is in one split at most)."""


@dataclass(frozen=True)
class StaticCache:
    """The static nodes (sorted dataset ids), their partition, features and in-edge lists."""

    nodes: np.ndarray
    """int64 (K,) dataset ids, ascending."""
    partition: np.ndarray
    """int64 (K,) partition of each static node."""
    indptr: np.ndarray
    """int64 (K+1,) into ``indices``."""
    indices: np.ndarray
    """Index dtype (E_s,): in-neighbours (dataset ids) of each static node."""
    features: np.ndarray
    """(K, D) feature rows in ``nodes`` order (a view into the feature arena once placed)."""
    heads: np.ndarray | None = None
    """With the lists grouped for the hierarchical assembler (``assemble.group_static_lists``): int64 (K+1,), list
    v's first ``heads[v+1] - heads[v]`` entries are its static sources, the rest of the list ascends; None: not
    grouped."""
    head_sources: np.ndarray | None = None
    """With the lists grouped: int32 (heads[K],), the static sources of every list in order, as positions in
    ``nodes`` (list v's at ``head_sources[heads[v]:heads[v+1]]``); None: not grouped."""

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def by_degree(self) -> np.ndarray:
        """Positions of the static nodes, highest in-degree first (ties: lower id), the order in which
        ``static_cache = "auto"`` keeps a prefix. ``prepare`` ranked them by in- plus out-degree; only
        in-lists are resident, and on the undirected graphs GNN datasets mostly are the two agree."""
        return np.lexsort((self.nodes, -np.diff(self.indptr)))

    def cut_in_degree(self, partitions: PartitionTable) -> np.ndarray:
        """Per static node, its in-neighbours in another partition. On an undirected graph these are
        also the cut edges the node is the source of."""
        source_partition = partitions.partition_of(self.indices)
        cut = source_partition != np.repeat(self.partition, np.diff(self.indptr))
        running = np.concatenate([[0], np.cumsum(cut, dtype=np.int64)])
        return running[self.indptr[1:]] - running[self.indptr[:-1]]

    def select(self, positions: np.ndarray) -> "StaticCache":
        """The static cache of the nodes at ``positions`` (any order; kept in ascending id order)."""
        rows = np.sort(np.asarray(positions, dtype=np.int64))
        degree = np.diff(self.indptr)[rows]
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(degree, out=indptr[1:])
        # entry j of row i sits at old indptr[row] + j: one repeat and one arange, no per-row loop
        gather = np.repeat(self.indptr[rows] - indptr[:-1], degree) + np.arange(indptr[-1])
        return StaticCache(self.nodes[rows], self.partition[rows], indptr, self.indices[gather],
                           self.features[rows])

    @classmethod
    def empty(cls, feat_dim: int, dtype: np.dtype, index_dtype: np.dtype) -> "StaticCache":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64),
                   np.zeros(0, index_dtype), np.zeros((0, feat_dim), dtype))


@dataclass(frozen=True)
class ResidentData:
    """Node-level arrays and the partition table, loaded once at startup."""

    labels: np.ndarray
    """int64 (N,), -1 = unlabeled."""
    is_train: np.ndarray
    """bool (N,)."""
    local_of: np.ndarray
    """int32 (N,), all -1 between assemblies (the assembler sets and clears only what it uses)."""
    partitions: PartitionTable
    split_ids: dict[str, np.ndarray]
    """"train", "val", "test" -> sorted int64 dataset ids."""
    static: StaticCache


def load_resident(dataset: Dataset, *, with_static: bool) -> ResidentData:
    """Read labels, splits, partitions and (optionally) the static cache."""
    m = dataset.manifest
    labels = dataset.read("labels", np.int64, 1)
    split_ids = {name: np.sort(dataset.read(name, np.int64, 1)) for name in ("train", "val", "test")}
    is_train = np.zeros(m.num_nodes, dtype=bool)
    is_train[split_ids["train"]] = True
    partitions = dataset.partitions()
    index_dtype = np.dtype(m.index_dtype.value)
    feat_dtype = np.dtype(m.feat_dtype.value)
    if with_static:
        nodes = dataset.read("static_nodes", np.int64, 1)
        part = partitions.partition_of(nodes)
        features = dataset.read("static_features", feat_dtype, 2)
        static = StaticCache(nodes, part, dataset.read("static_indptr", np.int64, 1),
                             dataset.read("static_indices", index_dtype, 1), features)
    else:
        static = StaticCache.empty(m.feat_dim, feat_dtype, index_dtype)
    return ResidentData(labels, is_train, np.full(m.num_nodes, -1, dtype=np.int32), partitions, split_ids, static)
