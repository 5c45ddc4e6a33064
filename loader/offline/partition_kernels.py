"""numba kernels for streaming graph partitioning (pure functions on numpy arrays)."""

import numpy as np

from proto.jit import kernel

__all__ = ["fennel_assign"]


@kernel
def fennel_assign(indptr: np.ndarray, indices: np.ndarray, first_node: int, assignment: np.ndarray,
                  sizes: np.ndarray, alpha: float, gamma: float, capacity: int,
                  counts: np.ndarray) -> int:
    """Assign nodes ``first_node + i`` (rows of a CSR slice) one by one with the Fennel rule.

    Nodes already assigned (a restreaming pass, Nishimura & Ugander KDD 2013) are removed
    from their partition first and placed again.

    Node v goes to argmax_p |N(v) ∩ P_p| - alpha * gamma * |P_p|^(gamma-1) among partitions
    below ``capacity``. Only partitions holding a neighbour can beat the smallest partition,
    so each node costs O(degree) plus a rescan for the smallest partition only when it grows.
    ``counts`` is a zeroed scratch array of length P, left zeroed. Returns edges whose other
    end was already assigned elsewhere (a running cut estimate).
    """
    num_parts = sizes.shape[0]
    smallest = 0
    for p in range(num_parts):
        if sizes[p] < sizes[smallest]:
            smallest = p
    cut = 0
    for row in range(indptr.shape[0] - 1):
        v = first_node + row
        previous = assignment[v]
        if previous >= 0:  # restreaming: take v out and place it again, now seeing all neighbours
            assignment[v] = -1
            sizes[previous] -= 1
            if sizes[previous] < sizes[smallest]:
                smallest = previous
        begin = indptr[row] - indptr[0]
        end = indptr[row + 1] - indptr[0]
        for k in range(begin, end):
            p = assignment[indices[k]]
            if p >= 0:
                counts[p] += 1
        best = smallest
        best_score = -alpha * gamma * sizes[smallest] ** (gamma - 1.0)
        for k in range(begin, end):
            p = assignment[indices[k]]
            if p >= 0 and counts[p] > 0 and sizes[p] < capacity:
                score = counts[p] - alpha * gamma * sizes[p] ** (gamma - 1.0)
                if score > best_score or (score == best_score and sizes[p] < sizes[best]):
                    best = p
                    best_score = score
        for k in range(begin, end):
            p = assignment[indices[k]]
            if p >= 0:
                if p != best:
                    cut += counts[p]
                counts[p] = 0
        assignment[v] = best
        sizes[best] += 1
        if best == smallest:
            for p in range(num_parts):
                if sizes[p] < sizes[smallest]:
                    smallest = p
    return cut
