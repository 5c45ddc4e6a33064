"""The partition-count advice of ``inspect`` and ``prepare``."""

from loader.offline.inspect_dataset import ADVISED_PARTITIONS, MIN_PARTITION_BYTES, partition_advice


def test_advice_only_where_more_partitions_stay_large_reads():
    big = 1100 << 20  # coauthor-physics' features
    text = partition_advice(32, big)
    assert text is not None and f"--partitions {ADVISED_PARTITIONS}" in text
    assert partition_advice(ADVISED_PARTITIONS, big) is None  # already enough
    assert partition_advice(32, 22 << 20) is None  # 22 MiB: more partitions would be sub-MiB reads
    small = partition_advice(8, 40 * MIN_PARTITION_BYTES)
    assert small is not None and "--partitions 40" in small
