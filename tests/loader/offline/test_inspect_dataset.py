"""The default partition count of ``prepare`` (``--partitions auto``) and the advice of ``inspect``."""

from hypothesis import given
from hypothesis import strategies as st

from loader.format.partition_count import (
    MAX_PARTITIONS,
    MIN_PARTITION_NODES,
    MIXING_PARTITIONS,
    TARGET_READ_BYTES,
    auto_partitions,
)
from loader.offline.inspect_dataset import partition_advice


def test_small_graphs_get_many_small_partitions_and_large_ones_partitions_of_4_mib_reads():
    assert auto_partitions(7_650, 22 << 20) == MIXING_PARTITIONS  # amazon-photo: the mixing floor
    assert auto_partitions(2_708, 15 << 20) == 2_708 // MIN_PARTITION_NODES  # cora: 16 nodes each
    assert auto_partitions(2_000_000, 2 << 30) == 512  # bench/compare's graph: one 4 MiB read each
    assert auto_partitions(100_000_000, 400 << 30) == MAX_PARTITIONS
    assert auto_partitions(5, 1 << 20) == 1


@given(st.integers(1, 10**9), st.integers(0, 1 << 44), st.integers(1, 10**9), st.integers(0, 1 << 44))
def test_the_count_grows_with_the_graph_and_keeps_its_bounds(n, feature_bytes, more_nodes, more_bytes):
    p = auto_partitions(n, feature_bytes)
    assert 1 <= p <= MAX_PARTITIONS
    assert p == 1 or p * MIN_PARTITION_NODES <= n  # every partition keeps its nodes
    # the mixing floor and the read size are both met unless a cap forbids it
    assert p >= min(MIXING_PARTITIONS, feature_bytes // TARGET_READ_BYTES + MIXING_PARTITIONS, MAX_PARTITIONS,
                    max(1, n // MIN_PARTITION_NODES))
    assert p >= min(feature_bytes // TARGET_READ_BYTES, MAX_PARTITIONS, max(1, n // MIN_PARTITION_NODES))
    assert auto_partitions(n + more_nodes, feature_bytes + more_bytes) >= p


def test_inspect_advises_prepare_auto_only_where_it_makes_more_partitions():
    text = partition_advice(32, 7_650, 22 << 20)
    assert text is not None and "--partitions auto (256)" in text
    assert partition_advice(256, 7_650, 22 << 20) is None
    assert partition_advice(512, 2_000_000, 2 << 30) is None
