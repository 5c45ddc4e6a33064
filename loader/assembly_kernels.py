"""numba kernels of the assembler: the subgraph induced by a mega-batch's node set.

``local_of`` is a dataset-wide int32 map that is -1 everywhere between assemblies; setting and
clearing only the mega-batch's entries keeps each assembly O(mega-batch), not O(N).
"""

import numba
import numpy as np

__all__ = ["induce_subgraph", "fill_local_of", "clear_local_of"]


@numba.njit(nogil=True, cache=False)
def fill_local_of(local_of: np.ndarray, global_ids: np.ndarray) -> None:
    """``local_of[global_ids[i]] = i``."""
    for i in range(global_ids.shape[0]):
        local_of[global_ids[i]] = i


@numba.njit(nogil=True, cache=False)
def clear_local_of(local_of: np.ndarray, global_ids: np.ndarray) -> None:
    """Back to -1 for the entries ``fill_local_of`` set."""
    for i in range(global_ids.shape[0]):
        local_of[global_ids[i]] = -1


@numba.njit(nogil=True, cache=False)
def induce_subgraph(local_of: np.ndarray, raw_indptr: np.ndarray, raw_indices: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Keep, per target, the in-neighbours inside the node set, as local ids, in their original order.

    ``raw_indptr`` (int64, M+1) and ``raw_indices`` (dataset ids) are the full in-neighbour lists of
    the M targets; returns (indptr int64 (M+1,), indices int32).
    """
    m = raw_indptr.shape[0] - 1
    indptr = np.empty(m + 1, dtype=np.int64)
    indices = np.empty(raw_indptr[m] - raw_indptr[0], dtype=np.int32)
    indptr[0] = 0
    k = 0
    for v in range(m):
        for e in range(raw_indptr[v], raw_indptr[v + 1]):
            u = local_of[raw_indices[e]]
            if u >= 0:
                indices[k] = u
                k += 1
        indptr[v + 1] = k
    return indptr, indices[:k].copy()
