"""An epoch in a partition buffer order (loader/sampling/buffer_order.py) against a plain Python reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.partition_table import PARTITION_COLUMNS, PartitionTable
from loader.sampling.buffer_order import (
    ASSIGNMENTS,
    STREAM_LINK_BUFFER,
    STREAM_LINK_EDGE_STATE,
    balanced_cuts,
    buffer_epoch,
    buffer_plan,
    resolved_logical,
)
from loader.sampling.comet import bucket_order, default_logical
from loader.sampling.link_sampling import STREAM_LINK_SHUFFLE, STREAM_LINK_TRAIN, link_batch_plan
from loader.sampling.sampling import batch_keys, shuffle

PROPERTY = settings(max_examples=100, deadline=None)


def table(sizes: list[int]) -> PartitionTable:
    """Partitions of ``sizes`` nodes, consecutive (only the node columns matter here)."""
    array = np.zeros((len(sizes), len(PARTITION_COLUMNS)), dtype=np.int64)
    array[:, 1] = np.cumsum(sizes)
    array[:, 0] = array[:, 1] - sizes
    return PartitionTable(array)


def bucketed_edges(rng: np.random.Generator, parts: PartitionTable, counts: np.ndarray) -> np.ndarray:
    """int64 (2, E): ``counts[i*P + j]`` random edges from partition i to partition j, in bucket order."""
    p = len(parts)
    columns = []
    for flat, count in enumerate(counts.tolist()):
        i, j = divmod(flat, p)
        columns.append(np.stack((rng.integers(parts.node_begin[i], parts.node_end[i], count),
                                 rng.integers(parts.node_begin[j], parts.node_end[j], count))))
    return np.concatenate(columns, axis=1) if columns else np.zeros((2, 0), dtype=np.int64)


def ref_epoch(plan, offsets: list[int], batch_size: int, assignment: str = "edge"
              ) -> list[tuple[list[int], list[int]]]:
    """(order, batch_ptr) of each state, bucket by bucket and edge by edge, from the module docstring."""
    p = plan.num_partitions
    keys = batch_keys(plan.seed, STREAM_LINK_BUFFER, plan.epoch, 0, 0, plan.num_states)
    held = [set(members.tolist()) for members in plan.states]
    out = []
    for t in range(plan.num_states):
        positions = []
        for i in range(p):
            for j in range(p):  # ascending (i, j): bucket_order's order
                bucket = range(offsets[i * p + j], offsets[i * p + j + 1])
                if assignment == "bucket" or plan.policy == "beta":
                    positions += bucket if plan.bucket_state[i, j] == t else []
                elif i in held[t] and j in held[t]:
                    # the edge's share of its bucket among the states holding both ends; this one trains share
                    # "how many earlier states held both"
                    shares = sum(i in h and j in h for h in held)
                    mine = sum(i in h and j in h for h in held[:t])
                    for e in bucket:
                        key = int(batch_keys(plan.seed, STREAM_LINK_EDGE_STATE, plan.epoch, 0, e, 1)[0])
                        if ((key >> 32) * shares) >> 32 == mine:
                            positions.append(e)
        order = shuffle(np.array(positions, dtype=np.int64), int(keys[t])).tolist()
        out.append((order, ref_cuts(len(order), batch_size)))
    return out


def ref_cuts(count: int, batch_size: int) -> list[int]:
    """Batch k of B = ceil(count / batch_size) ends at floor(k * count / B), in Python integers."""
    batches = 0
    while batches * batch_size < count:
        batches += 1
    return [k * count // batches for k in range(batches + 1)] if batches else [0]


@st.composite
def epochs(draw):
    p = draw(st.integers(3, 9))
    capacity = draw(st.integers(2, p - 1))
    order = draw(st.sampled_from(["comet", "beta"]))
    logical = None if order == "beta" else draw(st.one_of(st.none(), st.integers(default_logical(p, capacity), p)))
    sizes = draw(st.lists(st.integers(1, 6), min_size=p, max_size=p))
    return (order, p, capacity, logical, sizes, draw(st.integers(1, 7)), draw(st.integers(0, 2**63)),
            draw(st.integers(0, 40)), draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from(ASSIGNMENTS)))


@PROPERTY
@given(epochs())
def test_an_epoch_trains_every_edge_once_with_both_ends_resident(case):
    order, p, capacity, logical, sizes, batch_size, seed, epoch, data_seed, assignment = case
    rng = np.random.default_rng(data_seed)
    parts = table(sizes)
    counts = rng.integers(0, 5, p * p) * (rng.random(p * p) < 0.7)  # empty buckets too
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    edges = bucketed_edges(rng, parts, counts)
    plan = buffer_plan(order, p, capacity, logical, seed, epoch)
    result = buffer_epoch(plan, offsets, parts, batch_size, assignment=assignment)

    assert [(s.order.tolist(), s.batch_ptr.tolist()) for s in result.states] == ref_epoch(
        plan, offsets.tolist(), batch_size, assignment)
    everything = np.concatenate([s.order for s in result.states])
    assert sorted(everything.tolist()) == list(range(int(offsets[-1])))  # each training edge exactly once
    batches = result.batches
    assert batches.order.tolist() == everything.tolist()
    # batch b keeps the shuffled order's key b: one sampler, one key stream
    assert batches.keys.tolist() == batch_keys(seed, STREAM_LINK_TRAIN, epoch, 0, 0, batches.num_batches).tolist()
    for t, state in enumerate(result.states):
        assert state.index == t and state.partitions.tolist() == plan.states[t].tolist()
        resident = np.zeros(int(parts.node_end[-1]), dtype=bool)
        resident[state.resident_nodes()] = True
        assert state.num_nodes == int(resident.sum()) == sum(sizes[i] for i in plan.states[t])
        assert resident[edges[:, state.order]].all()  # both endpoints of each of its edges are in the buffer
        first, last = result.state_batches[t], result.state_batches[t + 1]
        assert last - first == state.num_batches
        for k in range(state.num_batches):  # a batch never spans two states
            positions, _ = batches.batch(int(first + k))
            assert positions.tolist() == state.order[state.batch_ptr[k]:state.batch_ptr[k + 1]].tolist()
            assert 1 <= len(positions) <= batch_size
    # a pure function of the plan's (seed, epoch)
    again = buffer_epoch(buffer_plan(order, p, capacity, logical, seed, epoch), offsets, parts, batch_size,
                         assignment=assignment)
    assert again.batches.order.tolist() == everything.tolist()
    assert again.batches.batch_ptr.tolist() == batches.batch_ptr.tolist()


@PROPERTY
@given(st.integers(0, 5000), st.integers(1, 300))
def test_a_states_batches_are_the_fewest_and_as_equal_as_they_can_be(count, batch_size):
    cuts = balanced_cuts(count, batch_size)
    sizes = np.diff(cuts)
    assert cuts.dtype == np.int64 and cuts[0] == 0 and cuts[-1] == count
    assert len(sizes) == -(-count // batch_size)  # no more steps than the plain cut
    assert (sizes >= 1).all() and (sizes <= batch_size).all()
    assert len(sizes) == 0 or sizes.max() - sizes.min() <= 1
    assert cuts.tolist() == ref_cuts(count, batch_size)  # 134 pairs of 64: 44, 45, 45, not 64, 64, 6


def test_epochs_and_seeds_differ_and_the_shuffled_order_is_untouched():
    parts = table([5] * 8)
    rng = np.random.default_rng(0)
    counts = rng.integers(5, 20, 64)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    orders = {(seed, epoch): buffer_epoch(buffer_plan("comet", 8, 4, None, seed, epoch), offsets, parts,
                                          16).batches.order.tolist() for seed in (0, 1) for epoch in (1, 2)}
    assert len({tuple(order) for order in orders.values()}) == 4
    # the shuffled order is link_batch_plan's, from its own stream: nothing here feeds it
    shuffled = link_batch_plan(int(offsets[-1]), 16, 0, 1)
    expected = shuffle(np.arange(int(offsets[-1]), dtype=np.int64),
                       int(batch_keys(0, STREAM_LINK_SHUFFLE, 1, 0, 0, 1)[0]))
    assert shuffled.order.tolist() == expected.tolist()
    assert STREAM_LINK_BUFFER not in (STREAM_LINK_SHUFFLE, STREAM_LINK_TRAIN)


def test_beta_trains_a_states_buckets_around_the_incoming_partition():
    """BETA's states after the first train only buckets with the swapped-in partition as an end."""
    parts = table([3] * 6)
    counts = np.ones(36, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    edges = bucketed_edges(np.random.default_rng(1), parts, counts)
    plan = buffer_plan("beta", 6, 3, None, 5, 1)
    result = buffer_epoch(plan, offsets, parts, 4)
    for state, loads, buckets in zip(result.states[1:], plan.loads[1:], bucket_order(plan)[1:]):
        (incoming,) = loads.tolist()
        assert all(incoming in pair for pair in buckets.tolist())
        ends = parts.partition_of(edges[:, state.order])
        assert ((ends[0] == incoming) | (ends[1] == incoming)).all()


def test_comet_spreads_a_bucket_over_every_state_that_holds_it():
    """Edge assignment: a big diagonal bucket is trained a share at a time in every state holding its partition,
    in shares about equal; bucket assignment trains it whole in one of them."""
    p, capacity = 16, 4
    parts = table([10] * p)
    counts = np.where(np.eye(p, dtype=bool).ravel(), 2000, 0)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    plan = buffer_plan("comet", p, capacity, None, 3, 1)
    holding = [t for t, members in enumerate(plan.states) if 0 in members.tolist()]
    assert len(holding) >= 3
    by_edge = buffer_epoch(plan, offsets, parts, 64)
    ours = [int(((by_edge.states[t].order >= 0) & (by_edge.states[t].order < 2000)).sum()) for t in holding]
    assert sum(ours) == 2000 and min(ours) > 0
    expected = 2000 / len(holding)
    assert all(abs(n - expected) < 5 * np.sqrt(expected) for n in ours)  # binomial shares, 5 sigma
    by_bucket = buffer_epoch(plan, offsets, parts, 64, assignment="bucket")
    whole = [int(((by_bucket.states[t].order >= 0) & (by_bucket.states[t].order < 2000)).sum()) for t in holding]
    assert sorted(whole) == [0] * (len(holding) - 1) + [2000]


def test_resolved_logical():
    assert resolved_logical("comet", 32, 8, None) == default_logical(32, 8) == 8
    assert resolved_logical("comet", 32, 8, 16) == 16
    assert resolved_logical("beta", 32, 8, None) == 32


@pytest.mark.parametrize("call, message", [
    (lambda: buffer_plan("beta", 8, 4, 4, 0, 1), "no number of logical partitions"),
    (lambda: buffer_plan("shuffled", 8, 4, None, 0, 1), "'comet' or 'beta'"),
    (lambda: buffer_epoch(buffer_plan("comet", 4, 2, None, 0, 1), np.zeros(17, np.int64), table([2] * 3), 4),
     "3 rows, the plan has 4"),
    (lambda: buffer_epoch(buffer_plan("comet", 4, 2, None, 0, 1), np.zeros(16, np.int64), table([2] * 4), 4),
     "16 offsets, expected P\\*P \\+ 1 = 17"),
    (lambda: buffer_epoch(buffer_plan("comet", 4, 2, None, 0, 1), np.arange(17)[::-1].copy(), table([2] * 4), 4),
     "rise from 0"),
    (lambda: buffer_epoch(buffer_plan("comet", 4, 2, None, 0, 1), np.zeros(17, np.int64), table([2] * 4), 0),
     "batch_size: 0"),
    (lambda: buffer_epoch(buffer_plan("comet", 4, 2, None, 0, 1), np.zeros(17, np.int64), table([2] * 4), 4,
                          assignment="pair"), "assignment must be one of"),
])
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
