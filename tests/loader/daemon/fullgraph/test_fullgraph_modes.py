"""The full-graph daemon modes serve exactly the batches of the in-memory reference (``--mode inmemory``)."""

import logging
from contextlib import contextmanager

import numpy as np
import pytest

from loader.format.dataset import open_dataset
from loader.sampling.inmemory import epoch_batches_inmemory, load_in_memory
from loader.sampling.sampling import sample_pass
from proto.client import ControlClient
from proto.errors import UserError
from proto.messages import BatchReady, Credit, EpochEnd, Release, StartEpoch
from tests.daemon_harness import daemon_config, running_daemon

BATCH_SIZE, FANOUTS = 64, (5, 3)


def reference_epoch(ref, epoch):
    plan = epoch_batches_inmemory(ref.splits["train"], BATCH_SIZE, 0, epoch)
    return sample_pass(ref.graph, plan.seeds, BATCH_SIZE, FANOUTS, plan.keys)


@contextmanager
def credited_client(config, **hello):
    """A client of the running daemon of ``config`` that has credited all its slots (``hello``: ``connect``'s
    optional Hello fields, e.g. ``aggregation=True``)."""
    client = ControlClient.connect(str(config.server.socket), client="test", timeout=30, **hello)
    try:
        client.send(Credit(count=client.welcome.slots.count))
        yield client
    finally:
        client.close()


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


def unchecked_if_mapped(mode: str) -> dict[str, bool]:
    """Mode mmap runs only with the read checks off (it refuses to start otherwise)."""
    return {"check_reads": False} if mode == "mmap" else {}


@pytest.mark.parametrize("mode, exact", [
    ("inmemory", {"superbatch": 1}), ("inmemory", {"superbatch": 3}), ("mmap", {}),
    ("exact", {"superbatch": 4, "sample_group": 3}),  # auto caches
    ("exact", {"superbatch": 5, "neighbor_cache": 0, "feature_cache": 0}),  # everything from disk
    ("exact", {"superbatch": 2, "neighbor_cache": "20K", "feature_cache": "3K"}),  # tiny caches
    ("exact", {"superbatch": 64, "feature_cache": "64M", "neighbor_cache": "8M"}),  # all of it cached
    ("static", {"superbatch": 3, "neighbor_cache": 0, "feature_cache": "40K"}),
    ("static", {"superbatch": 7, "feature_cache": 0}),
    ("staged", {"superbatch": 6, "neighbor_cache": 0, "feature_cache": 0}),  # every row staged, every list read
    ("staged", {"superbatch": 5, "feature_cache": "40K"}),  # the cache's rows copied, the others staged
    ("staged", {"superbatch": 64, "feature_cache": 0}),  # an epoch in one superbatch
    ("hybrid", {"superbatch": 4, "neighbor_cache": 0, "feature_cache": 0}),  # nothing resident, every row read
    ("hybrid", {"superbatch": 5, "feature_cache": "600K"}),  # some partitions resident, a Belady cache beside them
    ("hybrid", {"superbatch": 64, "feature_cache": "64M"}),  # an epoch in one superbatch, all of it resident
])
def test_mode_serves_the_reference_batches_bitwise(dataset_3k, reference_3k, tmp_path, mode, exact):
    if mode == "staged":
        (tmp_path / "staging").mkdir()
        exact = {**exact, "staging_dir": str(tmp_path / "staging")}
    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": mode}, fullgraph=exact,
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)}, memory={"budget": "512M"},
                           io=unchecked_if_mapped(mode))
    with running_daemon(config), credited_client(config) as client:
        assert client.welcome.dataset.mode == mode
        for epoch in (0, 1):
            assert_same_as_reference(consume_epoch(client, epoch), reference_3k, epoch)


def test_staged_mode_with_direct_io_serves_the_reference_bitwise(dataset_3k, reference_3k, tmp_path):
    """O_DIRECT everywhere: the file's chunks, the staging writes (whole pages, each batch's partial page held
    between runs), the spilled edges and the read-backs."""
    (tmp_path / "staging").mkdir()
    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": "staged"}, io={"direct_io": True},
                           fullgraph={"superbatch": 7, "feature_cache": "40K",
                                      "staging_dir": str(tmp_path / "staging")},
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)}, memory={"budget": "512M"})
    with running_daemon(config) as daemon, credited_client(config) as client:
        assert daemon.mode.stager.direct
        for epoch in (0, 1):
            assert_same_as_reference(consume_epoch(client, epoch), reference_3k, epoch)
    assert not list((tmp_path / "staging").iterdir())


