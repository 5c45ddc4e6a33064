"""loader.caches.changeset and loader.caches.feature_cache: Belady plans against a brute-force reference, replayed for
validity, compared with LRU and a static cache, and applied bit-exactly by the executor."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.caches.changeset import CachePlan, CachePlanner, CacheState, plan_cache
from loader.caches.feature_cache import ArrayRowFetcher, FeatureCache
from loader.sampling.sampling import CSCGraph, batch_keys, sample_pass

PROPERTY = settings(max_examples=100, deadline=None)


# ---- reference: the model of the module docstring, simulated literally ----

def next_access(sets, v, t):
    """The first iteration after t that accesses v, or inf (sets: R_0 .. R_{T-1} as sets)."""
    return next((s for s in range(t + 1, len(sets)) if v in sets[s]), math.inf)


def reference(trace, capacity, prior_ids=()):
    """(misses, fill reads) of Belady's schedule, scanning the future for every next access."""
    sets = [set(batch) for batch in trace]
    prior = set(prior_ids)
    accessed = set().union(*sets)
    ranked = sorted(accessed, key=lambda v: (next_access(sets, v, -1), v not in prior))
    cache = set(ranked[:capacity])
    fill = len(cache - prior)
    misses = 0
    for t, batch in enumerate(sets):
        misses += len(batch - cache)
        candidates = [v for v in cache | batch if next_access(sets, v, t) < math.inf]
        cache = set(sorted(candidates, key=lambda v: next_access(sets, v, t))[:capacity])
    return misses, fill


def lru_misses(trace, capacity):
    recency = {}  # id -> last use; the cache holds the `capacity` most recent
    cache = set()
    misses = 0
    for t, batch in enumerate(trace):
        misses += len(set(batch) - cache)
        recency.update({v: t for v in batch})
        keep = sorted(cache | set(batch), key=lambda v: -recency[v])
        cache = set(keep[:capacity])
    return misses


def static_misses(trace, capacity):
    counts = {}
    for batch in trace:
        for v in batch:
            counts[v] = counts.get(v, 0) + 1
    cache = set(sorted(counts, key=lambda v: -counts[v])[:capacity])
    return sum(len(set(batch) - cache) for batch in trace)


def csr(trace):
    ptr = np.zeros(len(trace) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(batch) for batch in trace])
    ids = np.array([v for batch in trace for v in batch], dtype=np.int64)
    return ptr, ids


def replay(plan: CachePlan, trace, capacity, prior: CacheState, prefetch=True):
    """Apply the plan to a simulated cache (slot -> id), checking every step is legal; returns the misses."""
    sets = [set(batch) for batch in trace]
    cache = dict(zip(prior.slots.tolist(), prior.ids.tolist()))
    assert plan.fill_ids.tolist() == sorted(plan.fill_ids.tolist())
    assert len(set(plan.fill_slots.tolist())) == plan.num_fill
    accessed = {v for batch in trace for v in batch}
    for v, slot, evicted in zip(plan.fill_ids.tolist(), plan.fill_slots.tolist(), plan.fill_evicted_ids.tolist()):
        assert 0 <= slot < capacity
        assert v in accessed and v not in cache.values()
        assert cache.get(slot, -1) == evicted
        cache[slot] = v
    misses = 0
    for t, batch in enumerate(trace):
        holder = {v: slot for slot, v in cache.items()}
        assert len(holder) == len(cache)  # one slot per id
        hits = plan.hit_slots(t).tolist()
        assert len(hits) == len(batch)
        for v, slot in zip(batch, hits):
            if slot >= 0:
                assert cache[slot] == v
            else:
                assert v not in holder  # a cached id is always used
                misses += 1
        change = plan.changeset(t)
        assert len(set(change.slots.tolist())) == len(change.slots)
        for v, evicted, position, slot in zip(change.in_ids.tolist(), change.out_ids.tolist(),
                                              change.in_positions.tolist(), change.slots.tolist()):
            assert 0 <= slot < capacity
            assert batch[position] == v and hits[position] == -1  # only a missed row of R_t enters
            if prefetch:
                assert next_access(sets, v, t) < math.inf  # and only if used again
            elif next_access(sets, v, t) == math.inf:  # without prefetch also into a slot nobody else wants
                assert evicted == -1
            assert cache.get(slot, -1) == evicted
            cache[slot] = v
        if (change.out_ids >= 0).any():  # a row is evicted only when no slot is free
            assert len(cache) == capacity
    assert dict(zip(plan.final_slots.tolist(), plan.final_ids.tolist())) == cache
    return misses


