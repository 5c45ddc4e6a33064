"""numba kernels of the link checks (pure functions on numpy arrays)."""

import numpy as np

from proto.jit import kernel

__all__ = ["has_edges"]


@kernel
def has_edges(indptr: np.ndarray, indices: np.ndarray, src: np.ndarray, dst: np.ndarray, out: np.ndarray) -> None:
    """``out[k]`` = whether the graph has the edge ``src[k] -> dst[k]``.

    The graph is an in-neighbour CSC (``indptr``, ``indices``) whose lists are sorted ascending, so each
    query is a binary search of ``dst[k]``'s list for ``src[k]``: O(log degree), nothing allocated, which is
    what lets verify test millions of pairs against an ``indices`` it maps rather than loads.
    """
    for k in range(src.shape[0]):
        lo = indptr[dst[k]]
        hi = indptr[dst[k] + 1]
        want = src[k]
        while lo < hi:
            mid = (lo + hi) // 2
            if indices[mid] < want:
                lo = mid + 1
            else:
                hi = mid
        out[k] = lo < indptr[dst[k] + 1] and indices[lo] == want
