"""Automatic session sizing: slots and clients from the budget; slot bounds from the pilot batches."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.config import SamplerConfig
from loader.daemon.slot_sizing import (
    AUTO_CLIENTS,
    AUTO_SLOTS,
    HEADROOM,
    SIGMAS,
    BatchBound,
    PilotSizes,
    _allowance,
    estimate_slot_bytes,
    size_sessions,
)
from loader.format.dataset import open_dataset
from proto.batch_arrays import BatchShape
from proto.slots import HEADER_BYTES, slot_bytes_for

MiB = 1 << 20


@settings(max_examples=200, deadline=None)
@given(st.integers(64 * MiB, 64 << 30), st.integers(4096, 4 << 30))
def test_auto_sessions_stay_in_half_the_budget_or_take_the_minimum(budget, slot_bytes):
    s = size_sessions(budget, slot_bytes, None, None)
    assert AUTO_SLOTS[0] <= s.slots <= AUTO_SLOTS[1] and 1 <= s.clients <= AUTO_CLIENTS
    if s.total > budget // 2:
        # only the minimum (one client with the fewest slots) may exceed the share
        assert (s.clients, s.slots) == (1, AUTO_SLOTS[0])
    else:
        # as many clients as fit, then more would not
        assert s.clients == AUTO_CLIENTS or (s.clients + 1) * s.slots * slot_bytes > budget // 2


def test_explicit_values_are_kept_and_examples():
    assert size_sessions(1 << 30, 600 * MiB, 3, 2).total == 6 * 600 * MiB  # the plans refuse it, not this
    # coauthor-physics' 650 MiB batches under the default 2 GiB: one client, two slots
    s = size_sessions(2 << 30, 650 * MiB, None, None)
    assert (s.clients, s.slots) == (1, 2)
    # the demo's 16 MiB slots under 512 MiB: 4 slots each, 4 clients (256 MiB)
    s = size_sessions(512 * MiB, 16 * MiB, None, None)
    assert (s.clients, s.slots) == (4, 4)


def test_allowance_adds_six_sigmas_of_full_batches_capped_at_the_headroom():
    sizes = np.array([1000, 1010, 990, 1005, 300])  # the short last batch is not a sample of the spread
    full = np.array([True, True, True, True, False])
    spread = sizes[full].std()
    assert _allowance(sizes, full) == int(1010 + SIGMAS * spread) + 64
    wild = np.array([100, 1000, 10, 500])
    assert _allowance(wild, np.ones(4, bool)) == int(1000 * HEADROOM) + 64
    assert _allowance(np.array([700]), np.array([True])) == int(700 * HEADROOM) + 64  # one batch: the cap


def test_a_training_slot_holds_a_batch_at_the_bound_with_a_feature_cache_plan_shipping_every_row(dataset_3k):
    # a cached client's first batches ship every row *and* carry hit_slot and the updates: with 16-dim rows the
    # plan is 12 of every 76 bytes, and a slot sized for the plain batch refused such a batch mid-epoch
    dataset = open_dataset(dataset_3k)
    m = dataset.manifest
    sampler = SamplerConfig(batch_size=256, fanouts=(10, 5), eval_batch_size=256)
    bound = BatchBound(nodes=2500, edges=9000)
    cached = BatchShape(bound.nodes, 256, bound.edges, 2, m.feat_dim, np.dtype(m.feat_dtype.value),
                        shipped_rows=bound.nodes, num_updates=bound.nodes)
    plain = BatchShape(bound.nodes, 256, bound.edges, 2, m.feat_dim, np.dtype(m.feat_dtype.value))
    estimate = estimate_slot_bytes(dataset, PilotSizes(bound, None), sampler)
    assert estimate >= slot_bytes_for(cached.specs(), HEADER_BYTES) > slot_bytes_for(plain.specs(), HEADER_BYTES)
    # evaluation batches never carry a plan: sized plain
    assert estimate_slot_bytes(dataset, PilotSizes(None, bound), sampler) == slot_bytes_for(plain.specs(), HEADER_BYTES)


def test_the_evaluation_bound_holds_the_larger_split_too(tmp_path):
    """Planetoid-like: 20 validation nodes, 600 test nodes, one batch each. One hop reaches few nodes, so a bound
    from the validation batch alone held no test batch (citeseer with the aggregation cache was refused mid-run)."""
    from loader.daemon.resident import load_resident
    from loader.daemon.slot_sizing import pilot_batch_sizes
    from loader.offline.prepare import PrepareOptions, prepare_dataset
    from loader.sampling.inmemory import STREAM_TEST, eval_split_batches, load_in_memory
    from loader.sampling.sampling import sample_pass
    from tests.graphs import random_graph, write_raw

    n = 1000
    src, dst, features, labels = random_graph(np.random.default_rng(3), n, 3000, 4, classes=3)
    ids = np.random.default_rng(4).permutation(n)
    write_raw(tmp_path / "raw", src, dst, features, labels, 3,
              (np.sort(ids[:100]), np.sort(ids[100:120]), np.sort(ids[120:720])))
    path = prepare_dataset(tmp_path / "raw", tmp_path / "ds", PrepareOptions(num_partitions=4, progress=False)).path
    dataset = open_dataset(path)
    sampler = SamplerConfig(batch_size=128, fanouts=(3,), eval_fanouts=(3,), eval_batch_size=1024)
    pilot = pilot_batch_sizes(dataset, load_resident(dataset, with_static=False), sampler)
    data = load_in_memory(dataset)
    plan = eval_split_batches(data.splits["test"], 1024, 0, STREAM_TEST)
    test_batch = sample_pass(data.graph, plan.seeds, 1024, (3,), plan.keys).batch(0)
    assert pilot.eval is not None and pilot.eval.nodes >= len(test_batch.nodes)
