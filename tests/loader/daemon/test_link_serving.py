"""A link-prediction dataset served by the daemon (issue 31): every full-graph mode's training batches are the
in-memory reference's (``sample_link_batch`` over the whole graph), bitwise; evaluation batches embed each split's
held-out nodes in order and carry every held-out positive once; what cannot serve a link dataset is refused in
one line."""

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from loader.daemon.check import check_serve
from loader.daemon.config import LINK_ASSIGNMENTS, config_from_mapping
from loader.daemon.hierarchical import pipeline
from loader.format.dataset import open_dataset
from loader.offline.prepare import PrepareOptions, prepare_dataset
from loader.sampling.buffer_order import ASSIGNMENTS
from loader.sampling.inmemory import eval_split_batches, load_in_memory
from loader.sampling.link_sampling import (
    STREAM_LINK_VAL,
    held_out_pairs,
    link_batch_plan,
    sample_link_batch,
)
from loader.sampling.sampling import sample_pass
from proto.client import ControlClient, JobMember
from proto.errors import RemoteError, UserError
from proto.messages import Credit, EpochEnd, EvalEnd, EvalRequest, StartEpoch
from tests.daemon_harness import consume, daemon_config, running_daemon
from tests.graphs import link_input_graph, link_raw
from tests.loader.daemon.fullgraph.test_fullgraph_modes import credited_client
from trainer.link.inmemory import LinkInMemorySource

NODES = 400
BATCH = 64
FANOUTS = (4, 3)
MODES = ["exact", "static", "hybrid", "mmap", "inmemory"]


@pytest.fixture(scope="module")
def link_ds(tmp_path_factory):
    """400 nodes, an undirected graph of ~1,900 pairs split 0.8/0.1/0.1, 12 features, 7 negatives per held-out
    positive, 8 partitions; and what the in-memory reference reads of it."""
    root = tmp_path_factory.mktemp("link-serving")
    src, dst = link_input_graph(11, NODES, 1600, symmetric=True)
    raw = link_raw(root / "raw", src, dst, NODES, feat_dim=12, undirected=True, eval_negatives=7)
    prepare_dataset(raw.path, root / "ds", PrepareOptions(num_partitions=8, memory_budget=256 << 20, progress=False))
    dataset = open_dataset(root / "ds")
    return root / "ds", load_in_memory(dataset), dataset


def link_config(path, socket, mode, **tables):
    return daemon_config(path, socket, loader={"mode": mode}, io={"check_reads": mode != "mmap"},
                         sampler={"batch_size": BATCH, "fanouts": list(FANOUTS), "eval_fanouts": [3, 3],
                                  "eval_batch_size": 50},
                         memory={"budget": "256M"}, fullgraph={"superbatch": 3}, **tables)


def epoch_batches(client, epoch):
    batches, end = consume(client, StartEpoch(epoch=epoch), EpochEnd)
    return [arrays for _, arrays in batches]


@pytest.mark.parametrize("mode", MODES)
def test_training_batches_are_the_in_memory_reference(link_ds, tmp_path, mode):
    path, data, dataset = link_ds
    train = dataset.read("train_edges", np.int64, 2)
    negatives, disjoint = (2, True) if mode == "exact" else (1, False)
    config = link_config(path, tmp_path / "s.sock", mode, link={"negatives": negatives, "disjoint": disjoint})
    with running_daemon(config), credited_client(config, task="link") as client:
        info = client.welcome.dataset
        assert (info.task, info.link_negatives, info.link_disjoint, info.link_eval_negatives) == \
            ("link", negatives, disjoint, 7)
        assert info.link_positives[0] == train.shape[1] and info.link_order == "shuffled"
        epochs = {epoch: epoch_batches(client, epoch) for epoch in (1, 2)}
    for epoch, batches in epochs.items():
        plan = link_batch_plan(train.shape[1], BATCH, 0, epoch)
        assert len(batches) == plan.num_batches
        for b, arrays in enumerate(batches):
            positions, key = plan.batch(b)
            want = sample_link_batch(data.graph, train[0, positions], train[1, positions], NODES, FANOUTS, key,
                                     negatives_per_positive=negatives, disjoint=disjoint)
            np.testing.assert_array_equal(arrays["n_id"], want.nodes)
            np.testing.assert_array_equal(arrays["edge_index"], want.edge_index)
            np.testing.assert_array_equal(arrays["nodes_per_hop"], want.num_sampled_nodes)
            np.testing.assert_array_equal(arrays["edges_per_hop"], want.num_sampled_edges)
            np.testing.assert_array_equal(arrays["edge_label_index"], want.edge_label_index)
            np.testing.assert_array_equal(arrays["edge_label"], want.edge_label)
            assert arrays["x"].tobytes() == data.features[want.nodes].tobytes()
            assert "pair_index" not in arrays


