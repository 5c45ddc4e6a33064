"""The full-graph daemon modes serve exactly the batches of the in-memory reference (``--mode inmemory``)."""

import numpy as np
import pytest

from loader.dataset import open_dataset
from loader.errors import UserError
from loader.inmemory import epoch_batches_inmemory, load_in_memory
from loader.sampling import sample_pass
from proto.client import ControlClient
from proto.messages import BatchReady, Credit, EpochEnd, Release, StartEpoch
from tests.daemon_harness import daemon_config, running_daemon, small_dataset

BATCH_SIZE, FANOUTS = 64, (5, 3)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return small_dataset(tmp_path_factory.mktemp("fullgraph"), nodes=2500)


@pytest.fixture(scope="module")
def reference(dataset):
    return load_in_memory(open_dataset(dataset))


def reference_epoch(ref, epoch):
    plan = epoch_batches_inmemory(ref.splits["train"], BATCH_SIZE, 0, epoch)
    return sample_pass(ref.graph, plan.seeds, BATCH_SIZE, FANOUTS, plan.keys)


def consume_epoch(client, epoch):
    client.send(StartEpoch(epoch=epoch))
    batches = []
    while True:
        msg = client.recv(timeout=60)
        if isinstance(msg, EpochEnd):
            assert msg.batches == len(batches)
            return batches
        assert isinstance(msg, BatchReady) and msg.batch_index == len(batches)
        batches.append({k: np.array(v) for k, v in client.read_batch(msg).arrays.items()})
        client.send(Release(slot=msg.slot, seq=msg.seq))


def assert_same_as_reference(batches, ref, epoch):
    expected = reference_epoch(ref, epoch)
    assert len(batches) == expected.num_batches
    for b, arrays in enumerate(batches):
        want = expected.batch(b)
        np.testing.assert_array_equal(arrays["n_id"], want.nodes)
        np.testing.assert_array_equal(arrays["edge_index"], want.edge_index)
        np.testing.assert_array_equal(arrays["nodes_per_hop"], want.num_sampled_nodes)
        np.testing.assert_array_equal(arrays["edges_per_hop"], want.num_sampled_edges)
        assert arrays["x"].tobytes() == ref.features[want.nodes].tobytes()
        np.testing.assert_array_equal(arrays["y"], ref.labels[want.nodes[:int(want.num_sampled_nodes[0])]])


@pytest.mark.parametrize("mode, superbatch", [("inmemory", 1), ("inmemory", 3), ("mmap", 64)])
def test_mode_serves_the_reference_batches_bitwise(dataset, reference, tmp_path, mode, superbatch):
    config = daemon_config(dataset, tmp_path / "s.sock", loader={"mode": mode}, exact={"superbatch": superbatch},
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)})
    with running_daemon(config):
        client = ControlClient.connect(str(config.server.socket), client="test", timeout=30)
        client.send(Credit(count=client.welcome.slots.count))
        try:
            assert client.welcome.dataset.mode == mode
            for epoch in (0, 1):
                assert_same_as_reference(consume_epoch(client, epoch), reference, epoch)
        finally:
            client.close()


def test_inmemory_mode_refuses_a_budget_it_cannot_fit(dataset, tmp_path):
    config = daemon_config(dataset, tmp_path / "s.sock", loader={"mode": "inmemory"}, memory={"budget": "300K"},
                           publisher={"slots": 1, "slot_bytes": "64K"}, server={"max_clients": 1})
    with pytest.raises(UserError, match="inmemory.*more than \\[memory\\] budget"):
        with running_daemon(config):
            pass