@pytest.mark.parametrize("plan_batches, feature_cache", [(1, 0), (2, "40K"), (3, 0)])
def test_staged_superbatches_whose_misses_exceed_the_plan_are_staged_in_windows(
        dataset_3k, reference_3k, tmp_path, monkeypatch, plan_batches, feature_cache):
    """A superbatch whose uncached rows exceed the plan's charge (``STAGED_PLAN_BATCHES`` batches' worth) is staged
    in windows of consecutive batches, each within the charge (or a single batch), a pass each; its batches are the
    reference's all the same, and every window's staging file goes back. Every chunk is staged (windows of a
    batch or two would leave them to direct reads by the cost model), in chunks of 8 KiB."""
    from loader.daemon.fullgraph import outofcore, staged
    from loader.staging import window_plan

    monkeypatch.setattr(window_plan, "chunk_costs", lambda keys, shift, chunks, *args: (np.zeros(chunks),
                                                                                        np.ones(chunks)))
    monkeypatch.setattr(outofcore, "STAGING_CHUNK", 8192)
    windows: list[tuple[int, int, int]] = []  # (batches, staged rows, the plan's charge in rows)
    stage_window = staged.StagedMode._stage_window

    def recorded(self, plan, stopped):
        windows.append((plan.num_batches, plan.staged_rows, self.budget_plan.plan_rows))
        return stage_window(self, plan, stopped)

    monkeypatch.setattr(outofcore, "STAGED_PLAN_BATCHES", plan_batches)
    monkeypatch.setattr(staged.StagedMode, "_stage_window", recorded)
    (tmp_path / "staging").mkdir()
    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": "staged"},
                           fullgraph={"superbatch": 7, "feature_cache": feature_cache,
                                  "staging_dir": str(tmp_path / "staging")},
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)}, memory={"budget": "512M"})
    with running_daemon(config) as daemon, credited_client(config) as client:
        epochs = [consume_epoch(client, epoch) for epoch in (0, 1)]
        assert daemon.mode.stager.staging_file_bytes > 0
    for epoch, batches in enumerate(epochs):
        assert_same_as_reference(batches, reference_3k, epoch)
    superbatches = 2 * -(-len(epochs[0]) // 7)
    assert len(windows) > superbatches  # split
    assert all(rows <= charge or count == 1 for count, rows, charge in windows)
    assert all(rows > 0 for count, rows, charge in windows if count)
    assert max(count for count, _, _ in windows) > 1 or plan_batches == 1  # not one batch a window
    assert not list((tmp_path / "staging").iterdir())


@pytest.mark.parametrize("choice", ["all direct", "every other chunk"])
def test_staged_mode_serves_the_reference_with_rows_left_to_direct_reads(dataset_3k, reference_3k, tmp_path,
                                                                         monkeypatch, choice, caplog):
    """Rows whose chunk the cost model does not stage are read at random at publish; cached, direct and staged
    rows meet in one batch and it is still the reference's. The cache is loaded by one pass over the file."""
    from loader.daemon.fullgraph import outofcore
    from loader.staging import window_plan

    def costs(keys, shift, chunks, entries, *args):
        if choice == "every other chunk":
            return np.where(np.arange(chunks) % 2 == 0, 0.0, 2.0), np.ones(chunks)
        return np.full(chunks, 2.0), np.ones(chunks)

    monkeypatch.setattr(window_plan, "chunk_costs", costs)
    monkeypatch.setattr(outofcore, "STAGING_CHUNK", 8192)  # many chunks in a small file
    (tmp_path / "staging").mkdir()
    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": "staged"},
                           fullgraph={"superbatch": 4, "feature_cache": "20K",
                                      "staging_dir": str(tmp_path / "staging")},
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)}, memory={"budget": "512M"})
    with caplog.at_level(logging.INFO, logger="megabatch.outofcore"), running_daemon(config) as daemon:
        assert "staged feature cache loaded by one pass" in caplog.text
        with credited_client(config) as client:
            assert_same_as_reference(consume_epoch(client, 0), reference_3k, 0)
        rows = daemon.metrics.staging_written_bytes.labels("rows")._value.get()
        assert (rows == 0) == (choice == "all direct")
        assert daemon.metrics.staging_written_bytes.labels("edges")._value.get() > 0  # the edges are spilled
        # the files are kept for later superbatches: the gauges say what they take on disk
        assert daemon.metrics.staging_file_bytes.labels("edges")._value.get() > 0
        assert (daemon.metrics.staging_file_bytes.labels("rows")._value.get() == 0) == (choice == "all direct")