def join_link(config, rank: int, world: int) -> ControlClient:
    client = ControlClient.connect(str(config.server.socket), client=f"rank {rank}", timeout=30, task="link",
                                   job=JobMember("j", rank, world, world))
    client.send(Credit(count=client.welcome.slots.count))
    return client


def two_rank_streams(config, epoch):
    with running_daemon(config):
        clients = [join_link(config, rank, 2) for rank in (0, 1)]
        try:
            with ThreadPoolExecutor(2) as pool:  # a job's ranks are published in lockstep: served at once
                return list(pool.map(lambda c: consume(c, StartEpoch(epoch=epoch), EpochEnd), clients))
        finally:
            for client in clients:
                client.close()


def assert_ranks_pieces(streams, dataset, epoch, **source):
    trained = 0
    for rank, (batches, end) in enumerate(streams):
        reference = list(LinkInMemorySource(dataset, batch_size=BATCH, fanouts=FANOUTS, rank=rank, world_size=2,
                                            **source).train_batches(epoch))
        assert end.batches == len(batches) == len(reference)
        for (ready, arrays), want in zip(batches, reference, strict=True):
            assert ready.num_batches == len(reference) and ready.global_seeds == want.global_positives
            np.testing.assert_array_equal(arrays["n_id"], want.graph.n_id.numpy())
            np.testing.assert_array_equal(arrays["edge_index"], want.graph.edge_index.numpy())
            np.testing.assert_array_equal(arrays["edge_label_index"], want.edge_label_index.numpy())
            np.testing.assert_array_equal(arrays["edge_label"], want.edge_label.numpy())
            assert arrays["x"].tobytes() == want.graph.x.numpy().tobytes()
            if want.edge_weight is None:
                assert "edge_weight" not in arrays
            else:
                assert arrays["edge_weight"].tobytes() == want.edge_weight.numpy().tobytes()
            trained += want.positives
    assert trained == dataset.read("train_edges", np.int64, 2).shape[1]  # every positive once over the ranks


def test_a_job_of_two_ranks_gets_the_in_memory_ranks_pieces(link_ds, tmp_path):
    path, _, dataset = link_ds
    config = link_config(path, tmp_path / "s.sock", "exact", link={"negatives": 2})
    assert_ranks_pieces(two_rank_streams(config, 1), dataset, 1, negatives=2)


@pytest.mark.parametrize("order", ["comet", "beta"])
def test_a_job_of_two_ranks_trains_the_buffer_order_as_two_ranks_in_memory(link_ds, tmp_path, order, monkeypatch):
    # passes of 3 batches: one step of the two ranks' pieces each (a pass holds whole steps)
    monkeypatch.setattr(pipeline, "LINK_PASS_BATCHES", 3)
    path, _, dataset = link_ds
    config = link_config(path, tmp_path / "s.sock", "hierarchical", hierarchy={"megabatch_fraction": 0.5},
                         link={"order": order, "negatives": 2})
    streams = two_rank_streams(config, 2)
    assert_ranks_pieces(streams, dataset, 2, negatives=2, link_order=order, buffer_partitions=4,
                        negative_weights=True)
    # the same states on both ranks, each global batch of 2 x BATCH cut once: as many steps as one rank of
    # 2 x BATCH trains
    alone = LinkInMemorySource(dataset, batch_size=2 * BATCH, fanouts=FANOUTS, link_order=order, buffer_partitions=4)
    assert len(streams[0][0]) == alone.buffer_epoch(2).num_batches


def test_evaluation_embeds_the_split_nodes_and_carries_each_positive_once(link_ds, tmp_path):
    path, data, dataset = link_ds
    held = held_out_pairs(dataset.read("val_edges", np.int64, 2), dataset.read("val_neg_tails", np.int64, 2))
    config = link_config(path, tmp_path / "s.sock", "exact")
    with running_daemon(config), credited_client(config, task="link") as client:
        batches = [arrays for _, arrays in consume(client, EvalRequest(split="val"), EvalEnd)[0]]
    plan = eval_split_batches(held.nodes, 50, 0, STREAM_LINK_VAL)
    expected = sample_pass(data.graph, plan.seeds, 50, (3, 3), plan.keys)
    assert len(batches) == expected.num_batches > 1
    for b, arrays in enumerate(batches):
        want = expected.batch(b)
        np.testing.assert_array_equal(arrays["n_id"], want.nodes)
        np.testing.assert_array_equal(arrays["edge_index"], want.edge_index)
        assert "edge_label_index" not in arrays
    seeds = np.concatenate([a["n_id"][:a["nodes_per_hop"][0]] for a in batches])
    np.testing.assert_array_equal(seeds, held.nodes)
    pairs = np.concatenate([a["pair_index"] for a in batches], axis=1)
    tails = np.concatenate([a["pair_tails"] for a in batches])
    np.testing.assert_array_equal(pairs, np.stack((held.src, held.dst)))
    np.testing.assert_array_equal(tails, held.tails)


