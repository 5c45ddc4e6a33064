"""The trainer-side feature cache, end to end: loader.daemon.trainer_cache plans it per superbatch, the slots carry
only the rows it lacks, trainer.device_cache assembles x, and every batch equals a cache-less client's bitwise."""

import msgpack
import numpy as np
import pytest
import torch

import proto.client
from proto.messages import message_to_map
from tests.daemon_harness import daemon_config, running_daemon
from trainer.batch import Batch, DeviceCachePlan
from trainer.daemon_source import DaemonSource
from trainer.device_cache import CacheOutOfStep, DeviceFeatureCache
from trainer.loop import TrainConfig, train

NODES, DIM = 1500, 16  # dataset_1500's nodes and features
ROW_BYTES = DIM * 4
EPOCHS = (0, 1)


def config_for(dataset, tmp_path, mode):
    exact = {"superbatch": 4, "feature_cache": "8K"} if mode in ("exact", "staged") else {}
    return daemon_config(dataset, tmp_path / "s.sock", loader={"mode": mode}, fullgraph=exact,
                         memory={"budget": "512M"})


def consume(socket, cache_bytes):
    """Per epoch, per batch: (n_id, assembled x, shipped rows); and the accepted cache rows."""
    source = DaemonSource(str(socket), timeout=30, feature_cache_bytes=cache_bytes)
    rows = source.info.feature_cache_rows
    cache = DeviceFeatureCache(rows, DIM, torch.float32, torch.device("cpu")) if rows else None
    epochs = []
    try:
        for epoch in EPOCHS:
            batches = []
            for batch in source.train_batches(epoch):
                shipped = batch.x.shape[0]
                assert (batch.cache_plan is not None) == bool(rows)
                if cache is not None:
                    batch = cache.assemble_batch(batch)
                batches.append((batch.n_id.numpy().copy(), batch.x.numpy().copy(), shipped))
                batch.release()
            epochs.append(batches)
        # evaluation batches are never planned: full x, no plan
        for batch in source.eval_batches("val"):
            assert batch.cache_plan is None and batch.x.shape[0] == batch.n_id.shape[0]
            batch.release()
    finally:
        source.close()
    return epochs, rows


@pytest.mark.parametrize("mode", ["hierarchical", "exact", "static", "staged"])
def test_cached_clients_get_the_batches_of_a_cacheless_client_bitwise(dataset_1500, tmp_path, mode):
    with running_daemon(config_for(dataset_1500, tmp_path, mode)) as daemon:
        socket = daemon.config.server.socket
        reference, rows = consume(socket, 0)
        assert rows == 0
        total = sum(len(n_id) for batches in reference for n_id, _, _ in batches)
        distinct = len(np.unique(np.concatenate([n_id for batches in reference for n_id, _, _ in batches])))
        assert sum(shipped for batches in reference for *_, shipped in batches) == total
        for cache_bytes, want_rows in ((3 * ROW_BYTES + 5, 3), (300 * ROW_BYTES, 300), (10 * NODES * ROW_BYTES, NODES)):
            epochs, rows = consume(socket, cache_bytes)
            assert rows == want_rows
            assert [len(b) for b in epochs] == [len(b) for b in reference]
            for got_epoch, want_epoch in zip(epochs, reference, strict=True):
                for (n_id, x, _), (want_n_id, want_x, _) in zip(got_epoch, want_epoch, strict=True):
                    np.testing.assert_array_equal(n_id, want_n_id)
                    assert x.tobytes() == want_x.tobytes()
            shipped = [sum(s for *_, s in batches) for batches in epochs]
            assert sum(shipped) < total
            if rows == NODES:
                # every row is shipped once, at its first access; the cache holds all of them after
                assert sum(shipped) == distinct
                assert shipped[1] <= shipped[0] // 10
        stats = daemon.metrics.trainer_cache_rows
        assert stats.labels("hit")._value.get() > 0 and stats.labels("shipped")._value.get() > 0


def test_a_hello_without_the_cache_field_gets_full_batches(dataset_1500, tmp_path, monkeypatch):
    sent = []

    def old_encode(msg):  # what a client from before the field sends: no feature_cache_bytes key at all
        data = message_to_map(msg)
        data.pop("feature_cache_bytes", None)
        sent.append(data)
        return msgpack.packb(data, use_bin_type=True)

    monkeypatch.setattr(proto.client, "encode", old_encode)
    with running_daemon(config_for(dataset_1500, tmp_path, "hierarchical")) as daemon:
        epochs, rows = consume(daemon.config.server.socket, 0)
    assert sent[0]["t"] == "hello" and "feature_cache_bytes" not in sent[0]
    assert rows == 0 and all(shipped == len(n_id) for batches in epochs for n_id, _, shipped in batches)


def test_a_cache_smaller_than_a_row_is_refused_quietly(dataset_1500, tmp_path):
    with running_daemon(config_for(dataset_1500, tmp_path, "hierarchical")) as daemon:
        source = DaemonSource(str(daemon.config.server.socket), timeout=30, feature_cache_bytes=ROW_BYTES - 1)
        try:
            assert source.info.feature_cache_rows == 0
        finally:
            source.close()


@pytest.mark.slow
def test_training_with_a_feature_cache_gives_the_same_model(dataset_1500, tmp_path):
    cfg = TrainConfig(hidden=16, epochs=2, device="cpu", seed=3)
    with running_daemon(config_for(dataset_1500, tmp_path, "hierarchical")) as daemon:
        socket = str(daemon.config.server.socket)
        results = []
        for cache_bytes in (0, 100 * ROW_BYTES):
            source = DaemonSource(socket, timeout=30, feature_cache_bytes=cache_bytes)
            try:
                results.append(train(source, cfg, log=lambda line: None))
            finally:
                source.close()
    plain, cached = (r.model.state_dict() for r in results)
    assert plain.keys() == cached.keys()
    for name in plain:
        assert torch.equal(plain[name], cached[name]), name
    assert [r.loss for r in results[0].epochs] == [r.loss for r in results[1].epochs]


# ---- DeviceFeatureCache on its own ----

def test_assemble_places_hits_and_misses_and_applies_the_update():
    cache = DeviceFeatureCache(3, 2, torch.float32, torch.device("cpu"))
    cache.rows[:] = torch.tensor([[10.0, 10.0], [11.0, 11.0], [12.0, 12.0]])
    shipped = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    hit = torch.tensor([2, -1, 0, -1], dtype=torch.int32)
    x = cache.assemble(shipped, hit, torch.tensor([1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32))
    assert x.tolist() == [[12.0, 12.0], [1.0, 1.0], [10.0, 10.0], [2.0, 2.0]]
    assert cache.rows[1].tolist() == [2.0, 2.0]
    # all hits, nothing shipped
    empty = torch.empty(0, dtype=torch.int32)
    x = cache.assemble(shipped[:0], torch.tensor([1, 1, 0], dtype=torch.int32), empty, empty)
    assert x.tolist() == [[2.0, 2.0], [2.0, 2.0], [10.0, 10.0]]


def test_a_skipped_plan_is_refused():
    cache = DeviceFeatureCache(2, 1, torch.float32, torch.device("cpu"))

    def batch(step):
        plan = DeviceCachePlan(torch.tensor([-1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                         torch.tensor([0], dtype=torch.int32), step)
        return Batch(torch.ones(1, 1), torch.zeros(1, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long),
                     torch.zeros(1, dtype=torch.long), [1], [], cache_plan=plan)

    cache.assemble_batch(batch(0))
    with pytest.raises(CacheOutOfStep, match="plan 2 arrived, expected 1"):
        cache.assemble_batch(batch(2))