def check_plan(trace, capacity, num_nodes, prior_ids=(), prior_slots=()):
    prior = CacheState(np.array(prior_ids, dtype=np.int64), np.array(prior_slots, dtype=np.int64))
    ptr, ids = csr(trace)
    plan = plan_cache(ptr, ids, capacity, num_nodes, prior)
    misses, fill = reference(trace, capacity, prior_ids)
    assert plan.num_misses == misses
    assert plan.num_fill == fill
    assert plan.num_hits == len(ids) - misses
    assert replay(plan, trace, capacity, prior) == misses
    return plan


# ---- strategies ----

@st.composite
def traces(draw, max_iters=30, max_ids=60):
    num_nodes = draw(st.integers(1, max_ids))
    pool = st.lists(st.integers(0, num_nodes - 1), unique=True, max_size=min(num_nodes, 25))
    trace = draw(st.lists(pool, max_size=max_iters))
    return trace, num_nodes


@st.composite
def planning_cases(draw):
    trace, num_nodes = draw(traces())
    capacity = draw(st.integers(0, 70))
    prior_ids, prior_slots = [], []
    if capacity and draw(st.booleans()):
        size = draw(st.integers(0, min(capacity, num_nodes)))
        prior_ids = draw(st.permutations(range(num_nodes)))[:size]
        prior_slots = draw(st.permutations(range(capacity)))[:size]
    return trace, capacity, num_nodes, prior_ids, prior_slots


# ---- the plan against the reference ----

@PROPERTY
@given(planning_cases())
def test_plan_equals_brute_force_and_replays(case):
    check_plan(*case)


@PROPERTY
@given(traces(), st.integers(0, 30))
def test_plan_beats_lru_and_static(case, capacity):
    trace, num_nodes = case
    ptr, ids = csr(trace)
    plan = plan_cache(ptr, ids, capacity, num_nodes)
    assert plan.num_misses <= lru_misses(trace, capacity)
    assert plan.num_misses <= static_misses(trace, capacity)


def test_ties_keep_the_prior_and_bypass_before_evicting():
    # Ids 1 and 2 are first used together: the prior's 2 is kept rather than 1 read.
    plan = check_plan([[1, 2], [1, 2]], 1, 4, prior_ids=[2], prior_slots=[0])
    assert plan.num_fill == 0 and plan.hit_slots(0).tolist() == [-1, 0]
    # 3 and the cached 1 are next used together: 3 is not copied in.
    plan = check_plan([[1], [3], [1, 3]], 1, 4)
    assert plan.num_updates == 0
    # the same within one iteration, the miss 1 listed before the hit 3 (both next used at 1)
    plan = check_plan([[1, 3], [1, 3]], 1, 4, prior_ids=[3], prior_slots=[0])
    assert plan.num_fill == 0 and plan.num_updates == 0


# ---- edge cases ----

def test_capacity_zero_misses_everything():
    trace = [[0, 1], [1, 2], [0, 1, 2]]
    plan = check_plan(trace, 0, 3)
    assert plan.num_misses == 7 and plan.num_fill == 0 and plan.num_updates == 0
    assert (plan.hit_slot == -1).all() and len(plan.final_ids) == 0


def test_capacity_above_distinct_ids_fills_all_and_never_misses():
    trace = [[4, 1], [1, 2], [7, 4, 2]]
    plan = check_plan(trace, 10, 8)
    assert plan.num_misses == 0 and plan.num_fill == 4 and plan.fill_ids.tolist() == [1, 2, 4, 7]


def test_empty_trace_keeps_the_prior():
    prior = CacheState(np.array([5, 3]), np.array([0, 2]))
    plan = plan_cache(np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int64), 3, 6, prior)
    assert plan.num_iterations == 0 and plan.num_misses == plan.num_fill == 0
    assert plan.final_state.same_as(prior)