def test_inmemory_mode_refuses_a_budget_it_cannot_fit(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": "inmemory"}, memory={"budget": "300K"},
                           publisher={"slots": 1, "slot_bytes": "64K"}, server={"max_clients": 1})
    with pytest.raises(UserError, match="too small for mode inmemory: .*graph and features"), running_daemon(config):
        pass


def _lookups(daemon, family, results=("hit", "miss")):
    counter = getattr(daemon.metrics, family)
    return {r: counter.labels(r)._value.get() for r in results}


def _epoch_lookups(dataset, tmp_path, mode, exact, results=("hit", "miss")):
    config = daemon_config(dataset, tmp_path / f"{mode}.sock", loader={"mode": mode}, fullgraph=exact,
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)}, memory={"budget": "512M"})
    with running_daemon(config) as daemon:
        with credited_client(config) as client:
            batches = consume_epoch(client, 0)
        return sum(len(b["n_id"]) for b in batches), _lookups(daemon, "feature_cache_lookups", results), \
            _lookups(daemon, "neighbor_cache_lookups")


def test_belady_cache_misses_no_more_than_the_static_cache_of_the_same_size(dataset_3k, tmp_path):
    caches = {"superbatch": 8, "feature_cache": "16K", "neighbor_cache": 0}  # 256 rows of 64 B
    rows, exact, _ = _epoch_lookups(dataset_3k, tmp_path, "exact", caches)
    rows_static, static, _ = _epoch_lookups(dataset_3k, tmp_path, "static", caches)
    assert rows == rows_static == exact["hit"] + exact["miss"] == static["hit"] + static["miss"]
    assert 0 < exact["miss"] <= static["miss"] and exact["hit"] > 0


def test_hybrid_serves_rows_from_resident_partitions_and_its_belady_cache(dataset_3k, tmp_path):
    results = ("resident", "hit", "miss", "fill")
    # 600K of feature bytes: 100K of partitions per superbatch in flight (1,600 of the 2,500 rows), 300K of cache
    rows, features, _ = _epoch_lookups(dataset_3k, tmp_path, "hybrid", {"superbatch": 5, "feature_cache": "600K"},
                                       results)
    assert features["resident"] + features["hit"] + features["miss"] == rows
    assert features["resident"] > 0 and features["hit"] > 0 and features["fill"] == 0
    rows, features, _ = _epoch_lookups(dataset_3k, tmp_path, "hybrid", {"superbatch": 5, "feature_cache": 0}, results)
    assert features == {"resident": 0, "hit": 0, "miss": rows, "fill": 0}


def test_zero_caches_serve_everything_from_disk_and_full_caches_nothing(dataset_3k, tmp_path):
    rows, features, lists = _epoch_lookups(dataset_3k, tmp_path, "exact",
                                           {"superbatch": 4, "feature_cache": 0, "neighbor_cache": 0})
    assert features == {"hit": 0, "miss": rows} and lists["hit"] == 0 and lists["miss"] > 0
    _, _, lists = _epoch_lookups(dataset_3k, tmp_path, "static", {"neighbor_cache": "8M", "feature_cache": "64M"})
    assert lists["miss"] == 0 and lists["hit"] > 0


