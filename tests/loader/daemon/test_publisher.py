"""The slot filler (``publisher.open_slot``): a batch with every row (``fill_slot``) and a batch for a client with a
feature cache (``TrainerCache.fill_slot``) carry the same batch, from a pass in RAM or spilled to disk."""

import numpy as np
import pytest

from loader.daemon.publisher import fill_slot
from loader.daemon.slot_source import DenseRows, RowSource, SlotSource
from loader.daemon.trainer_cache import TrainerCache
from loader.sampling.sampling import CSCGraph, sample_pass
from loader.staging.spilled_pass import SpillFile, spill_batches
from proto.batch_arrays import BatchArrays
from proto.errors import SlotOverflow
from proto.messages import BatchId
from proto.slots import SlotRing

NODES, DIM, SLOT_BYTES = 400, 8, 1 << 20


@pytest.fixture(scope="module")
def graph_data():
    """A random graph, its features and labels, local ids mapped to dataset ids by a permutation (as a mega-batch's)."""
    rng = np.random.default_rng(0)
    degree = rng.integers(0, 8, NODES)
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    graph = CSCGraph(indptr, rng.integers(0, NODES, int(indptr[-1])).astype(np.int64), np.arange(NODES, dtype=np.int64))
    features = rng.standard_normal((NODES, DIM)).astype(np.float32)
    labels = rng.integers(-1, 4, NODES).astype(np.int64)
    id_of = rng.permutation(NODES).astype(np.int64) + 1000
    sampled = sample_pass(graph, rng.permutation(NODES)[:120].astype(np.int64), 16, [4, 3],
                          np.arange(8, dtype=np.uint64))
    return features, labels, id_of, sampled


def slot_source(features: np.ndarray, labels: np.ndarray, id_of: np.ndarray, rows: RowSource | None = None
                ) -> SlotSource:
    if rows is None:
        rows = DenseRows(features.reshape(-1).view(np.uint8), features.shape[1] * features.itemsize)
    return SlotSource(rows, labels, id_of, features.shape[1], features.dtype)


class WholeBatchRows(RowSource):
    """The exact mode's kind of source: rows of whole batches only."""

    fills_any_subset = False

    def __init__(self, features: np.ndarray) -> None:
        self.features = features

    def fill(self, b: int, nodes: np.ndarray, x: np.ndarray) -> None:
        x[:] = self.features[nodes]


def ring(slot_bytes: int = SLOT_BYTES) -> SlotRing:
    return SlotRing(bytearray(2 * slot_bytes), 2, slot_bytes)


def batch_id(b: int) -> BatchId:
    return BatchId(kind="train", seq=b, epoch=0, pass_index=0, batch_index=b, num_batches=-1)


def read_back(slots: SlotRing, b: int, cache_rows: int = 0) -> BatchArrays:
    return BatchArrays.read(slots.read(0, expect_seq=b).arrays, cache_rows)


def array_bytes(slots: SlotRing) -> int:
    """What a filler says it wrote: the bytes of the slot's arrays, padding excluded."""
    return sum(array.nbytes for array in slots.read(0).arrays.values())


def test_fill_slot_writes_the_batch_and_every_row(graph_data):
    features, labels, id_of, sampled = graph_data
    source, slots = slot_source(features, labels, id_of), ring()
    for b in range(sampled.num_batches):
        nbytes = fill_slot(slots, 0, batch_id(b), sampled, b, source)
        batch, got = sampled.batch(b), read_back(slots, b)
        seeds = int(batch.num_sampled_nodes[0])
        assert nbytes == array_bytes(slots)
        assert np.array_equal(got.x, features[batch.nodes])
        assert np.array_equal(got.n_id, id_of[batch.nodes]) and np.array_equal(got.y, labels[batch.nodes[:seeds]])
        assert np.array_equal(got.edge_index, batch.edge_index)
        assert np.array_equal(got.nodes_per_hop, batch.num_sampled_nodes)
        assert np.array_equal(got.edges_per_hop, batch.num_sampled_edges)
        assert got.hit_slot is None and got.upd_slot is None and got.upd_pos is None


def test_a_spilled_pass_fills_the_slots_of_its_pass_in_ram(graph_data):
    """Both are ``SampledBatches``: the publisher cannot tell them apart, nor can the client."""
    features, labels, id_of, sampled = graph_data
    source = slot_source(features, labels, id_of)
    spill = SpillFile(None)
    try:
        spilled = spill_batches(sampled, spill, np.dtype(np.int32))
        for b in range(sampled.num_batches):
            in_ram, on_disk = ring(), ring()
            assert fill_slot(in_ram, 0, batch_id(b), sampled, b, source) == \
                fill_slot(on_disk, 0, batch_id(b), spilled, b, source)
            assert in_ram.read(0).arrays.keys() == on_disk.read(0).arrays.keys()
            for name, array in in_ram.read(0).arrays.items():
                assert np.array_equal(array, on_disk.read(0).arrays[name]), name
    finally:
        spill.close()


@pytest.mark.parametrize("whole_batches", [False, True], ids=["any-subset", "whole-batches"])
@pytest.mark.parametrize("cache_rows", [1, 40, NODES])
def test_a_cached_clients_slot_carries_the_same_batch_and_only_its_misses(graph_data, whole_batches, cache_rows):
    """The client's side played in numpy: hits from its cache, misses from ``x``, then the update; every assembled
    batch equals the full one, and the rest of the slot equals ``fill_slot``'s."""
    features, labels, id_of, sampled = graph_data
    full_source = slot_source(features, labels, id_of)
    source = slot_source(features, labels, id_of, WholeBatchRows(features) if whole_batches else None)
    cache = TrainerCache(NODES + 1000, cache_rows, DIM, features.dtype)
    client = np.full((cache_rows, DIM), np.nan, dtype=np.float32)  # never read unless the plan says a row is there
    for _ in range(2):  # the second superbatch starts from the state the first left
        plan = cache.plan(sampled, source)
        for b in range(sampled.num_batches):
            full = ring()
            fill_slot(full, 0, batch_id(b), sampled, b, full_source)
            want = read_back(full, b)
            slots = ring()
            cached = cache.fill_slot(slots, 0, batch_id(b), sampled, b, source, plan)
            got = read_back(slots, b, cache_rows)
            assert cached.nbytes == array_bytes(slots)
            for name in ("n_id", "y", "edge_index", "nodes_per_hop", "edges_per_hop"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), name
            assert got.hit_slot is not None and got.upd_slot is not None and got.upd_pos is not None
            hit = got.hit_slot >= 0
            assert cached.hits == int(hit.sum()) and cached.shipped == int((~hit).sum()) == len(got.x)
            x = np.empty_like(want.x)
            x[hit] = client[got.hit_slot[hit]]
            x[~hit] = got.x
            assert np.array_equal(x, want.x)
            client[got.upd_slot] = x[got.upd_pos]


def test_a_batch_too_big_for_a_slot_overflows_either_way(graph_data):
    features, labels, id_of, sampled = graph_data
    source, slots = slot_source(features, labels, id_of), ring(8192)
    with pytest.raises(SlotOverflow):
        fill_slot(slots, 0, batch_id(0), sampled, 0, source)
    cache = TrainerCache(NODES + 1000, 10, DIM, features.dtype)
    with pytest.raises(SlotOverflow):
        cache.fill_slot(slots, 0, batch_id(0), sampled, 0, source, cache.plan(sampled, source))
