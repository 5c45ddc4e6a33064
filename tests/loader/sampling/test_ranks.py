"""Dealing an epoch to ranks (loader/sampling/ranks.py) against a plain Python reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.sampling.inmemory import (
    STREAM_TRAIN,
    STREAM_TRAIN_RANK,
    STREAM_VAL,
    EpochBatches,
    epoch_batches_inmemory,
    eval_split_batches,
)
from loader.sampling.ranks import (
    SINGLE_RANK,
    LocalRanks,
    RankBatches,
    deal_epoch,
    deal_eval,
    deal_pieces,
    even_batch_size,
    even_piece,
    num_steps,
    piece_bounds,
    piece_keys,
    sample_pieces,
)
from loader.sampling.sampling import CSCGraph, batch_keys, sample_pass

PROPERTY = settings(max_examples=150, deadline=None)


def ref_deal(order: list[int], b: int, w: int) -> list[list[list[int]]]:
    """pieces[r][k]: the reference dealing, one global batch at a time."""
    pieces: list[list[list[int]]] = [[] for _ in range(w)]
    for first in range(0, len(order), w * b):
        group = order[first:first + w * b]
        share, extra = divmod(len(group), w)
        at = 0
        for r in range(w):
            size = share + (1 if r < extra else 0)
            pieces[r].append(group[at:at + size])
            at += size
        assert at == len(group)
    return pieces


def ref_key(seed: int, epoch: int, k: int, r: int) -> int:
    stream, pass_index = (STREAM_TRAIN, 0) if r == 0 else (STREAM_TRAIN_RANK, r)
    return int(batch_keys(seed, stream, epoch, pass_index, k, 1)[0])


def epochs():
    return st.tuples(st.integers(0, 300), st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**63),
                     st.integers(0, 50))


@PROPERTY
@given(epochs())
def test_dealing_matches_the_reference_and_covers_the_epoch_once(args):
    n, b, w, seed, epoch = args
    train_ids = np.random.default_rng(n).choice(10 * n + 1, n, replace=False)
    single = epoch_batches_inmemory(train_ids, b, seed, epoch)
    expected = ref_deal(single.seeds.tolist(), b, w)
    steps = -(-n // (w * b))
    dealt = [deal_epoch(train_ids, b, seed, epoch, r, w) for r in range(w)]
    union: list[int] = []
    for r, mine in enumerate(dealt):
        assert mine.num_steps == steps == num_steps(n, b, w)  # every rank steps as often
        assert [mine.step_seeds(s).tolist() for s in range(steps)] == expected[r]
        assert mine.sizes().tolist() == [len(p) for p in expected[r]]
        assert mine.keys.tolist() == [ref_key(seed, epoch, k, r) for k in range(steps)]
        assert mine.global_sizes.tolist() == [min(w * b, n - k * w * b) for k in range(steps)]
        union.extend(mine.seeds.tolist())
    assert sorted(union) == sorted(train_ids.tolist()) and len(set(union)) == len(union)
    sizes = np.array([mine.sizes() for mine in dealt]).reshape(w, steps)
    if steps:
        assert (sizes[:, :-1] == b).all()  # pieces differ only in the last step, and there by at most one
        assert sizes[:, -1].max() - sizes[:, -1].min() <= 1 and sizes[:, -1].sum() == n - (steps - 1) * w * b


@PROPERTY
@given(epochs())
def test_one_rank_is_the_single_process_plan(args):
    n, b, _, seed, epoch = args
    train_ids = np.random.default_rng(n).choice(10 * n + 1, n, replace=False)
    single = epoch_batches_inmemory(train_ids, b, seed, epoch)
    mine = deal_epoch(train_ids, b, seed, epoch, 0, 1)
    np.testing.assert_array_equal(mine.seeds, single.seeds)
    np.testing.assert_array_equal(mine.keys, single.keys)
    assert mine.keys.dtype == single.keys.dtype == np.uint64


@PROPERTY
@given(st.integers(0, 300), st.integers(1, 40), st.integers(1, 6))
def test_evaluation_batches_go_round_robin_whole(n, b, w):
    plan = eval_split_batches(np.arange(0, 3 * n, 3), b, 7, STREAM_VAL)
    batches = [(plan.seeds[i * b:(i + 1) * b].tolist(), int(plan.keys[i])) for i in range(len(plan.keys))]
    taken = []
    for r in range(w):
        mine = deal_eval(plan, b, r, w)
        got = [(mine.seeds[i * b:(i + 1) * b].tolist(), int(mine.keys[i])) for i in range(len(mine.keys))]
        assert got == batches[r::w] and sum(len(s) for s, _ in got) == len(mine.seeds)
        taken.extend(got)
    assert sorted(taken) == sorted(batches)
    alone = deal_eval(plan, b, 0, 1)
    np.testing.assert_array_equal(alone.seeds, plan.seeds)
    np.testing.assert_array_equal(alone.keys, plan.keys)


def test_the_last_ranks_get_an_empty_piece_when_fewer_seeds_than_ranks_are_left():
    ids = np.arange(21)
    dealt = [deal_epoch(ids, 5, 0, 1, r, 4) for r in range(4)]  # global batches of 20, then 1 seed
    assert [d.sizes().tolist() for d in dealt] == [[5, 1], [5, 0], [5, 0], [5, 0]]
    assert [d.global_sizes.tolist() for d in dealt] == [[20, 1]] * 4
    assert dealt[3].step_seeds(1).shape == (0,) and dealt[3].step_seeds(1).dtype == np.int64
    start, size = piece_bounds(21, 5, 4, 1)
    assert start.tolist() == [5, 21] and size.tolist() == [5, 0]
    empty = deal_epoch(np.zeros(0, np.int64), 5, 0, 1, 2, 3)
    assert empty.num_steps == 0 and empty.seeds.shape == (0,)


@pytest.mark.parametrize("call, message", [
    (lambda: deal_epoch(np.arange(5), 2, 0, 0, 2, 2), r"rank must be in \[0, 2\), got 2"),
    (lambda: deal_epoch(np.arange(5), 2, 0, 0, 0, 0), "world_size must be at least 1, got 0"),
    (lambda: deal_epoch(np.arange(5), 0, 0, 0, 0, 1), "batch_size must be positive, got 0"),
    (lambda: deal_eval(EpochBatches(np.arange(5), np.zeros(2, np.uint64)), 2, 0, 1), "2 keys for 5 seeds"),
    (lambda: RankBatches(0, 1, 2, np.arange(5), np.zeros(2, np.uint64), np.zeros(2, np.int64)),
     "seeds: 5 for 2 steps of at most 2"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@st.composite
def local_deals(draw):
    """(seeds, batch size, LocalRanks): a job's ranks on one machine, any subset of the world."""
    n, b, w = draw(st.integers(0, 300)), draw(st.integers(1, 40)), draw(st.integers(1, 6))
    ranks = draw(st.lists(st.integers(0, w - 1), min_size=1, max_size=w, unique=True))
    return n, b, LocalRanks(w, tuple(sorted(ranks)))


