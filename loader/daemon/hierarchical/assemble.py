"""Stage 3, the assembler: the subgraph induced by (mega-batch nodes + static nodes) in a buffer.

Local ids: the mega-batch's nodes first, partition by partition in schedule order (so their feature
rows sit where the reader put them), then the static nodes outside the mega-batch. Training
seeds are mega-batch nodes only: a static node is trained on in the mega-batch of its own
partition, which keeps "each training node once per pass" exact; a buffer state of
``formation = "comet"`` trains only the training nodes drawn for it (``ScheduledMegaBatch.train_nodes``).
"""

import time
from dataclasses import dataclass, replace

import numpy as np

from loader.daemon.hierarchical.arena import FeatureArena, MegaBatchBuffer
from loader.daemon.hierarchical.assembly_kernels import clear_local_of, fill_local_of, group_lists, induce_subgraph
from loader.daemon.hierarchical.reader import LoadedMegaBatch
from loader.daemon.hierarchical.schedule import ScheduledMegaBatch
from loader.daemon.resident import ResidentData, StaticCache
from loader.sampling.sampling import CSCGraph

__all__ = ["MegaBatch", "group_static_lists", "assemble"]


@dataclass(frozen=True)
class MegaBatch:
    """Assembler -> superbatch sampler -> publisher: one mega-batch ready to sample from."""

    scheduled: ScheduledMegaBatch
    buffer: MegaBatchBuffer
    graph: CSCGraph
    """Induced in-neighbour CSC over local ids; ``graph.global_ids`` maps back to dataset ids."""
    row_offsets: np.ndarray
    """int64 (M,): arena byte offset of each local node's feature row."""
    labels: np.ndarray
    """int64 (M,)."""
    full_degree: np.ndarray
    """int64 (M,): each local node's in-degree over the full graph (neighbour coverage compares with it)."""
    train_seeds: np.ndarray
    """int64: local ids of the mega-batch's training nodes, ascending."""
    static_extra: int
    """Static nodes that joined from outside the mega-batch."""
    bytes_read: int
    load_seconds: float
    aggregate_offsets: np.ndarray | None = None
    """int64 (M,): arena byte offset of each local node's aggregate row (x_agg; a static node from outside the
    mega-batch has its row in the static region); None without the aggregation cache in the arena."""

    @property
    def num_nodes(self) -> int:
        return len(self.graph.global_ids)

    @property
    def num_edges(self) -> int:
        return len(self.graph.indices)


def group_static_lists(static: StaticCache) -> StaticCache:
    """The static cache with its in-lists laid out for ``assemble`` (``StaticCache.heads``, ``head_sources``): each
    list's static sources first, then the others, each ascending. Every static source is in every mega-batch, and
    of the others the mega-batch keeps those of its partitions: with partitions contiguous id ranges, a few
    ranges the kernel finds by binary search, where the lists in file order are scanned whole, mostly to drop
    what they hold (6.57M entries a mega-batch on bench/compare's graph). A list's order is the order its
    neighbours are sampled in, not which are: the same distribution, other draws. On one copy of the lists."""
    indices = static.indices.copy()
    counts = np.zeros(static.num_nodes, dtype=np.int64)
    group_lists(static.indptr, indices, static.nodes, counts)
    heads = np.zeros(static.num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=heads[1:])
    # entry j of list v's static sources sits at indptr[v] + j
    at = np.repeat(static.indptr[:-1] - heads[:-1], counts) + np.arange(heads[-1])
    sources = np.searchsorted(static.nodes, indices[at]).astype(np.int32)
    return replace(static, indices=indices, heads=heads, head_sources=sources)


