"""``[sampler] aggregation_cache``: every mode serves batches of one hop fewer carrying ``x_agg``, each node's row of
the dataset's aggregation cache; the exact family's batches are still the in-memory reference's."""

import shutil

import numpy as np
import pytest

from loader.daemon.check import check_serve
from loader.daemon.config import config_from_mapping
from loader.format.aggregates import read_aggregates
from loader.format.dataset import open_dataset
from loader.offline.aggregation import build_aggregation_cache
from loader.sampling.inmemory import epoch_batches_inmemory, eval_split_batches, split_stream
from loader.sampling.sampling import sample_pass
from proto.client import ControlClient
from proto.errors import RemoteError, UserError
from proto.messages import EvalEnd, EvalRequest
from tests.daemon_harness import consume, daemon_config, running_daemon
from tests.loader.daemon.fullgraph.test_fullgraph_modes import BATCH_SIZE, FANOUTS, consume_epoch, credited_client

MODES = ["inmemory", "mmap", "exact", "static", "staged", "hybrid", "hierarchical"]


@pytest.fixture(scope="module")
def aggregated_3k(dataset_3k, tmp_path_factory):
    """A copy of ``dataset_3k`` with a mean aggregation cache, and its rows in node order."""
    copy = tmp_path_factory.mktemp("aggregated") / "dataset"
    shutil.copytree(dataset_3k, copy)
    build_aggregation_cache(copy, "mean", 1 << 20)
    return copy, read_aggregates(open_dataset(copy))[1]


def aggregated_config(path, socket, mode, **tables):
    staging = {"staging_dir": str(socket.parent / "staging")} if mode == "staged" else {}
    if staging:
        (socket.parent / "staging").mkdir(exist_ok=True)
    sampler = {"batch_size": BATCH_SIZE, "fanouts": list(FANOUTS), "aggregation_cache": True,
               **tables.pop("sampler", {})}
    return daemon_config(path, socket, loader={"mode": mode}, sampler=sampler, memory={"budget": "512M"},
                         io={"check_reads": mode != "mmap", **tables.pop("io", {})},
                         fullgraph={"superbatch": 4, **staging}, **tables)


def consume_eval(client, split):
    """An evaluation stream's batches, each as its arrays by name."""
    batches, _ = consume(client, EvalRequest(split=split), EvalEnd)
    return [arrays for _, arrays in batches]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_serves_one_hop_fewer_and_each_nodes_aggregate(aggregated_3k, reference_3k, tmp_path, mode):
    path, aggregates = aggregated_3k
    config = aggregated_config(path, tmp_path / "s.sock", mode)
    with running_daemon(config) as daemon, credited_client(config, aggregation=True) as client:
        info = client.welcome.dataset
        assert (info.aggregation, info.eval_aggregation, info.num_hops, info.fanouts) == ("mean", True, 2,
                                                                                          list(FANOUTS))
        batches = consume_epoch(client, 0)
        evaluation = consume_eval(client, "val")
        read = daemon.metrics.disk_bytes.labels("aggregates", "train")._value.get()
    assert read > 0  # x_agg is read from the cache's file, and the reads are counted under it
    for arrays in batches + evaluation:
        assert len(arrays["nodes_per_hop"]) == 2  # seeds and one sampled hop: the cache stands in for the second
        np.testing.assert_array_equal(arrays["x_agg"], aggregates[arrays["n_id"]])
    if mode != "hierarchical":  # the exact family: the reference's batches, sampled with the first fanout only
        plan = epoch_batches_inmemory(reference_3k.splits["train"], BATCH_SIZE, 0, 0)
        expected = sample_pass(reference_3k.graph, plan.seeds, BATCH_SIZE, FANOUTS[:1], plan.keys)
        assert len(batches) == expected.num_batches
        for b, arrays in enumerate(batches):
            want = expected.batch(b)
            np.testing.assert_array_equal(arrays["n_id"], want.nodes)
            np.testing.assert_array_equal(arrays["edge_index"], want.edge_index)
            assert arrays["x"].tobytes() == reference_3k.features[want.nodes].tobytes()


