"""``[hierarchy] formation = "comet"`` through the daemon: each epoch trains every training node once, from
buffer states that keep all but one logical partition of the state before (copied, not read again)."""

from collections import Counter

import numpy as np
import pytest

from proto.errors import UserError
from proto.messages import EpochEnd, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon
from tests.loader.daemon.test_daemon import check_batch


def test_every_training_node_once_per_epoch_from_swapped_states(dataset_3k, reference_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", hierarchy={"formation": "comet"})
    train = np.sort(reference_3k.splits["train"])
    with running_daemon(config) as daemon, connect(config) as client:
        assert daemon.mode.summary() == "16 partitions, a buffer of 4 swapping one logical partition at a time"
        epochs = [consume(client, StartEpoch(epoch=epoch), EpochEnd) for epoch in (0, 1)]
        loaded = {source: daemon.metrics.partitions_loaded.labels(source)._value.get()
                  for source in ("disk", "previous")}
    orders = []
    for batches, end in epochs:
        # 16 partitions, 4 per mega-batch: 8 logical partitions of 2, 2 resident, 7 states of one pass each
        assert end.passes == 7
        assert [r.batch_index for r, _ in batches] == list(range(len(batches)))
        assert all(r.num_batches == len(batches) for r, _ in batches)
        seeds = [arrays["n_id"][:int(arrays["nodes_per_hop"][0])] for _, arrays in batches]
        for _, arrays in batches:
            check_batch(arrays, reference_3k)
        counts = Counter(np.concatenate(seeds).tolist())
        assert sorted(counts) == train.tolist() and set(counts.values()) == {1}
        orders.append(np.concatenate(seeds))
    assert not np.array_equal(orders[0], orders[1])
    # a state keeps a logical partition of the one before: its partitions come from the other buffer
    assert loaded["previous"] > 0 and loaded["disk"] > 0


def test_a_mega_batch_of_one_partition_is_refused_at_startup(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", hierarchy={"formation": "comet",
                                                                       "megabatch_fraction": 1 / 16})
    with (pytest.raises(UserError, match="formation = \"comet\" swaps one of several logical partitions"),
          running_daemon(config)):
        pass
