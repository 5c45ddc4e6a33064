"""numba kernels that build a mega-batch's induced subgraph (pure functions on numpy arrays).

A mega-batch holds M nodes with local ids 0..M-1. ``local_of`` is a dataset-wide (N) map
from global id to local id, -1 outside the mega-batch; it is allocated once and filled and
cleared per mega-batch in O(M), so assembling a mega-batch never costs O(N).
"""

import numpy as np

from proto.jit import kernel

__all__ = ["induce_subgraph", "group_lists", "static_sources_by_prefix", "fill_local_of", "clear_local_of"]


@kernel
def induce_subgraph(local_of: np.ndarray, raw_indptr: np.ndarray, raw_indices: np.ndarray, held_indptr: np.ndarray,
                    held_indices: np.ndarray, held_heads: np.ndarray, head_sources: np.ndarray,
                    static_local: np.ndarray, held: np.ndarray, ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep, for each target, the in-neighbours inside the mega-batch, mapped to local ids.

    The targets are the M_r lists of ``raw_indptr`` / ``raw_indices`` (the partitions' lists as read), scanned
    whole, then the lists ``held`` (positions, in order) of the static cache's CSC ``held_indptr`` /
    ``held_indices``, grouped (``group_lists``) and read where they lie. Held list p starts with its
    ``held_heads[p+1] - held_heads[p]`` static sources, which every mega-batch holds: the kernel maps them through
    ``static_local`` (each static node's local id in this mega-batch) from ``head_sources`` (their positions among
    the static nodes), a table that stays in cache where ``local_of`` does not. Of the ascending rest it keeps
    the entries in ``ranges`` (int64 [R, 2], the mega-batch partitions' id ranges [begin, end), ascending and
    disjoint), found by binary search and checked against ``local_of``. So the static lists' millions of
    entries, mostly of other partitions, are not scanned (nor, before that, gathered into a copy); for lists so
    grouped the result is the whole scan's.

    local_of: int32 [N]; raw_indptr: int64 [M_r+1] into ``raw_indices`` (it need not start at 0, so a slice of a
    larger CSC works); raw_indices, held_indices: global ids. Returns (indptr int64 [M_r + len(held) + 1] from 0,
    indices int32 [kept]); each list keeps its order and duplicates. One pass into a buffer the size of the
    input (the raw lists whole, the held lists' heads and ranges), then a copy trimmed to the kept edges, so
    the result holds no spare capacity; a count pass would read the raw lists twice instead.
    """
    num_raw = raw_indptr.shape[0] - 1
    first = raw_indptr[0]
    total = raw_indptr[num_raw] - first
    # each held list's ranges, searched once: the searches' cache misses in lists spread over the static cache
    # are most of this kernel's time
    found = np.empty((held.shape[0], ranges.shape[0], 2), dtype=np.int64)
    for i in range(held.shape[0]):
        p = held[i]
        total += held_heads[p + 1] - held_heads[p]
        at, end = held_indptr[p] + held_heads[p + 1] - held_heads[p], held_indptr[p + 1]
        for r in range(ranges.shape[0]):  # ascending ranges: each search starts where the last range ended
            lo = _lower_bound(held_indices, at, end, ranges[r, 0])
            at = _lower_bound(held_indices, lo, end, ranges[r, 1])
            found[i, r, 0], found[i, r, 1] = lo, at
            total += at - lo
    indptr = np.empty(num_raw + held.shape[0] + 1, dtype=np.int64)
    indices = np.empty(total + 1, dtype=np.int32)  # + 1: _keep_local writes before it knows whether it keeps
    indptr[0] = 0
    kept = 0
    for v in range(num_raw):
        kept = _keep_local(local_of, raw_indices, raw_indptr[v], raw_indptr[v + 1], indices, kept)
        indptr[v + 1] = kept
    num_static = static_local.shape[0]
    for i in range(held.shape[0]):
        p = held[i]
        for j in range(held_heads[p], held_heads[p + 1]):
            s = head_sources[j]
            if s < 0 or s >= num_static or static_local[s] < 0:
                raise ValueError("a static source is not a static node of the mega-batch")
            indices[kept] = static_local[s]
            kept += 1
        for r in range(ranges.shape[0]):
            kept = _keep_local(local_of, held_indices, found[i, r, 0], found[i, r, 1], indices, kept)
        indptr[num_raw + i + 1] = kept
    return indptr, indices[:kept].copy()


@kernel
def group_lists(indptr: np.ndarray, indices: np.ndarray, members: np.ndarray, heads: np.ndarray) -> None:
    """Reorder each list of the CSC ``indptr`` / ``indices`` in place: its entries in ``members`` (ascending ids)
    first, then the others, each group ascending; ``heads[v]`` gets list v's count of the first."""
    longest = 0
    for v in range(indptr.shape[0] - 1):
        longest = max(longest, indptr[v + 1] - indptr[v])
    ahead = np.empty(longest, dtype=indices.dtype)
    behind = np.empty(longest, dtype=indices.dtype)
    for v in range(indptr.shape[0] - 1):
        begin, end = indptr[v], indptr[v + 1]
        part = indices[begin:end]
        part.sort()
        n_ahead = 0
        n_behind = 0
        for k in range(end - begin):
            u = part[k]
            at = np.searchsorted(members, u)
            if at < members.shape[0] and members[at] == u:
                ahead[n_ahead] = u
                n_ahead += 1
            else:
                behind[n_behind] = u
                n_behind += 1
        part[:n_ahead] = ahead[:n_ahead]
        part[n_ahead:end - begin] = behind[:n_behind]
        heads[v] = n_ahead


@kernel
def static_sources_by_prefix(indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray,
                             rank: np.ndarray) -> np.ndarray:
    """For a static cache kept as a prefix of its nodes in ``rank`` order (``static_cache = "auto"``): int64
    [K+1], entry k the number of in-list entries of the first k nodes whose source is among those k too (what
    ``group_lists`` puts first and ``StaticCache.head_sources`` holds). nodes: ascending ids of the K static
    nodes, row v's list at ``indices[indptr[v]:indptr[v+1]]``; rank: int64 [K], node v's place in the order."""
    k = nodes.shape[0]
    counts = np.zeros(k + 1, dtype=np.int64)
    for v in range(k):
        for j in range(indptr[v], indptr[v + 1]):
            u = indices[j]
            at = np.searchsorted(nodes, u)
            if at < k and nodes[at] == u:
                counts[max(rank[v], rank[at]) + 1] += 1  # in every prefix longer than both ranks
    return np.cumsum(counts)


@kernel
def _lower_bound(ids: np.ndarray, begin: int, end: int, value: int) -> int:
    """The first position in ascending ``ids[begin:end]`` whose value is not below ``value`` (``end`` if none).
    By hand: numba's ``np.searchsorted`` on a slice took 10x as long, most of the assembler's time."""
    lo, hi = begin, end
    while lo < hi:
        mid = (lo + hi) >> 1
        if ids[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@kernel
def _keep_local(local_of: np.ndarray, lists: np.ndarray, begin: int, end: int, out: np.ndarray, kept: int) -> int:
    """Append to ``out`` from ``kept`` on the local ids of ``lists[begin:end]`` inside the mega-batch; the new
    count. A separate function so that the two kinds of list may differ in index dtype.

    Branch-free: every id is written at ``out[kept]`` and counted only when kept (``out`` has one spare entry),
    since whether a neighbour is kept is a coin the CPU cannot predict (most of the static lists' entries are
    dropped): 1.5-1.8x the branching loop's rate on bench/compare's static lists."""
    num_global = local_of.shape[0]
    for k in range(begin, end):
        u = lists[k]
        if u < 0 or u >= num_global:
            raise ValueError("a neighbour id is outside [0, len(local_of))")
        local = local_of[u]
        out[kept] = local
        kept += local >= 0
    return kept


@kernel
def fill_local_of(local_of: np.ndarray, global_ids: np.ndarray) -> None:
    """Set ``local_of[global_ids[i]] = i`` for every i.

    Raises ValueError on an id outside [0, N) or an entry already set (a repeated global id,
    or a previous mega-batch not cleared), after undoing its own writes so that ``local_of``
    is left as it was.
    """
    num_global = local_of.shape[0]
    for i in range(global_ids.shape[0]):
        g = global_ids[i]
        if g < 0 or g >= num_global or local_of[g] >= 0:
            for j in range(i):
                local_of[global_ids[j]] = -1
            if g < 0 or g >= num_global:
                raise ValueError("global_ids: an id is outside [0, len(local_of))")
            raise ValueError("global_ids: an id is repeated, or local_of was not cleared")
        local_of[g] = i


@kernel
def clear_local_of(local_of: np.ndarray, global_ids: np.ndarray) -> None:
    """Reset the entries ``fill_local_of`` set back to -1 (ids outside [0, N) are skipped)."""
    num_global = local_of.shape[0]
    for i in range(global_ids.shape[0]):
        g = global_ids[i]
        if 0 <= g < num_global:
            local_of[g] = -1
