"""The scheduler: every partition once per epoch, seeded, epochs differ."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.hierarchical.schedule import label_skew, schedule_epoch, train_label_counts
from loader.format.partition_table import PartitionTable


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 50), st.integers(0, 2**32), st.integers(0, 100))
def test_each_partition_once_per_epoch(parts, per, seed, epoch):
    plans = schedule_epoch(parts, per, seed, epoch)
    got = np.concatenate([p.partitions for p in plans])
    assert sorted(got.tolist()) == list(range(parts))
    assert all(len(p.partitions) <= per for p in plans)
    assert [p.index for p in plans] == list(range(len(plans)))
    assert all(p.count == len(plans) for p in plans) and plans[-1].is_last
    assert all(np.all(np.diff(p.partitions) > 0) for p in plans)


def test_deterministic_and_epochs_differ():
    a = [p.partitions.tolist() for p in schedule_epoch(64, 16, 7, 3)]
    b = [p.partitions.tolist() for p in schedule_epoch(64, 16, 7, 3)]
    c = [p.partitions.tolist() for p in schedule_epoch(64, 16, 7, 4)]
    assert a == b and a != c


def clustered_counts(parts, classes, seed):
    """Training labels per partition as min-cut partitions have them: most of each partition in one class."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 5, (parts, classes)).astype(np.float64)
    counts[np.arange(parts), rng.integers(0, classes, parts)] += rng.integers(20, 200, parts)
    return counts


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.integers(1, 40), st.integers(1, 12), st.integers(0, 2**32), st.integers(0, 50))
def test_balanced_schedule_each_partition_once_in_even_groups(parts, per, classes, seed, epoch):
    counts = clustered_counts(parts, classes, seed % 1000)
    plans = schedule_epoch(parts, per, seed, epoch, counts)
    got = np.concatenate([p.partitions for p in plans])
    assert sorted(got.tolist()) == list(range(parts))
    sizes = [len(p.partitions) for p in plans]
    assert len(plans) == -(-parts // per) and max(sizes) <= per and max(sizes) - min(sizes) <= 1
    assert [p.index for p in plans] == list(range(len(plans))) and plans[-1].is_last
    assert all(np.all(np.diff(p.partitions) > 0) for p in plans)
    again = schedule_epoch(parts, per, seed, epoch, counts)
    assert [p.partitions.tolist() for p in plans] == [p.partitions.tolist() for p in again]


def test_balanced_schedule_mixes_labels_better_than_random():
    counts = clustered_counts(64, 8, 3)

    def mean_skew(label_counts):
        skews = [label_skew(counts, p.partitions) for e in range(20)
                 for p in schedule_epoch(64, 16, 5, e, label_counts)]
        return float(np.mean(skews))

    random_skew, balanced_skew = mean_skew(None), mean_skew(counts)
    assert balanced_skew < 0.5 * random_skew, (balanced_skew, random_skew)
    # still random: epochs group the partitions differently
    a, b = (schedule_epoch(64, 16, 5, e, counts)[0].partitions.tolist() for e in (0, 1))
    assert a != b


def test_label_skew_against_the_definition():
    counts = np.array([[10, 0], [0, 10], [5, 5]], dtype=np.float64)
    assert label_skew(counts, np.array([2])) == 0.0  # the group mixes exactly as all partitions do
    assert label_skew(counts, np.array([0])) == 0.5  # (1, 0) vs (0.5, 0.5)
    assert label_skew(counts, np.array([0, 2])) == 0.25  # (0.75, 0.25)
    assert label_skew(np.zeros((2, 3)), np.array([0])) == 0.0  # no training nodes: nothing to skew


def test_train_label_counts_counts_labelled_training_nodes_per_partition():
    partitions = np.zeros((3, 6), dtype=np.int64)
    partitions[:, 0], partitions[:, 1] = [0, 4, 6], [4, 6, 10]
    labels = np.array([0, 1, 1, -1, 2, 2, 0, 0, 1, 2])
    train = np.array([0, 1, 3, 4, 6, 7, 9])
    expected = np.array([[1, 1, 0], [0, 0, 1], [2, 0, 1]], dtype=np.float64)  # node 3 is unlabelled
    np.testing.assert_array_equal(train_label_counts(PartitionTable(partitions), train, labels), expected)
