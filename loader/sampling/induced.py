"""The subgraph a partition buffer holds: the in-neighbour CSC induced by a union of node ranges.

MariusGNN's buffer orders (``comet.py``) train each edge bucket while a few partitions are resident,
and message passing then sees only those partitions: a resident target keeps the in-neighbours that
are resident too, in list order (duplicates kept), and every other edge is gone. A prepared dataset's
partitions are contiguous, ascending node ranges, so the resident nodes are a union of ranges and the
subgraph is built from a few slices of the CSC, vectorized (no map the size of the graph, no loop in
Python over nodes or edges).

Numbering: the induced graph's local ids are the resident nodes in ascending order of the input
graph's local ids (range by range); ``global_ids`` keep each node's dataset id, so the sampler's
draws (keyed by global id, ``sampling.py``) are those the full graph would make for a target whose
list the buffer holds whole.
"""

import numpy as np

from loader.sampling.sampling import CSCGraph, as_int_array

__all__ = ["check_ranges", "range_nodes", "local_in_ranges", "induced_by_ranges"]


def check_ranges(node_begin: np.ndarray, node_end: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The ranges as int64 arrays; ValueError unless each is [begin, end) in [0, num_nodes), ascending, disjoint."""
    begin = as_int_array("node_begin", node_begin, (np.int64,))
    end = as_int_array("node_end", node_end, (np.int64,))
    if begin.shape != end.shape:
        raise ValueError(f"node_begin, node_end: lengths {len(begin)} and {len(end)} differ")
    if begin.size:
        if begin.min() < 0 or end.max() > num_nodes or (end < begin).any():
            raise ValueError(f"node ranges must lie in [0, {num_nodes}) with begin <= end")
        # a range overlapping the next one would hold its nodes twice
        if (begin[1:] < end[:-1]).any():
            raise ValueError("node ranges must be ascending and disjoint")
    return begin, end


def range_nodes(node_begin: np.ndarray, node_end: np.ndarray) -> np.ndarray:
    """int64: every id of the ranges, range by range (``concatenate([arange(b, e) ...])`` in one step)."""
    sizes = node_end - node_begin
    first_local = np.cumsum(sizes) - sizes
    return np.repeat(node_begin - first_local, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)


def _lookup(ids: np.ndarray, node_begin: np.ndarray, node_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inside, local): whether each id lies in a range, and its local id where it does (garbage elsewhere)."""
    sizes = node_end - node_begin
    first_local = np.cumsum(sizes) - sizes
    # the range of an id: the first whose end lies above it; the id is in it when the range starts at or below it
    where = np.searchsorted(node_end, ids, side="right")
    inside = where < len(node_end)
    inside[inside] = ids[inside] >= node_begin[where[inside]]
    if not len(node_end):
        return inside, np.zeros_like(ids)
    where[~inside] = 0  # any valid row: the local ids of outside ids are never read
    return inside, ids - node_begin[where] + first_local[where]


def local_in_ranges(ids: np.ndarray, node_begin: np.ndarray, node_end: np.ndarray) -> np.ndarray:
    """int64: the local id in ``induced_by_ranges``' numbering of each of ``ids`` (ids of the input graph);
    ValueError naming the first id outside the ranges (ranges as ``check_ranges`` takes them)."""
    ids = np.asarray(ids, dtype=np.int64)
    inside, local = _lookup(ids, node_begin, node_end)
    if not inside.all():
        raise ValueError(f"node {ids[~inside][0]} lies outside the resident node ranges")
    return local


def induced_by_ranges(graph: CSCGraph, node_begin: np.ndarray, node_end: np.ndarray) -> CSCGraph:
    """The subgraph of ``graph`` induced by the nodes of ``[node_begin[r], node_end[r])`` (local ids of ``graph``).

    Ranges ascending and disjoint (ValueError otherwise). Local id k of the result is the k-th resident node;
    its list is its list in ``graph`` less the neighbours outside the ranges, order and duplicates kept;
    ``global_ids`` are ``graph.global_ids`` of the resident nodes. ``indices`` keep ``graph``'s dtype.
    Cost: O(resident nodes + their in-edges), plus a binary search over the ranges per edge.
    """
    begin, end = check_ranges(node_begin, node_end, graph.num_nodes)
    nodes = range_nodes(begin, end)
    indptr = graph.indptr
    # each range's lists are one contiguous slice of indices: indptr[begin]..indptr[end]
    positions = range_nodes(indptr[begin], indptr[end])
    sources = graph.indices[positions].astype(np.int64, copy=False)
    inside, local = _lookup(sources, begin, end)
    # lists keep their order: the kept entries before list v's first entry give v's new start
    kept_before = np.zeros(len(sources) + 1, dtype=np.int64)
    np.cumsum(inside, out=kept_before[1:])
    list_starts = np.zeros(len(nodes) + 1, dtype=np.int64)
    np.cumsum(indptr[nodes + 1] - indptr[nodes], out=list_starts[1:])
    return CSCGraph(indptr=kept_before[list_starts], indices=local[inside].astype(graph.indices.dtype, copy=False),
                    global_ids=graph.global_ids[nodes])