def test_single_iteration():
    plan = check_plan([[3, 0, 2]], 2, 4, prior_ids=[0, 1], prior_slots=[1, 0])
    assert plan.num_misses == 1 and plan.num_fill == 1  # 0 kept, 1 dropped for one of 2 and 3


def test_stale_rows_stay_until_their_slot_is_needed():
    # 0 is not used after iteration 0, but it stays for the next superbatch while nothing needs its slot.
    plan = check_plan([[0, 1], [1]], 2, 3)
    assert sorted(plan.final_ids.tolist()) == [0, 1]
    # Here the slot is needed for 2: 0, the least recently used stale row, goes first.
    plan = check_plan([[0], [1], [2], [2, 1]], 2, 3)
    assert sorted(plan.final_ids.tolist()) == [1, 2]
    # 0 went stale before 1, so 0 makes room for 2
    plan = check_plan([[0, 1], [1], [2], [2]], 2, 3)
    assert sorted(plan.final_ids.tolist()) == [1, 2]


@pytest.mark.parametrize("trace_ptr, trace_ids, prior, match", [
    ([0, 2, 4], [1, 2, 3, 3], None, "trace_ids: id 3 occurs twice in iteration 1"),
    ([0, 3], [1, 2, 1], None, "trace_ids: id 1 occurs twice in iteration 0"),
    ([0, 2], [1, 9], None, r"trace_ids: entry 1 holds id 9, outside \[0, num_nodes = 5\)"),
    ([0, 2], [-1, 0], None, "trace_ids: entry 0 holds id -1"),
    ([0, 2], [0.5, 1], None, "trace_ids: expected an integer array"),
    ([1, 2], [0, 1], None, "trace_ptr: first entry"),
    ([0, 3], [0, 1], None, "trace_ptr: last entry"),
    ([0, 2, 1, 2], [0, 1], None, "trace_ptr: decreases at iteration 1"),
    ([0, 1], [0], CacheState([1, 1], [0, 1]), "prior.ids: id 1 occurs twice"),
    ([0, 1], [0], CacheState([1, 2], [1, 1]), "prior.slots: slot 1 occurs twice"),
    ([0, 1], [0], CacheState([1], [3]), r"prior.slots: entry 0 holds slot 3, outside \[0, capacity = 3\)"),
    ([0, 1], [0], CacheState([7], [0]), "prior.ids: entry 0 holds id 7"),
    ([0, 1], [0], CacheState([1, 2, 3, 4], [0, 1, 2, 0]), "prior: 4 ids, more than capacity"),
])
def test_bad_input_is_refused_and_the_planner_still_works(trace_ptr, trace_ids, prior, match):
    planner = CachePlanner(5, 3)
    with pytest.raises(ValueError, match=match):
        planner.plan(np.array(trace_ptr), np.array(trace_ids), prior)
    # An error leaves the scratch clean, so the same planner plans correctly afterwards. A stale
    # entry would show: 1, 2 and 3 occur only in iterations 0 and 1, where a left-over "seen at"
    # value reads as a repeat, or a wrong next access breaks the bucket invariant.
    assert (planner._scratch == -1).all()
    trace = [[1, 2, 0], [3, 4], [0], [4]]
    plan = planner.plan(*csr(trace))
    assert (plan.num_misses, plan.num_fill) == reference(trace, 3)
    assert replay(plan, trace, 3, CacheState()) == plan.num_misses


def test_planner_is_reusable_across_superbatches():
    rng = np.random.default_rng(0)
    planner = CachePlanner(40, 8)
    prior = CacheState()
    for _ in range(5):
        trace = [rng.choice(40, rng.integers(0, 15), replace=False).tolist() for _ in range(12)]
        plan = planner.plan(*csr(trace), prior=prior)
        assert (plan.num_misses, plan.num_fill) == reference(trace, 8, prior.ids.tolist())
        assert replay(plan, trace, 8, prior) == plan.num_misses
        prior = plan.final_state