@pytest.fixture(scope="module")
def physics(tmp_path_factory):
    """coauthor-physics: the real graph, labels and the first 32 of its 8415 feature columns (a 1 GiB
    feature matrix would only slow the test; rows are gathered by id either way)."""
    from loader.offline.importers import import_dataset
    from loader.offline.prepare import PrepareOptions, prepare_dataset
    from tests.graphs import shared_graph

    z = np.load(shared_graph("coauthor-physics.npz"))
    root = tmp_path_factory.mktemp("physics")
    n = int(z["adj_shape"][0])
    rows = np.repeat(np.arange(n), np.diff(z["attr_indptr"]))  # features are stored as CSR
    keep = z["attr_indices"] < 32
    columns = np.zeros((n, 32), dtype=np.float32)
    columns[rows[keep], z["attr_indices"][keep]] = z["attr_data"][keep]
    np.savez(root / "physics.npz", adj_data=z["adj_data"], adj_indices=z["adj_indices"], adj_indptr=z["adj_indptr"],
             adj_shape=z["adj_shape"], labels=z["labels"], attr_matrix=np.asarray(columns, dtype=np.float32))
    import_dataset(root / "physics.npz", root / "raw", fmt="npz", memory_budget=256 << 20, progress=False)
    prepare_dataset(root / "raw", root / "ds", PrepareOptions(num_partitions=16, memory_budget=256 << 20,
                                                              progress=False))
    return root / "ds"


@pytest.mark.parametrize("mode, exact", [
    ("exact", {"superbatch": 6, "neighbor_cache": "256K", "feature_cache": "512K"}),
    # the same batches, so GraphSAGE trains to the reference's accuracy through it, digit for digit
    ("staged", {"superbatch": 24, "neighbor_cache": "256K", "feature_cache": "512K"}),
    ("hybrid", {"superbatch": 8, "neighbor_cache": "256K", "feature_cache": "1M"})])
def test_out_of_core_modes_on_coauthor_physics_equal_the_reference_bitwise(physics, tmp_path, mode, exact):
    ref = load_in_memory(open_dataset(physics))
    (tmp_path / "staging").mkdir()
    config = daemon_config(physics, tmp_path / "s.sock", loader={"mode": mode}, memory={"budget": "256M"},
                           fullgraph={**exact, "staging_dir": str(tmp_path / "staging")},
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS)})
    with running_daemon(config), credited_client(config) as client:
        assert_same_as_reference(consume_epoch(client, 0), ref, 0)


@pytest.mark.parametrize("mode, exact", [
    ("hierarchical", {}), ("inmemory", {}), ("mmap", {}), ("exact", {"neighbor_cache": "16K", "feature_cache": "8K"}),
    ("static", {"neighbor_cache": 0, "feature_cache": "40K"}),
    ("staged", {"neighbor_cache": 0, "feature_cache": "40K"}),
    ("hybrid", {"neighbor_cache": 0, "feature_cache": "600K"})])
def test_eval_batches_equal_the_reference_in_every_mode(dataset_3k, reference_3k, tmp_path, mode, exact):
    from loader.sampling.inmemory import STREAM_VAL, eval_split_batches
    from proto.messages import EvalEnd, EvalRequest

    config = daemon_config(dataset_3k, tmp_path / "s.sock", loader={"mode": mode}, fullgraph=exact,
                           memory={"budget": "512M"},
                           sampler={"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS), "eval_batch_size": 200},
                           io=unchecked_if_mapped(mode))
    plan = eval_split_batches(reference_3k.splits["val"], 200, 0, STREAM_VAL)
    expected = sample_pass(reference_3k.graph, plan.seeds, 200, FANOUTS, plan.keys)
    with running_daemon(config), credited_client(config) as client:
        client.send(EvalRequest(split="val"))
        b = 0
        while not isinstance(msg := client.recv(timeout=60), EvalEnd):
            arrays = client.read_batch(msg).arrays
            want = expected.batch(b)
            np.testing.assert_array_equal(arrays["n_id"], want.nodes)
            np.testing.assert_array_equal(arrays["edge_index"], want.edge_index)
            assert np.asarray(arrays["x"]).tobytes() == reference_3k.features[want.nodes].tobytes()
            client.send(Release(slot=msg.slot, seq=msg.seq))
            b += 1
        assert b == expected.num_batches == msg.batches