def test_evaluation_samples_every_hop_where_eval_aggregation_is_off(aggregated_3k, reference_3k, tmp_path):
    path, _ = aggregated_3k
    config = aggregated_config(path, tmp_path / "s.sock", "exact", sampler={"eval_aggregation": False})
    with running_daemon(config), credited_client(config, aggregation=True) as client:
        assert client.welcome.dataset.eval_aggregation is False
        evaluation = consume_eval(client, "val")
        train = consume_epoch(client, 0)
    plan = eval_split_batches(reference_3k.splits["val"], 128, 0, split_stream("val"))
    expected = sample_pass(reference_3k.graph, plan.seeds, 128, FANOUTS, plan.keys)
    assert len(evaluation) == expected.num_batches
    for b, arrays in enumerate(evaluation):
        assert "x_agg" not in arrays
        np.testing.assert_array_equal(arrays["n_id"], expected.batch(b).nodes)
    assert all("x_agg" in arrays for arrays in train)


def test_the_trainer_cache_plan_and_x_agg_travel_together(aggregated_3k, reference_3k, tmp_path):
    path, aggregates = aggregated_3k
    config = aggregated_config(path, tmp_path / "s.sock", "exact")
    with running_daemon(config), credited_client(config, aggregation=True, feature_cache_bytes=64 << 10) as client:
        assert client.welcome.feature_cache_rows > 0
        batches = consume_epoch(client, 0)
    assert any(len(arrays["x"]) < len(arrays["n_id"]) for arrays in batches)  # the cache holds some rows
    for arrays in batches:
        assert "hit_slot" in arrays
        np.testing.assert_array_equal(arrays["x_agg"], aggregates[arrays["n_id"]])


def test_a_client_that_does_not_read_x_agg_is_refused_in_one_line(aggregated_3k, tmp_path):
    path, _ = aggregated_3k
    config = aggregated_config(path, tmp_path / "s.sock", "inmemory")
    with running_daemon(config) as daemon:
        with pytest.raises(RemoteError, match="carry x_agg .*does not read"):
            ControlClient.connect(str(config.server.socket), client="old", timeout=30)
        assert daemon.metrics.refused_connections.labels("aggregation")._value.get() == 1


def test_a_dataset_without_a_cache_is_refused_at_startup_naming_the_command(dataset_3k, tmp_path):
    config = aggregated_config(dataset_3k, tmp_path / "s.sock", "exact")
    with pytest.raises(UserError, match="has no aggregation cache; build one with 'megabatch aggregate"), \
            running_daemon(config):
        pass


def test_the_cache_needs_two_hops(dataset_3k, tmp_path):
    with pytest.raises(UserError, match=r"\[sampler\] aggregation_cache: needs at least 2 hops"):
        config_from_mapping({"dataset": {"path": str(dataset_3k)},
                             "sampler": {"fanouts": [5], "aggregation_cache": True}})


@pytest.mark.parametrize("mode", ["exact", "hierarchical"])
def test_a_corrupt_aggregate_row_fails_the_stream_not_the_daemon(aggregated_3k, tmp_path, mode):
    path, _ = aggregated_3k
    damaged = tmp_path / "damaged"
    shutil.copytree(path, damaged)
    cache_file = damaged / "aggregates-mean.bin"
    data = bytearray(cache_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the read checks can tell
    cache_file.write_bytes(bytes(data))
    config = aggregated_config(damaged, tmp_path / "s.sock", mode, hierarchy={"megabatch_fraction": 1.0})
    with running_daemon(config):
        with credited_client(config, aggregation=True) as client, \
                pytest.raises(RemoteError, match="data_corrupt.*aggregates-mean"):
            consume_epoch(client, 0)
            consume_eval(client, "val")
            consume_eval(client, "test")
        with credited_client(config, aggregation=True) as client:  # the daemon serves on
            assert client.welcome.dataset.aggregation == "mean"


def test_serve_check_prices_the_cache(aggregated_3k, tmp_path):
    path, _ = aggregated_3k
    on = check_serve(aggregated_config(path, tmp_path / "s.sock", "exact"), "on.toml")
    assert "# aggregation cache (mean) on: a training batch fetches about" in on
    off = check_serve(daemon_config(path, tmp_path / "s.sock"), "off.toml")
    assert "aggregation cache (mean) off ([sampler] aggregation_cache = true turns it on)" in off


def registry_samples(registry):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples}