def test_constructors_validate():
    with pytest.raises(ValueError, match="capacity"):
        CachePlanner(5, -1)
    with pytest.raises(ValueError, match="num_nodes"):
        CachePlanner(-1, 2)
    with pytest.raises(ValueError, match="slots: length 1"):
        CacheState([1, 2], [0])
    plan = plan_cache(*csr([[0, 1]]), 2, 2)
    with pytest.raises(IndexError):
        plan.changeset(1)


# ---- a realistic trace: the node lists of a sampled pass ----

def test_plan_on_sampled_batches_equals_brute_force():
    rng = np.random.default_rng(7)
    num_nodes, num_edges = 400, 2400
    dst = rng.integers(0, num_nodes, num_edges)
    src = (dst + rng.geometric(0.05, num_edges)) % num_nodes  # some locality, like a community graph
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    graph = CSCGraph(indptr, src[order].astype(np.int64), np.arange(num_nodes, dtype=np.int64))
    seeds = rng.permutation(num_nodes)[:300]
    keys = batch_keys(seed=1, stream=0, epoch=0, pass_index=0, first_batch=0, num_batches=30)
    sampled = sample_pass(graph, seeds, 10, [4, 3], keys)
    trace = [sampled.nodes[sampled.node_ptr[b]:sampled.node_ptr[b + 1]].tolist() for b in range(sampled.num_batches)]
    for capacity in (0, 40, 150):
        plan = plan_cache(sampled.node_ptr, sampled.nodes, capacity, num_nodes)
        assert (plan.num_misses, plan.num_fill) == reference(trace, capacity)
        assert replay(plan, trace, capacity, CacheState()) == plan.num_misses
        assert plan.num_misses <= lru_misses(trace, capacity)


# ---- no prefetch: a cache fed only by the batches (the trainer's cache) ----

def reference_no_prefetch(trace, capacity, prior_ids=()):
    """Misses of Belady's schedule when nothing is read outside a batch: S_0 = the prior's accessed ids."""
    sets = [set(batch) for batch in trace]
    accessed = set().union(*sets)
    cache = set(prior_ids) & accessed
    misses = 0
    for t, batch in enumerate(sets):
        misses += len(batch - cache)
        candidates = [v for v in cache | batch if next_access(sets, v, t) < math.inf]
        cache = set(sorted(candidates, key=lambda v: next_access(sets, v, t))[:capacity])
    return misses


def optimum_no_prefetch(trace, capacity, prior_ids=()):
    """The fewest misses of any schedule of the demand model, by exhaustive search over cache contents."""
    import itertools

    states = {frozenset(prior_ids): 0}
    for batch in map(set, trace):
        following: dict[frozenset, int] = {}
        for cache, misses in states.items():
            misses += len(batch - cache)
            pool = sorted(cache | batch)
            for size in range(min(capacity, len(pool)) + 1):
                for keep in itertools.combinations(pool, size):
                    key = frozenset(keep)
                    if following.get(key, math.inf) > misses:
                        following[key] = misses
        states = following
    return min(states.values())


@PROPERTY
@given(planning_cases())
def test_no_prefetch_plan_equals_brute_force_and_replays(case):
    trace, capacity, num_nodes, prior_ids, prior_slots = case
    prior = CacheState(np.array(prior_ids, dtype=np.int64), np.array(prior_slots, dtype=np.int64))
    plan = plan_cache(*csr(trace), capacity, num_nodes, prior, prefetch=False)
    misses = reference_no_prefetch(trace, capacity, prior_ids)
    assert plan.num_fill == 0
    assert plan.num_misses == misses
    assert replay(plan, trace, capacity, prior, prefetch=False) == misses
    # never better than with prefetch, which may also read rows outside the batches
    assert plan.num_misses >= plan_cache(*csr(trace), capacity, num_nodes, prior).num_misses


@settings(max_examples=150, deadline=None)
@given(case=traces(max_iters=6, max_ids=6), capacity=st.integers(0, 4), prior_size=st.integers(0, 4),
       data=st.data())
