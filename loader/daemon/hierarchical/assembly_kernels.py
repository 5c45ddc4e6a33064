"""numba kernels that build a mega-batch's induced subgraph (pure functions on numpy arrays).

A mega-batch holds M nodes with local ids 0..M-1. ``local_of`` is a dataset-wide (N) map
from global id to local id, -1 outside the mega-batch; it is allocated once and filled and
cleared per mega-batch in O(M), so assembling a mega-batch never costs O(N).
"""

import numpy as np

from proto.jit import kernel

__all__ = ["induce_subgraph", "fill_local_of", "clear_local_of"]


@kernel
def induce_subgraph(local_of: np.ndarray, raw_indptr: np.ndarray, raw_indices: np.ndarray, held_indptr: np.ndarray,
                    held_indices: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep, for each target, the in-neighbours inside the mega-batch, mapped to local ids.

    The targets are the M_r lists of ``raw_indptr`` / ``raw_indices`` (the partitions' lists as read), then the
    lists ``held`` (positions, in order) of a CSC held in memory, ``held_indptr`` / ``held_indices`` (the static
    cache's): read where they lie, so the static nodes' millions of entries are not gathered into a copy first
    (that gather was half of a mega-batch's assembly on bench/compare's graph).

    local_of: int32 [N]; raw_indptr: int64 [M_r+1] into ``raw_indices`` (it need not start at 0, so a slice of a
    larger CSC works); raw_indices, held_indices: global ids. Returns (indptr int64 [M_r + len(held) + 1] from 0,
    indices int32 [kept]); each list keeps its original order and duplicates. One pass into a buffer the size of
    the input, then a copy trimmed to the kept edges, so the result holds no spare capacity; a count pass would
    read the input twice instead.
    """
    num_raw = raw_indptr.shape[0] - 1
    first = raw_indptr[0]
    total = raw_indptr[num_raw] - first
    for i in range(held.shape[0]):
        total += held_indptr[held[i] + 1] - held_indptr[held[i]]
    indptr = np.empty(num_raw + held.shape[0] + 1, dtype=np.int64)
    indices = np.empty(total + 1, dtype=np.int32)  # + 1: _keep_local writes before it knows whether it keeps
    indptr[0] = 0
    kept = 0
    for v in range(num_raw):
        kept = _keep_local(local_of, raw_indices, raw_indptr[v], raw_indptr[v + 1], indices, kept)
        indptr[v + 1] = kept
    for i in range(held.shape[0]):
        kept = _keep_local(local_of, held_indices, held_indptr[held[i]], held_indptr[held[i] + 1], indices, kept)
        indptr[num_raw + i + 1] = kept
    return indptr, indices[:kept].copy()


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