@pytest.mark.parametrize("enabled", [True, False])
def test_status_reports_the_cost_model_and_what_a_batch_served(aggregated_3k, tmp_path, enabled):
    from loader.daemon.status import format_status, status_fields

    path, _ = aggregated_3k
    config = aggregated_config(path, tmp_path / "s.sock", "exact", sampler={"aggregation_cache": enabled})
    with running_daemon(config) as daemon, credited_client(config, aggregation=True) as client:
        batches = consume_epoch(client, 0)
        samples = registry_samples(daemon.metrics.registry)
    fields = status_fields(samples, now=0.0)["aggregation"]
    assert fields["enabled"] is enabled
    rows = fields["estimate_rows"]
    assert rows["with"] > 0 and rows["without"] > 0
    served = sum((a["x"].size + a.get("x_agg", a["x"][:0]).size) * 4 for a in batches) / len(batches)
    assert fields["served_bytes_per_batch"] == pytest.approx(served)
    line = next(line for line in format_status(samples).splitlines() if line.startswith("aggregation cache"))
    assert line.startswith(f"aggregation cache {'on' if enabled else 'off'}: a training batch fetches about")


def test_status_says_nothing_of_a_cache_the_dataset_lacks(dataset_3k, tmp_path):
    from loader.daemon.status import format_status, status_fields

    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config) as daemon:
        samples = registry_samples(daemon.metrics.registry)
    assert status_fields(samples, now=0.0)["aggregation"] is None
    assert "aggregation" not in format_status(samples)


@pytest.mark.parametrize("static_cache", [False, True])
def test_the_hierarchical_arena_holds_its_partitions_aggregates(aggregated_3k, tmp_path, monkeypatch, static_cache):
    """A mega-batch's x_agg rows are read with its partitions (one range each, beside the features) and the static
    nodes' once at startup, by id; batches gather them all from the arena, and no training batch reads a row by
    id."""
    from loader.daemon.aggregate_rows import AggregateRows

    path, aggregates = aggregated_3k
    by_id: list[tuple[int, str]] = []
    fill = AggregateRows.fill

    def counted(self, ids, out, purpose, positions=None):
        by_id.append((len(ids), purpose))
        return fill(self, ids, out, purpose, positions)

    monkeypatch.setattr(AggregateRows, "fill", counted)
    config = aggregated_config(path, tmp_path / "s.sock", "hierarchical",
                               hierarchy={"static_cache": static_cache, "megabatch_fraction": 0.25})
    with running_daemon(config) as daemon, credited_client(config, aggregation=True) as client:
        plan = daemon.mode.budget_plan
        static_nodes = daemon.mode.context.resident.static.num_nodes
        batches = consume_epoch(client, 0)
        ranges = daemon.metrics.disk_reads.labels("aggregates", "train")._value.get()
    assert plan.buffer.aggregate_bytes > 0 and "with their aggregates" in plan.describe()
    for arrays in batches:
        np.testing.assert_array_equal(arrays["x_agg"], aggregates[arrays["n_id"]])
    assert ranges >= 16  # every partition's range, once an epoch
    assert [n for n, purpose in by_id if purpose == "train"] == []
    assert (static_nodes > 0) == static_cache
    assert [n for n, purpose in by_id if purpose == "startup"] == ([static_nodes] if static_cache else [])