@PROPERTY
@given(local_deals(), st.integers(0, 2**63), st.integers(0, 50))
def test_a_machines_pieces_are_its_ranks_pieces_interleaved_step_by_step(deal, seed, epoch):
    n, b, local = deal
    order = list(range(1000, 1000 + n))
    pieces = deal_pieces(n, b, local)
    reference = ref_deal(order, b, local.world_size)
    steps = len(reference[0])
    assert pieces.num_steps == steps and pieces.count == steps * local.count
    keys = piece_keys(seed, epoch, local, 0, steps)
    i = 0
    for k in range(steps):
        for position, rank in enumerate(local.ranks):
            start, size = int(pieces.start[i]), int(pieces.size[i])
            assert order[start:start + size] == reference[rank][k]
            assert (pieces.member[i], pieces.step[i]) == (position, k)
            assert pieces.global_size[i] == sum(len(reference[r][k]) for r in range(local.world_size))
            assert int(keys[i]) == ref_key(seed, epoch, k, rank)
            i += 1
    # a later window of steps has the same keys as the whole epoch's
    if steps > 1:
        np.testing.assert_array_equal(piece_keys(seed, epoch, local, 1, steps - 1), keys[local.count:])
        part = pieces.steps(1, steps)
        np.testing.assert_array_equal(part.start, pieces.start[local.count:])


def test_one_local_rank_of_one_is_the_single_process_batches():
    pieces = deal_pieces(10, 3, SINGLE_RANK)
    assert pieces.start.tolist() == [0, 3, 6, 9] and pieces.size.tolist() == [3, 3, 3, 1]
    np.testing.assert_array_equal(piece_keys(4, 2, SINGLE_RANK, 0, 4), batch_keys(4, STREAM_TRAIN, 2, 0, 0, 4))


