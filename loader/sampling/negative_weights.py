"""Loss weights for a buffer state's negatives (issue 31): what a partition buffer order's negatives lack against
the uniform draws evaluation ranks against, restored in expectation at no read.

MariusGNN's buffer orders draw a pair's negatives from the resident nodes. A pair's own partitions, the source's
and the target's, are always resident in the state that trains it, so among its negatives they are drawn with
probability ``n_near / N_R`` (N_R resident nodes, n_near in those partitions) instead of the ``n_near / N`` of a
uniform draw over the N nodes: with a buffer of a quarter of the graph, four times as often. These are the
structurally closest nodes, the hard negatives, and a model trained on them learns to push them away at the cost
of the far nodes evaluation draws most of its negatives from.

A negative's loss is weighted by the ratio of the two draws' probabilities of its class:

    w_near  = (n_near / N) / (n_near / N_R) = N_R / N                for a tail in the pair's partitions,
    w_other = (1 - n_near / N) / (1 - n_near / N_R)                  for any other resident tail,

so over the buffer's draws the near class weighs what it would among uniform draws, the mean weight is 1 (the
loss keeps its scale) and the far class's resident tails stand in for the non-resident ones. A positive weighs 1.
A buffer of every node (N_R = N) gives every weight 1. Measured in docs/PERFORMANCE.md ("Link prediction").
"""

import numpy as np

from loader.format.partition_table import PartitionTable
from loader.sampling.link_sampling import SampledLinkBatch

__all__ = ["buffer_negative_weights", "link_batch_weights"]


def buffer_negative_weights(pair_partitions: np.ndarray, positives: int, partition_sizes: np.ndarray,
                            num_nodes: int, resident_nodes: int) -> np.ndarray:
    """float32 (S,): each supervision pair's loss weight (module docstring).

    pair_partitions: int (2, S), the partitions of a batch's pairs' source and tail, the ``positives`` positives
    first, then negative m = j * B + i corrupting positive i's target (``sample_link_batch``'s order);
    partition_sizes: int (P,), nodes per partition; num_nodes: N; resident_nodes: N_R, the buffer's nodes.
    ValueError for shapes or counts that do not fit.
    """
    parts = np.asarray(pair_partitions)
    if parts.ndim != 2 or parts.shape[0] != 2:
        raise ValueError(f"pair_partitions: expected (2, pairs), got shape {parts.shape}")
    count = parts.shape[1]
    if positives < 0 or positives > count or (positives == 0 and count) or (positives and count % positives):
        raise ValueError(f"positives: {positives} does not divide the {count} pairs into positives and negatives")
    if not 0 < resident_nodes <= num_nodes:
        raise ValueError(f"resident_nodes: {resident_nodes}, expected 1..{num_nodes} (the buffer's nodes)")
    weight = np.ones(count, dtype=np.float64)
    if count == positives:
        return weight.astype(np.float32)
    sizes = np.asarray(partition_sizes, dtype=np.int64)
    source, tail = parts[0, positives:], parts[1, positives:]
    target = np.tile(parts[1, :positives], count // positives - 1)  # each negative's positive's target
    near_nodes = sizes[source] + np.where(target == source, 0, sizes[target])
    near = (tail == source) | (tail == target)
    n, resident = float(num_nodes), float(resident_nodes)
    other = (1.0 - near_nodes / n) / np.maximum(1.0 - near_nodes / resident, np.finfo(np.float64).tiny)
    weight[positives:] = np.where(near, resident / n, other)
    return weight.astype(np.float32)


def link_batch_weights(batch: SampledLinkBatch, partitions: PartitionTable, resident_nodes: int) -> np.ndarray:
    """``buffer_negative_weights`` of one sampled link batch (its pairs' dataset ids: ``edge_label_global``) over
    the dataset's ``partitions``, in a buffer of ``resident_nodes`` nodes."""
    sizes = partitions.num_nodes
    return buffer_negative_weights(partitions.partition_of(batch.edge_label_global), batch.num_positives, sizes,
                                   int(sizes.sum()), resident_nodes)
