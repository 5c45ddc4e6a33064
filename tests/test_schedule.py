"""The scheduler: every partition once per epoch, seeded, epochs differ."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.schedule import schedule_epoch


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