@PROPERTY
@given(local_deals(), st.integers(0, 2**32))
def test_sampled_pieces_are_each_piece_sampled_alone(deal, seed):
    n, b, local = deal
    rng = np.random.default_rng(seed)
    nodes = max(n, 1) + 5
    degree = rng.integers(0, 6, nodes)
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    graph = CSCGraph(indptr, rng.integers(0, nodes, int(indptr[-1])).astype(np.int64),
                     np.arange(nodes, dtype=np.int64))
    order = rng.permutation(nodes)[:n].astype(np.int64)
    pieces = deal_pieces(n, b, local)
    keys = piece_keys(seed, 0, local, 0, pieces.num_steps)
    fanouts = (3, 2)
    sampled = sample_pieces(lambda s, size, k: sample_pass(graph, s, size, fanouts, k), order, pieces, b, keys, 2)
    assert sampled.num_batches == pieces.count
    for i in range(pieces.count):
        start, size = int(pieces.start[i]), int(pieces.size[i])
        got = sampled.batch(i)
        if size == 0:
            assert len(got.nodes) == 0 and got.edge_index.shape == (2, 0) and not got.num_sampled_nodes.any()
            continue
        alone = sample_pass(graph, order[start:start + size], size, fanouts, keys[i:i + 1]).batch(0)
        np.testing.assert_array_equal(got.nodes, alone.nodes)
        np.testing.assert_array_equal(got.edge_index, alone.edge_index)
        np.testing.assert_array_equal(got.num_sampled_nodes, alone.num_sampled_nodes)
        np.testing.assert_array_equal(got.num_sampled_edges, alone.num_sampled_edges)


@pytest.mark.parametrize(("world", "ranks", "message"), [
    (2, (), "a job has at least one rank"), (2, (2,), r"rank must be in \[0, 2\)"),
    (3, (1, 0), "expected distinct and sorted"), (3, (1, 1), "expected distinct and sorted"),
])
def test_bad_local_ranks_are_named(world, ranks, message):
    with pytest.raises(ValueError, match=message):
        LocalRanks(world, ranks)


@PROPERTY
@given(st.integers(0, 5000), st.integers(1, 1100), st.integers(1, 6))
def test_an_even_batch_size_keeps_the_steps_and_evens_the_batches(n, b, w):
    even = even_batch_size(n, b, w)
    assert 1 <= even <= b
    steps = -(-n // (b * w))  # plain ceil(n / (b w))
    assert num_steps(n, even, w) == steps
    if steps:
        sizes = [min(even * w, n - k * even * w) for k in range(steps)]  # the global batches deal_pieces makes
        assert sum(sizes) == n and all(size > 0 for size in sizes)
        # every step but the last holds ceil(n / steps) seeds or up to w - 1 more; the last at most steps * w
        # fewer (the plain cut's last may hold a single seed)
        per_step = -(-n // steps)
        assert all(per_step <= size < per_step + w for size in sizes[:-1])
        assert sizes[-1] >= per_step - steps * w


def test_an_even_batch_size_cuts_a_megabatch_into_equal_batches():
    assert even_batch_size(5174, 1024, 1) == 863  # 5 x 863 + 859, not 5 x 1024 + 54
    assert even_batch_size(5120, 1024, 1) == 1024 and even_batch_size(0, 1024, 1) == 1024
    assert even_batch_size(5174, 512, 2) == 432  # global batches of 864 over two ranks


@PROPERTY
@given(st.integers(0, 3000), st.integers(1, 9))
def test_a_link_global_batch_is_dealt_in_even_contiguous_pieces(count, w):
    pieces = [even_piece(count, w, r) for r in range(w)]
    sizes = [hi - lo for lo, hi in pieces]
    # plain reference: hand out the items one by one, round robin, then make each rank's share contiguous
    share = [0] * w
    for item in range(count):
        share[item % w] += 1
    assert sizes == share  # within one of each other, the larger first
    assert pieces[0][0] == 0 and pieces[-1][1] == count
    assert all(pieces[r][1] == pieces[r + 1][0] for r in range(w - 1))  # contiguous, in rank order
    if count:  # the node task's rule for a global batch of at most W*b (its last step), with any b that fits
        b = -(-count // w)
        for r in range(w):
            start, size = piece_bounds(count, b, w, r)
            assert (int(start[0]), int(start[0] + size[0])) == pieces[r]