def test_no_prefetch_plan_is_optimal_against_exhaustive_search(case, capacity, prior_size, data):
    trace, num_nodes = case
    size = min(prior_size, capacity, num_nodes)
    prior_ids = data.draw(st.permutations(range(num_nodes)))[:size]
    prior = CacheState(np.array(prior_ids, dtype=np.int64), np.arange(size, dtype=np.int64))
    plan = plan_cache(*csr(trace), capacity, num_nodes, prior, prefetch=False)
    assert plan.num_misses == optimum_no_prefetch(trace, capacity, prior_ids)


def test_no_prefetch_keeps_rows_for_the_next_superbatch_while_there_is_room():
    planner = CachePlanner(10, 4)
    first = planner.plan(*csr([[0, 1], [2], [3, 4]]), prefetch=False)
    # 0..4 are never accessed again in the superbatch, yet 4 of them stay (room for 4), none evicted
    assert first.num_updates == 4 and (first.evicted_ids == -1).all()
    second = planner.plan(*csr([[0, 1, 2, 3, 4]]), first.final_state, prefetch=False)
    assert second.num_misses == 1


def test_no_prefetch_first_accesses_always_miss():
    trace = [[0, 1], [0, 1, 2], [2, 3]]
    plan = plan_cache(*csr(trace), 4, 4, prefetch=False)
    assert plan.num_fill == 0
    assert plan.hit_slot.tolist() == [-1, -1, plan.hit_slot[2], plan.hit_slot[3], -1, plan.hit_slot[5], -1]
    assert plan.num_misses == 4  # 0, 1, 2, 3 once each; everything else hits
    # with prefetch the same cache reads 0..3 before iteration 0 and never misses
    assert plan_cache(*csr(trace), 4, 4).num_misses == 0


# ---- the executor ----

class CountingReader:
    """Plain numpy indexing of the feature matrix, counting the rows it reads."""

    def __init__(self, features):
        self.features = features
        self.rows_read = 0

    def __call__(self, ids, positions, out):
        out[positions] = self.features[ids]
        self.rows_read += len(ids)


def bits(array):
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def run_superbatch(cache, plan, features, reader):
    cache.fill(plan, reader)
    for t in range(plan.num_iterations):
        ids = plan.ids(t)
        x = np.empty((len(ids), features.shape[1]), dtype=features.dtype)
        bits(x)[...] = 0x5A5A  # garbage, so that a row left unwritten shows
        cache.gather(plan, t, x, reader)
        assert np.array_equal(bits(x), bits(features)[ids])


