"""MariusGNN's buffer orders (loader/sampling/comet.py) against plain Python references."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.sampling.comet import (
    STREAM_BETA,
    STREAM_BUCKETS,
    STREAM_GROUPS,
    STREAM_STATES,
    BufferPlan,
    beta_plan,
    bucket_correlation,
    bucket_order,
    comet_plan,
    comet_states,
    default_logical,
    logical_capacity,
    logical_groups,
)

PROPERTY = settings(max_examples=150, deadline=None)


def rng(seed: int, stream: int, epoch: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, stream, epoch]))


def ref_greedy(n: int, cap: int, g: np.random.Generator) -> list[list[int]]:
    """The module docstring's greedy, with sets and loops."""
    perm = [int(v) for v in g.permutation(n)]
    resident = sorted(perm[:cap])
    if cap >= n:
        return [list(range(n))]
    seen = {(a, b) for a in resident for b in resident if a < b}

    def missing(a: int, b: int) -> bool:
        return a != b and (min(a, b), max(a, b)) not in seen

    states = [resident]
    while len(seen) < n * (n - 1) // 2:
        outside = [x for x in range(n) if x not in resident]
        swaps = [(s, x) for s in resident for x in outside]  # row-major: s, then x
        score = {(s, x): sum(missing(x, t) for t in resident if t != s) for s, x in swaps}
        if max(score.values()) == 0:
            score = {(s, x): sum(missing(x, y) for y in range(n)) for s, x in swaps}
        top = max(score.values())
        ties = [swap for swap in swaps if score[swap] == top]
        s, x = ties[int(g.integers(len(ties)))]
        resident = sorted((set(resident) - {s}) | {x})
        seen |= {(min(x, t), max(x, t)) for t in resident if t != x}
        states.append(resident)
    return states


def ref_loads(states: list[list[int]]) -> list[list[int]]:
    return [states[0]] + [sorted(set(now) - set(before)) for before, now in zip(states, states[1:])]