def test_a_client_of_the_other_task_is_refused(link_ds, dataset_3k, tmp_path):
    path, _, _ = link_ds
    config = link_config(path, tmp_path / "s.sock", "exact")
    with running_daemon(config), pytest.raises(RemoteError, match="serves link prediction .* --task link"):
        ControlClient.connect(str(config.server.socket), client="test", timeout=30)
    config = daemon_config(dataset_3k, tmp_path / "n.sock", loader={"mode": "exact"}, memory={"budget": "256M"})
    with running_daemon(config), pytest.raises(RemoteError, match="serves node classification .* --task node"):
        ControlClient.connect(str(config.server.socket), client="test", timeout=30, task="link")


@pytest.mark.parametrize("order, logical, weighted, assignment", [
    ("comet", None, True, "edge"), ("comet", 4, True, "edge"), ("beta", None, True, "edge"),
    ("comet", None, False, "edge"), ("comet", None, True, "bucket")])
def test_the_hierarchical_mode_trains_the_buffer_order_of_the_in_memory_emulation(link_ds, tmp_path, order, logical,
                                                                                   weighted, assignment, monkeypatch):
    path, _, dataset = link_ds
    if logical is not None:  # states cut into passes of 2 batches: the same batches, in the same order
        monkeypatch.setattr(pipeline, "LINK_PASS_BATCHES", 2)
    link = {"order": order, "negatives": 2, "disjoint": order == "beta"}
    if logical is not None:
        link["logical_partitions"] = logical
    if not weighted:
        link["negative_weights"] = False
    if assignment != "edge":  # [link] assignment, "edge" by default
        link["assignment"] = assignment
    config = link_config(path, tmp_path / "s.sock", "hierarchical", hierarchy={"megabatch_fraction": 0.5}, link=link)
    with running_daemon(config) as daemon, credited_client(config, task="link") as client:
        assert daemon.mode.summary() == f"link prediction in {order} order, a buffer of 4 of 8 partitions"
        assert client.welcome.dataset.link_order == order  # the trainer's default lr depends on it
        # its states measure no coverage or skew: `megabatch status` says nothing of training quality
        assert daemon.metrics.build_info._value["measures_quality"] == "false"
        epochs = {epoch: epoch_batches(client, epoch) for epoch in (1, 2)}
        reads = daemon.metrics.disk_bytes.labels("features", "train")._value.get()
        loaded = {source: daemon.metrics.partitions_loaded.labels(source)._value.get()
                  for source in ("disk", "previous")}
    reference = LinkInMemorySource(dataset, batch_size=BATCH, negatives=2, disjoint=order == "beta", fanouts=FANOUTS,
                                   link_order=order, buffer_partitions=4, logical_partitions=logical,
                                   negative_weights=weighted,  # [link] negative_weights, true by default
                                   assignment=assignment)
    assert reads > 0  # each state's partitions come from the disk, or from the previous state's buffer
    # consecutive states share partitions: those are copied from the other buffer (and the batches above are
    # still the reference's)
    assert loaded["previous"] > 0 and loaded["disk"] > 0
    for epoch, batches in epochs.items():
        want = list(reference.train_batches(epoch))
        assert len(batches) == len(want) == reference.buffer_epoch(epoch).num_batches
        trained = []
        for arrays, expected in zip(batches, want, strict=True):
            np.testing.assert_array_equal(arrays["n_id"], expected.graph.n_id.numpy())
            np.testing.assert_array_equal(arrays["edge_index"], expected.graph.edge_index.numpy())
            np.testing.assert_array_equal(arrays["nodes_per_hop"], expected.graph.num_sampled_nodes)
            np.testing.assert_array_equal(arrays["edge_label_index"], expected.edge_label_index.numpy())
            np.testing.assert_array_equal(arrays["edge_label"], expected.edge_label.numpy())
            if weighted:
                assert arrays["edge_weight"].tobytes() == expected.edge_weight.numpy().tobytes()
                assert not (arrays["edge_weight"] == 1).all()  # some negative shares its pair's partitions
            else:
                assert "edge_weight" not in arrays and expected.edge_weight is None
            assert arrays["x"].tobytes() == expected.graph.x.numpy().tobytes()
            seeds = arrays["n_id"][:arrays["nodes_per_hop"][0]]
            positives = arrays["edge_label_index"][:, arrays["edge_label"] == 1]
            trained.append(seeds[positives])
        # every training edge once an epoch
        pairs = np.concatenate(trained, axis=1)
        train = dataset.read("train_edges", np.int64, 2)
        assert sorted(map(tuple, pairs.T.tolist())) == sorted(map(tuple, train.T.tolist()))