@settings(max_examples=60, deadline=None)
@given(case=planning_cases(), dtype=st.sampled_from([np.float32, np.float16]), dim=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_feature_cache_gathers_bit_exact_rows(case, dtype, dim, seed):
    trace, capacity, num_nodes, _, _ = case
    rng = np.random.default_rng(seed)
    width = np.dtype(dtype).itemsize * 8
    features = rng.integers(0, 2**width, (num_nodes, dim), dtype=np.uint64).astype(f"u{width // 8}").view(dtype)
    cache = FeatureCache.empty(capacity, dim, dtype)
    reader = CountingReader(features)
    planner = CachePlanner(num_nodes, capacity)
    plan = planner.plan(*csr(trace))
    run_superbatch(cache, plan, features, reader)
    assert reader.rows_read == plan.num_misses + plan.num_fill
    # the second superbatch starts from the first one's final state
    second = [rng.choice(num_nodes, rng.integers(0, num_nodes + 1), replace=False).tolist() for _ in range(8)]
    plan2 = planner.plan(*csr(second), prior=cache.state)
    reader.rows_read = 0
    run_superbatch(cache, plan2, features, reader)
    assert reader.rows_read == plan2.num_misses + plan2.num_fill
    assert (plan2.num_misses, plan2.num_fill) == reference(second, capacity, plan.final_ids.tolist())


@settings(max_examples=60, deadline=None)
@given(case=planning_cases(), seed=st.integers(0, 2**32 - 1))
def test_feature_cache_replays_no_prefetch_plans_across_superbatches(case, seed):
    trace, capacity, num_nodes, _, _ = case
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((num_nodes, 3)).astype(np.float32)
    cache = FeatureCache.empty(capacity, 3, np.float32)
    reader = CountingReader(features)
    planner = CachePlanner(num_nodes, capacity)
    for superbatch in (trace, trace[::-1], trace):
        plan = planner.plan(*csr(superbatch), prior=cache.state, prefetch=False)
        reader.rows_read = 0
        run_superbatch(cache, plan, features, reader)
        assert plan.num_fill == 0
        assert reader.rows_read == plan.num_misses  # rows arrive only with the batches


def test_array_row_reader_on_a_memmap(tmp_path):
    features = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    features.tofile(tmp_path / "features.bin")
    mapped = np.memmap(tmp_path / "features.bin", dtype=np.float32, mode="r", shape=(40, 6))
    reader = ArrayRowFetcher(mapped)
    trace = [[3, 9, 1], [9, 2], [1, 3, 39, 0], [2, 9]]
    plan = plan_cache(*csr(trace), 2, 40)
    cache = FeatureCache.empty(2, 6, np.float32)
    cache.fill(plan, reader)
    for t in range(plan.num_iterations):
        x = np.empty((len(trace[t]), 6), dtype=np.float32)
        cache.gather(plan, t, x, reader)
        assert np.array_equal(x, features[trace[t]])
    assert reader.rows_read == plan.num_misses + plan.num_fill
    with pytest.raises(ValueError, match="ids: outside"):
        reader(np.array([40]), np.array([0]), np.empty((1, 6), dtype=np.float32))


def test_feature_cache_refuses_misuse():
    features = np.arange(20, dtype=np.float32).reshape(10, 2)
    reader = CountingReader(features)
    trace = [[1, 2], [2, 3], [1, 3]]
    plan = plan_cache(*csr(trace), 2, 10)
    cache = FeatureCache.empty(2, 2, np.float32)
    with pytest.raises(ValueError, match="fill"):
        cache.gather(plan, 0, np.empty((2, 2), dtype=np.float32), reader)
    with pytest.raises(ValueError, match="capacity"):
        FeatureCache.empty(3, 2, np.float32).fill(plan, reader)
    cache.fill(plan, reader)
    with pytest.raises(ValueError, match="t: 1, expected the next iteration 0"):
        cache.gather(plan, 1, np.empty((2, 2), dtype=np.float32), reader)
    with pytest.raises(ValueError, match="x: float64"):
        cache.gather(plan, 0, np.empty((2, 2), dtype=np.float64), reader)
    with pytest.raises(ValueError, match="x: float32 \\(3, 2\\)"):
        cache.gather(plan, 0, np.empty((3, 2), dtype=np.float32), reader)
    with pytest.raises(ValueError, match="x: not C-contiguous"):
        cache.gather(plan, 0, np.empty((2, 4), dtype=np.float32)[:, ::2], reader)
    with pytest.raises(RuntimeError, match="state"):
        _ = cache.state
    with pytest.raises(ValueError, match="finish it or reset"):
        cache.fill(plan, reader)
    for t in range(3):
        cache.gather(plan, t, np.empty((2, 2), dtype=np.float32), reader)
    # a plan from the wrong prior (here: empty, while the cache holds rows) is refused
    with pytest.raises(ValueError, match="prior"):
        cache.fill(plan_cache(*csr(trace), 2, 10), reader)
    cache.reset()
    cache.fill(plan_cache(*csr(trace), 2, 10), reader)


def test_feature_cache_after_a_failing_reader():
    features = np.arange(20, dtype=np.float32).reshape(10, 2)
    trace = [[1, 2], [2, 3], [1, 3]]
    plan = plan_cache(*csr(trace), 2, 10)
    cache = FeatureCache.empty(2, 2, np.float32)

    def broken(ids, positions, out):
        raise OSError("disk gone")

    with pytest.raises(OSError):
        cache.fill(plan, broken)
    with pytest.raises(ValueError, match="unknown"):
        cache.fill(plan, CountingReader(features))
    cache.reset()
    cache.fill(plan, CountingReader(features))
    x = np.empty((2, 2), dtype=np.float32)
    cache.gather(plan, 0, x, CountingReader(features))
    with pytest.raises(OSError):  # iteration 1 misses 3
        cache.gather(plan, 1, x, broken)
    cache.gather(plan, 1, x, CountingReader(features))  # a retry works
    assert np.array_equal(x, features[[2, 3]])
