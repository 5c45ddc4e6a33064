"""numba kernel of the label-balanced mega-batch schedule (a pure function on numpy arrays)."""

import numpy as np

from proto.jit import kernel

__all__ = ["balanced_group_of"]


@kernel
def balanced_group_of(label_counts: np.ndarray, order: np.ndarray, capacity: np.ndarray, tie: np.ndarray
                      ) -> np.ndarray:
    """Group of each partition: greedy, in ``order``, each to the open group whose label mix it evens most.

    label_counts: float64 (P, C) training labels per partition; order: int64 (P,) a permutation of the
    partitions; capacity: int64 (G,) partitions each group takes (summing to P); tie: float64 (G,)
    tiny random offsets that break ties. Adding counts h to group g changes the squared distance of
    the groups' label counts from their fair share (``size_g x mean partition``) by
    ``2 h . (counts_g - size_g mean) + |h|^2``, so the best open group minimises
    ``h . (counts_g - size_g mean)``.
    """
    num_parts, num_classes = label_counts.shape
    groups = len(capacity)
    mean = np.zeros(num_classes)
    for p in range(num_parts):
        for c in range(num_classes):
            mean[c] += label_counts[p, c]
    for c in range(num_classes):
        mean[c] /= max(num_parts, 1)
    counts = np.zeros((groups, num_classes))
    size = np.zeros(groups, dtype=np.int64)
    group_of = np.empty(num_parts, dtype=np.int64)
    for i in range(num_parts):
        p = order[i]
        best, best_score = -1, np.inf
        for g in range(groups):
            if size[g] >= capacity[g]:
                continue
            score = tie[g]
            for c in range(num_classes):
                score += label_counts[p, c] * (counts[g, c] - size[g] * mean[c])
            if score < best_score:
                best, best_score = g, score
        group_of[p] = best
        size[best] += 1
        for c in range(num_classes):
            counts[best, c] += label_counts[p, c]
    return group_of