def test_a_hierarchical_buffer_of_every_partition_trains_the_shuffled_order(link_ds, tmp_path):
    path, data, dataset = link_ds
    train = dataset.read("train_edges", np.int64, 2)
    config = link_config(path, tmp_path / "s.sock", "hierarchical", hierarchy={"megabatch_fraction": 1.0})
    with running_daemon(config) as daemon, credited_client(config, task="link") as client:
        assert daemon.mode.summary() == "8 partitions, 8 per mega-batch"
        assert client.welcome.dataset.link_order == "shuffled"
        batches = epoch_batches(client, 3)
    plan = link_batch_plan(train.shape[1], BATCH, 0, 3)
    assert len(batches) == plan.num_batches
    for b, arrays in enumerate(batches):
        positions, key = plan.batch(b)
        want = sample_link_batch(data.graph, train[0, positions], train[1, positions], NODES, FANOUTS, key)
        np.testing.assert_array_equal(arrays["n_id"], want.nodes)
        np.testing.assert_array_equal(arrays["edge_index"], want.edge_index)
        np.testing.assert_array_equal(arrays["edge_label_index"], want.edge_label_index)


@pytest.mark.parametrize("tables, fragment", [
    ({"loader": {"mode": "hierarchical"}, "hierarchy": {"megabatch_fraction": 0.125}},
     "a link buffer needs 2 partitions and the mega-batch holds 1 of 8"),
    ({"loader": {"mode": "hierarchical"}, "hierarchy": {"megabatch_fraction": 0.5}, "link": {"logical_partitions": 3}},
     r"\[link\] logical_partitions: "),
    ({"loader": {"mode": "staged"}}, "mode staged: ds is a link-prediction dataset"),
    ({"loader": {"mode": "exact"}, "sampler": {"aggregation_cache": True}},
     "aggregation_cache: not with a link-prediction dataset"),
])
def test_what_cannot_serve_a_link_dataset_is_refused_in_one_line(link_ds, tmp_path, tables, fragment):
    path, _, _ = link_ds
    config = config_from_mapping({"dataset": {"path": str(path)}, "server": {"socket": str(tmp_path / "s.sock")},
                                  "metrics": {"port": 0}, **tables})
    with pytest.raises(UserError, match=fragment) as err:
        check_serve(config, tmp_path / "config.toml")
    assert "\n" not in str(err.value)


def test_link_config_table_is_checked():
    base = {"dataset": {"path": "x"}}
    assert config_from_mapping({**base, "link": {"negatives": 3, "disjoint": True}}).link.negatives == 3
    assert config_from_mapping(base).link.negative_weights is True
    assert config_from_mapping({**base, "link": {"negative_weights": False}}).link.negative_weights is False
    assert config_from_mapping(base).link.assignment == "edge"
    assert config_from_mapping({**base, "link": {"assignment": "bucket"}}).link.assignment == "bucket"
    assert LINK_ASSIGNMENTS == ASSIGNMENTS  # the config's choices are the sampler's (config imports no sampler)
    for bad, fragment in (({"negatives": 0}, r"\[link\] negatives: must be >= 1"),
                          ({"negative_weights": "yes"}, r"\[link\] negative_weights: expected true or false"),
                          ({"disjoint": 1}, r"\[link\] disjoint: expected true or false"),
                          ({"negative": 2}, r"\[link\] negative: unknown option"),
                          ({"order": "marius"}, r"\[link\] order: expected one of comet, beta"),
                          ({"order": "beta", "logical_partitions": 4}, "BETA swaps physical partitions"),
                          ({"assignment": "pair"}, r"\[link\] assignment: expected one of edge, bucket"),
                          ({"order": "beta", "assignment": "edge"}, "BETA trains each bucket in its first")):
        with pytest.raises(UserError, match=fragment):
            config_from_mapping({**base, "link": bad})


@pytest.mark.parametrize("fraction, warned", [(0.5, True), (1.0, False)])
def test_a_buffer_order_warns_at_startup_that_it_costs_accuracy(link_ds, tmp_path, caplog, fraction, warned):
    path, _, _ = link_ds
    config = link_config(path, tmp_path / "s.sock", "hierarchical", hierarchy={"megabatch_fraction": fraction})
    with caplog.at_level(logging.WARNING, logger="megabatch"), running_daemon(config):
        pass
    lines = [r.getMessage() for r in caplog.records if "compare with mode exact" in r.getMessage()]
    assert len(lines) == (1 if warned else 0), lines
    if warned:
        assert lines[0].startswith("link order comet with a buffer of 4 of 8 partitions: at the trainer's default "
                                   "learning rates, with a buffer of a quarter of the graph, COMET")