def assemble(loaded: LoadedMegaBatch, resident: ResidentData, arena: FeatureArena) -> MegaBatch:
    """Build the induced subgraph (CPU work; numba kernels release the GIL)."""
    t0 = time.perf_counter()
    scheduled, buf = loaded.scheduled, loaded.buffer
    parts = resident.partitions.take(scheduled.partitions)
    counts = parts.num_nodes
    n_mb = int(counts.sum())
    static = resident.static
    extra_mask = ~np.isin(static.partition, scheduled.partitions)
    extra = np.flatnonzero(extra_mask)

    # dataset ids of the mega-batch nodes: consecutive runs node_begin .. node_end per partition
    starts = np.repeat(parts.node_begin - np.cumsum(counts) + counts, counts)
    global_ids = np.concatenate([np.arange(n_mb, dtype=np.int64) + starts, static.nodes[extra]])

    # degrees from the indptr slices (n_p + 1 entries per partition, back to back in the scratch)
    ptr = buf.raw_indptr_scratch[:n_mb + len(parts)]
    deg_all = np.diff(ptr)
    boundaries = np.cumsum(counts + 1)[:-1] - 1  # the diff across two partitions' slices is meaningless
    deg_mb = np.delete(deg_all, boundaries)
    static_deg = np.diff(static.indptr)[extra]
    full_degree = np.concatenate([deg_mb, static_deg]).astype(np.int64, copy=False)
    raw_indptr = np.zeros(n_mb + 1, dtype=np.int64)
    np.cumsum(deg_mb, out=raw_indptr[1:])
    if raw_indptr[-1] != loaded.raw_edges:
        raise RuntimeError("the partitions' indptr slices disagree with the edges read (reader bug)")

    # the static extras' lists follow the partitions' lists: the kernel reads them in the resident copy, of each
    # its static sources and the entries in the mega-batch partitions' id ranges
    if static.heads is None or static.head_sources is None:
        raise RuntimeError("the static cache's lists are not grouped for the assembler (group_static_lists)")
    ranges = np.stack([parts.node_begin, parts.node_end], axis=1).astype(np.int64)
    ranges = ranges[np.argsort(ranges[:, 0], kind="stable")]
    fill_local_of(resident.local_of, global_ids)
    try:
        static_local = resident.local_of[static.nodes]
        indptr, indices = induce_subgraph(resident.local_of, raw_indptr, buf.raw_indices[:loaded.raw_edges],
                                          static.indptr, static.indices, static.heads, static.head_sources,
                                          static_local, extra, ranges)
    finally:
        clear_local_of(resident.local_of, global_ids)

    row_offsets = np.empty(len(global_ids), dtype=np.int64)
    within_part = np.arange(n_mb, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    row_offsets[:n_mb] = np.repeat(loaded.feature_base, counts) + within_part * arena.row_bytes
    row_offsets[n_mb:] = arena.static_row_offsets[extra]

    aggregate_offsets = None
    if loaded.aggregate_base is not None:
        if arena.static_aggregate_offsets is None:
            raise RuntimeError("the partitions' aggregates were read but the arena holds no static ones")
        aggregate_offsets = np.empty(len(global_ids), dtype=np.int64)
        aggregate_offsets[:n_mb] = np.repeat(loaded.aggregate_base, counts) + within_part * arena.row_bytes
        aggregate_offsets[n_mb:] = arena.static_aggregate_offsets[extra]

    labels = resident.labels[global_ids]
    train_seeds = np.flatnonzero(resident.is_train[global_ids[:n_mb]]).astype(np.int64)
    if scheduled.train_nodes is not None:  # a buffer state trains only the nodes drawn for it (swap_schedule)
        wanted = scheduled.train_nodes
        at = np.minimum(np.searchsorted(wanted, global_ids[train_seeds]), max(len(wanted) - 1, 0))
        train_seeds = train_seeds[wanted[at] == global_ids[train_seeds]] if len(wanted) else train_seeds[:0]
    graph = CSCGraph(indptr=indptr, indices=indices, global_ids=global_ids)
    return MegaBatch(scheduled, buf, graph, row_offsets, labels, full_degree, train_seeds, len(extra),
                     loaded.bytes_read, loaded.seconds + time.perf_counter() - t0, aggregate_offsets)