def ref_comet(p: int, c: int, nl: int, seed: int, epoch: int) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """(logical_of, states, bucket_state as nested lists) of COMET, step by step from the docstring."""
    order = [int(v) for v in rng(seed, STREAM_GROUPS, epoch).permutation(p)]
    groups, at = [], 0
    for g in range(nl):
        size = p // nl + (1 if g < p % nl else 0)
        groups.append(order[at:at + size])
        at += size
    logical_of = [0] * p
    for g, members in enumerate(groups):
        for x in members:
            logical_of[x] = g
    held = nl if c >= p else min(nl, c // -(-p // nl))
    logical = ref_greedy(nl, held, rng(seed, STREAM_STATES, epoch))
    states = [sorted(x for g in state for x in groups[g]) for state in logical]
    keys = rng(seed, STREAM_BUCKETS, epoch)
    best: dict[tuple[int, int], float] = {}
    chosen = [[-1] * p for _ in range(p)]
    for t, members in enumerate(states):
        drawn = keys.random((len(members), len(members)))
        for a, i in enumerate(members):
            for b, j in enumerate(members):
                if drawn[a, b] > best.get((i, j), -1.0):
                    best[i, j] = float(drawn[a, b])
                    chosen[i][j] = t
    return logical_of, states, chosen


def ref_first(states: list[list[int]], p: int) -> list[list[int]]:
    return [[next(t for t, s in enumerate(states) if i in s and j in s) for j in range(p)] for i in range(p)]


@st.composite
def comet_args(draw):
    p = draw(st.integers(1, 14))
    c = draw(st.integers(1 if p == 1 else 2, p + 2))
    first = default_logical(p, c)
    nl = draw(st.one_of(st.none(), st.integers(first, p)))
    return p, c, nl, draw(st.integers(0, 2**63)), draw(st.integers(0, 50))


def check_common(plan: BufferPlan, p: int, c: int) -> None:
    """What every plan must hold: coverage, capacity, loads, one state per bucket with both ends in it."""
    resident = np.zeros((plan.num_states, p), dtype=bool)
    for t, members in enumerate(plan.states):
        assert len(members) <= c and members.dtype == np.int64
        resident[t, members] = True
    together = resident.T.astype(np.int64) @ resident.astype(np.int64)  # states where i and j are both resident
    assert (together > 0).all()  # every pair and every (i, i)
    i, j = np.indices((p, p))
    assert resident[plan.bucket_state, i].all() and resident[plan.bucket_state, j].all()
    assert [x.tolist() for x in plan.loads] == ref_loads([s.tolist() for s in plan.states])
    assert plan.io_partitions == sum(len(x) for x in plan.loads)
    order = bucket_order(plan)
    assert len(order) == plan.num_states
    listed = np.concatenate(order)
    assert listed.shape == (p * p, 2) and len({(a, b) for a, b in listed.tolist()}) == p * p  # each bucket once
    for t, pairs in enumerate(order):
        assert (plan.bucket_state[pairs[:, 0], pairs[:, 1]] == t).all()
        assert pairs.tolist() == sorted(pairs.tolist())


def check_step_bounds(n: int, k: int, steps: int) -> None:
    """Between a step per k - 1 new pairs (the best possible) and two steps per new pair (the greedy never stalls)."""
    left = n * (n - 1) // 2 - k * (k - 1) // 2
    if k >= n:
        assert steps == 1
    else:
        assert 1 + -(-left // (k - 1)) <= steps <= 1 + 2 * left


@PROPERTY
@given(comet_args())
def test_comet_plan_matches_the_reference_and_covers_every_bucket(args):
    p, c, nl, seed, epoch = args
    plan = comet_plan(p, c, nl, seed=seed, epoch=epoch)
    nl = default_logical(p, c) if nl is None else nl
    logical_of, states, chosen = ref_comet(p, c, nl, seed, epoch)
    assert plan.policy == "comet" and plan.num_logical == nl
    assert plan.logical_of.tolist() == logical_of
    assert [s.tolist() for s in plan.states] == states
    assert plan.bucket_state.tolist() == chosen
    check_common(plan, p, c)
    held = logical_capacity(p, c, nl)
    groups = [set(plan.logical_of[s].tolist()) for s in plan.states]
    for t, state in enumerate(plan.states):
        whole = np.flatnonzero(np.isin(plan.logical_of, list(groups[t])))
        assert state.tolist() == whole.tolist() and len(groups[t]) == min(held, nl)  # whole logical partitions
    for before, now in zip(groups, groups[1:]):
        assert len(now - before) == len(before - now) == 1  # one logical partition swapped per step
    check_step_bounds(nl, min(held, nl), plan.num_states)


@PROPERTY
@given(comet_args())
def test_beta_plan_matches_the_reference_and_trains_each_bucket_first_time_round(args):
    p, c, _, seed, epoch = args
    plan = beta_plan(p, c, seed, epoch)
    states = ref_greedy(p, min(c, p), rng(seed, STREAM_BETA, epoch))
    assert plan.policy == "beta" and plan.num_logical == p and plan.logical_of.tolist() == list(range(p))
    assert [s.tolist() for s in plan.states] == states
    assert plan.bucket_state.tolist() == ref_first(states, p)
    check_common(plan, p, c)
    for before, now in zip(states, states[1:]):
        assert len(set(now) - set(before)) == len(set(before) - set(now)) == 1
    check_step_bounds(p, min(c, p), plan.num_states)


@PROPERTY
@given(st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**63), st.integers(0, 50))
def test_comet_states_are_the_reference_greedy(n, cap, seed, epoch):
    if cap < min(2, n):
        with pytest.raises(ValueError, match="at least 2"):
            comet_states(n, cap, seed, epoch)
        return
    got = comet_states(n, cap, seed, epoch)
    assert [s.tolist() for s in got] == ref_greedy(n, min(cap, n), rng(seed, STREAM_STATES, epoch))
    assert all(s.dtype == np.int64 for s in got)


@PROPERTY
@given(st.integers(1, 300), st.integers(1, 320))
def test_default_logical_is_the_least_l_with_two_logical_partitions_in_the_buffer(p, c):
    if c < 2 and c < p:
        with pytest.raises(ValueError, match="at least 2"):
            default_logical(p, c)
        return
    nl = default_logical(p, c)
    held = logical_capacity(p, c, nl)
    if c >= p:
        assert nl == 1 and held == 1
        return
    largest = -(-p // nl)
    assert held >= 2 and largest * held <= c and 1 <= nl <= p
    if nl > 1:
        with pytest.raises(ValueError, match="COMET needs at least 2"):
            logical_capacity(p, c, nl - 1)
    if c % 2 == 0 and p % (c // 2) == 0:  # MariusGNN's case: l = 2p/c, c_l = 2, p/c = l/c_l
        assert nl * c == 2 * p and held == 2 and p * held == c * nl


def test_default_logical_examples_and_refusals():
    assert default_logical(16, 8) == 4 and logical_capacity(16, 8, 4) == 2
    assert default_logical(1000, 100) == 20
    assert default_logical(10, 7) == 4 and logical_capacity(10, 7, 4) == 2  # groups of 3 and 2: 6 of 7 used
    assert default_logical(9, 3) == 9 and logical_capacity(9, 3, 9) == 3  # odd c: singletons, the whole buffer
    assert default_logical(5, 5) == 1 and default_logical(1, 1) == 1 and logical_capacity(5, 9, 3) == 3
    with pytest.raises(ValueError, match="c must be at least 2"):
        default_logical(4, 1)
    with pytest.raises(ValueError, match="at least one physical partition"):
        default_logical(0, 3)
    with pytest.raises(ValueError, match="take l >= 4"):
        logical_capacity(16, 8, 3)
    with pytest.raises(ValueError, match=r"outside \[1, p=16\]"):
        logical_capacity(16, 8, 17)
    with pytest.raises(ValueError, match="c must be at least 2"):
        beta_plan(3, 1, 0, 0)


@PROPERTY
@given(st.integers(1, 200), st.data(), st.integers(0, 2**63), st.integers(0, 50))
def test_logical_groups_are_a_balanced_random_grouping(p, data, seed, epoch):
    nl = data.draw(st.integers(1, p))
    logical_of = logical_groups(p, nl, seed, epoch)
    sizes = np.bincount(logical_of, minlength=nl)
    assert logical_of.dtype == np.int64 and len(sizes) == nl
    assert sizes.tolist() == [p // nl + (g < p % nl) for g in range(nl)]
    np.testing.assert_array_equal(logical_of, logical_groups(p, nl, seed, epoch))


def test_plans_are_pure_functions_of_seed_and_epoch():
    for make in (lambda e: comet_plan(24, 6, seed=3, epoch=e), lambda e: beta_plan(24, 6, 3, e)):
        plans = [make(e) for e in range(4)]
        again = make(2)
        assert [s.tolist() for s in again.states] == [s.tolist() for s in plans[2].states]
        np.testing.assert_array_equal(again.bucket_state, plans[2].bucket_state)
        np.testing.assert_array_equal(again.logical_of, plans[2].logical_of)
        for a, b in itertools.combinations(plans, 2):
            assert not np.array_equal(a.bucket_state, b.bucket_state)
            assert [s.tolist() for s in a.states] != [s.tolist() for s in b.states]
    other_seed = comet_plan(24, 6, seed=4, epoch=2)
    assert not np.array_equal(other_seed.bucket_state, comet_plan(24, 6, seed=3, epoch=2).bucket_state)


def test_comet_spreads_a_states_buckets_over_partitions_where_beta_correlates_them():
    for seed in range(5):
        comet = comet_plan(32, 8, seed=seed, epoch=0)
        beta = beta_plan(32, 8, seed, 0)
        # a swap reads a logical partition (4 physical) in COMET, one physical partition in BETA
        assert comet.num_logical == 8 and comet.io_partitions == 8 + 4 * (comet.num_states - 1)
        assert beta.io_partitions == 8 + beta.num_states - 1
        # BETA: every bucket of a swap state has the incoming partition as an end
        assert bucket_correlation(beta) > 0.9
        assert bucket_correlation(comet) < 0.5 * bucket_correlation(beta)
        # not a per-partition count of distinct states: with c_l = 2 the buckets between two logical partitions
        # all train in the one state that holds both, while BETA meets a new partner at nearly every step, so
        # that count favours BETA; the correlation that hurts SGD is within a state, measured above


def test_comet_draws_each_buckets_state_uniformly_among_its_co_resident_states():
    # per number of candidate states k, how often the bucket went to its r-th candidate: chi-square against uniform
    counts: dict[int, np.ndarray] = {}
    for seed in range(150):
        plan = comet_plan(12, 4, seed=seed, epoch=1)  # l = 6, c_l = 2: a logical partition in 5 or more states
        resident = np.zeros((plan.num_states, 12), dtype=bool)
        for t, members in enumerate(plan.states):
            resident[t, members] = True
        for i, j in itertools.product(range(12), repeat=2):
            candidates = np.flatnonzero(resident[:, i] & resident[:, j])
            k = len(candidates)
            if k > 1:
                counts.setdefault(k, np.zeros(k, dtype=np.int64))[
                    int(np.searchsorted(candidates, plan.bucket_state[i, j]))] += 1
    assert counts  # within-group buckets have several candidates
    for k, seen in counts.items():
        if seen.sum() < 20 * k:
            continue
        expected = seen.sum() / k
        chi2 = float(((seen - expected) ** 2 / expected).sum())
        assert chi2 < (k - 1) + 6 * np.sqrt(2 * (k - 1)), (k, seen.tolist())


def test_buffer_plan_refuses_inconsistent_fields():
    plan = comet_plan(8, 4, seed=1, epoch=0)
    fields = dict(policy="comet", num_partitions=8, capacity=4, logical_of=plan.logical_of, states=plan.states,
                  loads=plan.loads, bucket_state=plan.bucket_state, seed=1, epoch=0)
    BufferPlan(**fields)
    with pytest.raises(ValueError, match=r"loads\[1\]"):
        BufferPlan(**{**fields, "loads": [plan.loads[0], plan.states[1]] + plan.loads[2:]})
    with pytest.raises(ValueError, match="bucket_state: states"):
        BufferPlan(**{**fields, "bucket_state": plan.bucket_state + plan.num_states})
    with pytest.raises(ValueError, match=r"states\[0\]"):
        BufferPlan(**{**fields, "capacity": 3})
    with pytest.raises(ValueError, match="policy"):
        BufferPlan(**{**fields, "policy": "greedy"})
