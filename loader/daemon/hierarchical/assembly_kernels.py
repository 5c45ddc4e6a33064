"""numba kernels that build a mega-batch's induced subgraph (pure functions on numpy arrays).

A mega-batch holds M nodes with local ids 0..M-1. ``local_of`` is a dataset-wide (N) map
from global id to local id, -1 outside the mega-batch; it is allocated once and filled and
cleared per mega-batch in O(M), so assembling a mega-batch never costs O(N).
"""

import numpy as np

from proto.jit import kernel

__all__ = ["induce_subgraph", "fill_local_of", "clear_local_of"]


@kernel
def induce_subgraph(local_of: np.ndarray, raw_indptr: np.ndarray, raw_indices: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Keep, for each of the M targets, the in-neighbours inside the mega-batch, mapped to local ids.

    local_of: int32 [N]; raw_indptr: int64 [M+1] into ``raw_indices`` (it need not start at
    0, so a slice of a larger CSC works); raw_indices: global ids. Returns (indptr int64
    [M+1] from 0, indices int32 [kept]); each list keeps its original order and duplicates.
    One pass into a buffer the size of the input, then a copy trimmed to the kept edges, so
    the result holds no spare capacity; a count pass would read the input twice instead.
    """
    num_targets = raw_indptr.shape[0] - 1
    num_global = local_of.shape[0]
    first = raw_indptr[0]
    indptr = np.empty(num_targets + 1, dtype=np.int64)
    indices = np.empty(raw_indptr[num_targets] - first, dtype=np.int32)
    indptr[0] = 0
    kept = 0
    for v in range(num_targets):
        for k in range(raw_indptr[v], raw_indptr[v + 1]):
            u = raw_indices[k]
            if u < 0 or u >= num_global:
                raise ValueError("raw_indices: a neighbour id is outside [0, len(local_of))")
            local = local_of[u]
            if local >= 0:
                indices[kept] = local
                kept += 1
        indptr[v + 1] = kept
    return indptr, indices[:kept].copy()


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
