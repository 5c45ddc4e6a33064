"""The loader daemon end to end over its real socket and shared memory (client side: ``proto`` only)."""

import socket
from collections import Counter

import numpy as np
import pytest

from proto.codec import encode
from proto.errors import RemoteError
from proto.messages import (
    BatchReady,
    Credit,
    EpochEnd,
    Error,
    EvalEnd,
    EvalRequest,
    Hello,
    Release,
    StartEpoch,
    Stats,
    StatsRequest,
)
from tests.daemon_harness import connect, consume, daemon_config, read_message, running_daemon


def check_batch(arrays, ref):
    """Features, labels and edges of a batch agree with the dataset."""
    n_id = arrays["n_id"]
    seeds = int(arrays["nodes_per_hop"][0])
    np.testing.assert_array_equal(arrays["x"], ref.features[n_id])
    np.testing.assert_array_equal(arrays["y"], ref.labels[n_id[:seeds]])
    src, dst = n_id[arrays["edge_index"][0]], n_id[arrays["edge_index"][1]]
    indptr, indices = ref.graph.indptr, ref.graph.indices
    for u, v in zip(src[:200].tolist(), dst[:200].tolist()):
        assert u in indices[indptr[v]:indptr[v + 1]], (u, v)
    assert arrays["nodes_per_hop"].sum() == len(n_id)
    assert arrays["edges_per_hop"].sum() == arrays["edge_index"].shape[1]


def test_every_training_node_once_per_pass_and_no_batch_lost(dataset_3k, reference_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", hierarchy={"passes": 2})
    train = np.sort(reference_3k.splits["train"])
    with running_daemon(config), connect(config) as client:
        seqs = []
        for epoch in (0, 1):
            batches, end = consume(client, StartEpoch(epoch=epoch), EpochEnd)
            assert end.passes == 2 * 4  # 16 partitions, 4 per mega-batch, 2 passes each
            seeds_by_pass: dict[tuple[int, int], list[np.ndarray]] = {}
            for ready, arrays in batches:
                seqs.append(ready.seq)
                assert ready.epoch == epoch
                assert ready.num_batches == len(batches)
                seeds = arrays["n_id"][:int(arrays["nodes_per_hop"][0])]
                seeds_by_pass.setdefault((ready.pass_index, 0), []).append(seeds)
                check_batch(arrays, reference_3k)
            assert sorted(r.batch_index for r, _ in batches) == list(range(len(batches)))
            # each mega-batch is run twice: over the epoch every training node appears exactly twice
            counts = Counter(np.concatenate([s for group in seeds_by_pass.values() for s in group]).tolist())
            assert sorted(counts) == train.tolist()
            assert set(counts.values()) == {2}
        assert seqs == list(range(len(seqs)))


def test_same_seed_same_batches_and_epochs_differ(dataset_3k, tmp_path):
    def run(sock_name):
        config = daemon_config(dataset_3k, tmp_path / sock_name)
        with running_daemon(config), connect(config) as client:
            return [consume(client, StartEpoch(epoch=e), EpochEnd)[0] for e in (0, 1)]

    first, second = run("a.sock"), run("b.sock")
    for epoch in (0, 1):
        assert len(first[epoch]) == len(second[epoch])
        for (ra, a), (rb, b) in zip(first[epoch], second[epoch]):
            assert ra.batch_index == rb.batch_index
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(first[0][0][1]["n_id"], first[1][0][1]["n_id"])


def test_eval_covers_split_once_with_full_graph_neighbours(dataset_3k, reference_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config), connect(config) as client:
        for split in ("val", "test"):
            batches, _ = consume(client, EvalRequest(split=split), EvalEnd)
            seeds = np.concatenate([a["n_id"][:int(a["nodes_per_hop"][0])] for _, a in batches])
            np.testing.assert_array_equal(np.sort(seeds), np.sort(reference_3k.splits[split]))
            assert all(r.kind == split for r, _ in batches)
            for _, arrays in batches:
                check_batch(arrays, reference_3k)


@pytest.mark.parametrize("fraction, static_nodes", [(1.0, 0), (0.25, 30)])
def test_auto_static_cache_holds_none_for_the_whole_graph_and_all_for_a_quarter(dataset_3k, reference_3k, tmp_path,
                                                                                   fraction, static_nodes):
    # the whole graph in one mega-batch needs no static node; a quarter of it keeps every prepared one
    config = daemon_config(dataset_3k, tmp_path / "s.sock", hierarchy={"megabatch_fraction": fraction, "passes": 1})
    assert config.hierarchy.static_cache is None
    with running_daemon(config) as daemon, connect(config) as client:
        assert daemon.mode is not None and daemon.mode.budget_plan.static_nodes == static_nodes
        assert daemon.metrics.static_nodes._value.get() == static_nodes
        batches, _ = consume(client, StartEpoch(epoch=0), EpochEnd)
        for _, arrays in batches:
            check_batch(arrays, reference_3k)


def test_static_cache_off_still_covers_and_matches_features(dataset_3k, reference_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", hierarchy={"static_cache": False, "passes": 1})
    with running_daemon(config), connect(config) as client:
        batches, end = consume(client, StartEpoch(epoch=0), EpochEnd)
        seeds = np.concatenate([a["n_id"][:int(a["nodes_per_hop"][0])] for _, a in batches])
        np.testing.assert_array_equal(np.sort(seeds), np.sort(reference_3k.splits["train"]))
        for _, arrays in batches:
            check_batch(arrays, reference_3k)


def raw_session(config):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(config.server.socket))
    return sock


@pytest.mark.parametrize("payload", [
    b"\xc1\xc1\xc1 not msgpack",
    encode(Credit(count=1)),  # a valid message, but not a Hello
    b"\x81\xa1t\xa7nonsense",  # unknown tag
    b"\xdb" + (1 << 30).to_bytes(4, "big"),  # a 1 GiB string header: over the frame limit
])
def test_bad_client_gets_an_error_and_the_daemon_keeps_serving(dataset_3k, tmp_path, payload):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config):
        with raw_session(config) as bad:
            bad.sendall(payload)
            reply = read_message(bad)
            assert isinstance(reply, Error), reply
            assert reply.fatal
            assert bad.recv(1) == b""  # then the daemon hangs up
        with connect(config) as good:
            good.send(StatsRequest())
            assert isinstance(good.recv(timeout=30), Stats)


