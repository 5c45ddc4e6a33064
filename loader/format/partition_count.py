"""How many partitions ``prepare`` makes by default (``--partitions auto``): many small ones.

A mega-batch of the hierarchical mode is a random group of partitions (HierBatching; MariusGNN's COMET
groups small physical partitions into logical ones at random for the same reason). Min-cut partitions
are homophilous, so the fewer partitions a mega-batch holds, the further its labels drift from the
epoch's and the slower training converges: on amazon-photo at a quarter of the partitions per
mega-batch, 32 METIS partitions took 26.7 epochs to the in-memory run's accuracy and 256 took 17.7
(in-memory: 19.3; docs/PERFORMANCE.md). A partition is also the hierarchical mode's unit of disk
read, so it should stay large enough to be read at the disk's bandwidth, not its latency.

The count is therefore the larger of the two needs: ``MIXING_PARTITIONS`` (so a mega-batch of a
quarter of the features still groups 64 partitions) and one partition per ``TARGET_READ_BYTES`` of
features (a large graph gets more partitions, each still one 4 MiB sequential read), capped so that
a partition keeps ``MIN_PARTITION_NODES`` nodes and METIS's time and the partition table stay small.
"""

__all__ = ["auto_partitions", "MIXING_PARTITIONS", "TARGET_READ_BYTES", "MIN_PARTITION_NODES", "MAX_PARTITIONS"]

MIXING_PARTITIONS = 256
"""Partitions that mix mega-batches well at a quarter of them (docs/PERFORMANCE.md: amazon-photo)."""
TARGET_READ_BYTES = 4 << 20
"""Features per partition on a large graph: one read of ~6 ms at this disk's ~690 MB/s sequential rate,
where a random 4 KiB read costs ~0.1 ms: latency stays a few percent of the read."""
MIN_PARTITION_NODES = 16
"""Fewest nodes per partition on a small graph (METIS balances within a few nodes, not below)."""
MAX_PARTITIONS = 16384
"""METIS's time grows with the count, and the partition table and schedule are per partition."""


def auto_partitions(num_nodes: int, feature_bytes: int) -> int:
    """The default partition count for a graph of ``num_nodes`` nodes and ``feature_bytes`` of features."""
    wanted = max(MIXING_PARTITIONS, feature_bytes // TARGET_READ_BYTES)
    return max(1, min(wanted, MAX_PARTITIONS, num_nodes // MIN_PARTITION_NODES))
