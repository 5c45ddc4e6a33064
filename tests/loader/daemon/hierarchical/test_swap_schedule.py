"""``formation = "comet"``'s schedule (MariusGNN's node-classification policy): every training node once per
epoch, in a state that holds its partition; each partition read once; one logical partition swapped per step."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.hierarchical.swap_schedule import swap_refusal, swap_schedule


def training_nodes(parts: int, nodes_per_part: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted training ids and their partitions, partition q holding ids [q * n, (q + 1) * n)."""
    rng = np.random.default_rng(seed)
    ids = np.flatnonzero(rng.random(parts * nodes_per_part) < share).astype(np.int64)
    return ids, ids // nodes_per_part


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 120), st.integers(2, 40), st.integers(0, 2**32 - 1), st.integers(0, 50),
       st.floats(0.0, 1.0), st.booleans())
def test_every_training_node_once_in_a_state_that_holds_it(parts, per, seed, epoch, share, balanced):
    ids, part_of = training_nodes(parts, 7, share, seed)
    counts = np.random.default_rng(seed).random((parts, 3)) * 5 if balanced else None
    states = swap_schedule(parts, per, seed, epoch, ids, part_of, counts)
    assert [s.index for s in states] == list(range(len(states)))
    assert all(s.count == len(states) and s.epoch == epoch for s in states)
    trained = np.concatenate([s.train_nodes for s in states])
    assert sorted(trained.tolist()) == ids.tolist()  # once and only once
    for s in states:
        assert len(s.partitions) <= per and np.all(np.diff(s.partitions) > 0)
        assert np.all(np.diff(s.train_nodes) > 0)
        assert np.isin(s.train_nodes // 7, s.partitions).all()  # its partition is resident
    # each partition comes in once and, once swapped out, never returns: the epoch reads the graph once
    seen, gone = set(states[0].partitions.tolist()), set()
    for before, after in zip(states, states[1:]):
        out = set(before.partitions.tolist()) - set(after.partitions.tolist())
        incoming = set(after.partitions.tolist()) - set(before.partitions.tolist())
        assert out and incoming and not incoming & (seen | gone)
        # one logical partition swapped: sizes differ by at most one (the grouping's sizes)
        assert abs(len(out) - len(incoming)) <= 1
        seen |= incoming
        gone |= out
    assert seen == set(range(parts))


def test_the_buffer_holds_at_least_two_logical_partitions_and_swaps_one():
    ids, part_of = training_nodes(32, 10, 0.5, 0)
    states = swap_schedule(32, 8, 3, 0, ids, part_of)
    # MariusGNN's l = 2p/c = 8 logical partitions of 4, c_l = 2 of them resident: l - c_l + 1 states
    assert len(states) == 7
    assert all(len(s.partitions) == 8 for s in states)
    assert all(len(set(a.partitions.tolist()) & set(b.partitions.tolist())) == 4 for a, b in zip(states, states[1:]))


def test_a_node_is_drawn_uniformly_among_the_states_that_hold_it():
    # the first logical partition in stays for a run of states; its nodes spread evenly over them
    ids, part_of = training_nodes(16, 20_000, 1.0, 0)
    states = swap_schedule(16, 4, 1, 0, ids, part_of)
    holders = {int(p): [s.index for s in states if p in s.partitions] for p in range(16)}
    for p, run in holders.items():
        assert run == list(range(run[0], run[-1] + 1))  # contiguous: never swapped back in
        per_state = [int(np.count_nonzero(s.train_nodes // 20_000 == p)) for s in states if s.index in run]
        expected = 20_000 / len(run)
        assert all(abs(n - expected) < 5 * expected ** 0.5 for n in per_state), (p, per_state)


def test_seeded_and_epochs_differ():
    ids, part_of = training_nodes(32, 10, 0.5, 0)

    def plan(seed, epoch):
        return [(s.partitions.tolist(), s.train_nodes.tolist()) for s in swap_schedule(32, 8, seed, epoch, ids,
                                                                                       part_of)]

    assert plan(1, 2) == plan(1, 2)
    assert plan(1, 2) != plan(1, 3) and plan(1, 2) != plan(2, 2)


def test_a_mega_batch_holding_the_graph_is_one_state():
    ids, part_of = training_nodes(8, 10, 0.5, 0)
    (state,) = swap_schedule(8, 8, 0, 0, ids, part_of)
    assert state.partitions.tolist() == list(range(8)) and state.train_nodes.tolist() == ids.tolist()


def test_a_mega_batch_of_one_partition_is_refused():
    assert swap_refusal(16, 1) is not None and "formation = \"groups\"" in swap_refusal(16, 1)
    assert swap_refusal(1, 1) is None and swap_refusal(16, 2) is None
    ids, part_of = training_nodes(16, 10, 0.5, 0)
    with pytest.raises(ValueError, match="megabatch_fraction"):
        swap_schedule(16, 1, 0, 0, ids, part_of)