def test_bad_message_mid_session_and_bad_release(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config):
        client = connect(config)
        client.send(Release(slot=0, seq=99))
        with pytest.raises(RemoteError) as err:
            client.recv(timeout=30)
        assert "does not hold" in err.value.message
        client.close()
        with connect(config) as good:
            batches, _ = consume(good, StartEpoch(epoch=0), EpochEnd)
            assert batches


@pytest.mark.parametrize("queue", [True, False], ids=["queued", "not-queued"])
def test_trainer_vanishing_mid_epoch_frees_the_pipeline(dataset_3k, tmp_path, queue):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config) as daemon:
        client = connect(config)
        client.send(StartEpoch(epoch=0))
        msg = client.recv(timeout=60)
        assert isinstance(msg, BatchReady)
        client.close()  # never releases, never finishes the epoch
        # the next trainer may ask before the daemon has read the first one's hang-up, or while its publisher is
        # still in a thread: queueing or not, it waits for the pipeline to be handed back instead of being refused
        # (a refusal raises here); a pipeline never freed fails it (no batch in 60 s)
        with connect(config, queue=queue) as second:
            batches, end = consume(second, StartEpoch(epoch=0), EpochEnd)
            assert [r.seq for r, _ in batches] == list(range(len(batches)))
        assert daemon.ownership.owner is None or daemon.ownership.owner.label != "session 1"


def test_second_trainer_is_refused_while_one_trains(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config), connect(config) as first, connect(config) as second:
        first.send(StartEpoch(epoch=0))
        assert isinstance(first.recv(timeout=60), BatchReady)
        second.send(StartEpoch(epoch=0))
        with pytest.raises(RemoteError) as err:
            second.recv(timeout=30)
        assert err.value.code == "bad_request" and "one training stream" in err.value.message


def test_hello_with_other_protocol_version_is_refused(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config), raw_session(config) as sock:
        sock.sendall(encode(Hello(protocol_version=99, client="future", pid=1)))
        reply = read_message(sock)
        assert isinstance(reply, Error) and reply.code == "unsupported_version"
