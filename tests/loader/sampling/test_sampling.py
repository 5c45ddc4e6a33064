"""loader.sampling.sampling: the superbatch sampler against a naive reference, structural properties, validation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.sampling.sampling import (
    CSCGraph,
    SampledPass,
    batch_keys,
    key_shares,
    position_keys,
    sample_pass,
    shuffle,
)
from loader.sampling.sampling_kernels import pick_table_size

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
PROPERTY = settings(max_examples=120, deadline=None)


# ---- reference: the module docstring, transcribed literally in plain Python ----

def mix64(z: int) -> int:
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_keys(seed, stream, epoch, pass_index, first_batch, num_batches):
    base = mix64(seed)
    for x in (stream, epoch, pass_index):
        base = mix64(base ^ mix64(x + GAMMA))
    return [mix64(base + (first_batch + i + 1) * GAMMA) for i in range(num_batches)]


def floyd(degree, fanout, target_key):
    picks = []
    for j in range(fanout):
        top = degree - fanout + j
        t = mix64(target_key + (j + 1) * GAMMA) % (top + 1)
        picks.append(top if t in picks else t)
    return picks


def reference_sample(indptr, indices, global_ids, seeds, batch_size, fanouts, keys):
    """Per batch: (nodes, src, dst, num_sampled_nodes, num_sampled_edges) as lists."""
    out = []
    for b, first in enumerate(range(0, len(seeds), batch_size)):
        nodes = list(seeds[first:first + batch_size])
        position = {v: i for i, v in enumerate(nodes)}
        src, dst, counts, edge_counts = [], [], [len(nodes)], []
        begin, end = 0, len(nodes)
        for hop, fanout in enumerate(fanouts, start=1):
            hop_key = mix64(keys[b] + hop * GAMMA)
            edges_before = len(src)
            for i in range(begin, end):
                v = nodes[i]
                neighbours = list(indices[indptr[v]:indptr[v + 1]])
                if fanout == -1 or len(neighbours) <= fanout:
                    picks = list(range(len(neighbours)))
                else:
                    picks = floyd(len(neighbours), fanout, mix64(hop_key ^ mix64(global_ids[v])))
                for p in picks:
                    u = neighbours[p]
                    if u not in position:
                        position[u] = len(nodes)
                        nodes.append(u)
                    src.append(position[u])
                    dst.append(i)
            counts.append(len(nodes) - end)
            edge_counts.append(len(src) - edges_before)
            begin, end = end, len(nodes)
        out.append((nodes, src, dst, counts, edge_counts))
    return out


# ---- strategies ----

def csc(num_nodes, edges, index_dtype=np.int64):
    """In-neighbour CSC of (src, dst) pairs; each list keeps the pairs' order (not sorted)."""
    dst = np.array([d for _, d in edges], dtype=np.int64)
    src = np.array([s for s, _ in edges], dtype=np.int64)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src[order].astype(index_dtype)


@st.composite
def graphs(draw, max_nodes=10, max_edges=40):
    n = draw(st.integers(1, max_nodes))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=max_edges))
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    indptr, indices = csc(n, edges, dtype)
    global_ids = np.array(draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n, unique=True)),
                          dtype=np.int64)
    return CSCGraph(indptr, indices, global_ids)


@st.composite
def passes(draw, max_fanout=4):
    graph = draw(graphs())
    n = graph.num_nodes
    batch_size = draw(st.integers(1, n))
    num_full = draw(st.integers(0, 3))
    seeds = []
    for _ in range(num_full):
        seeds += draw(st.permutations(range(n)))[:batch_size]
    last = draw(st.integers(0, batch_size))  # a partial (or no) last batch
    seeds += draw(st.permutations(range(n)))[:last]
    fanouts = draw(st.lists(st.integers(-1, max_fanout), max_size=3))
    num_batches = -(-len(seeds) // batch_size)
    keys = np.array(draw(st.lists(st.integers(0, MASK), min_size=num_batches, max_size=num_batches)),
                    dtype=np.uint64)
    return graph, np.array(seeds, dtype=np.int64), batch_size, fanouts, keys


def assert_matches_reference(graph, seeds, batch_size, fanouts, keys):
    result = sample_pass(graph, seeds, batch_size, fanouts, keys)
    expected = reference_sample(graph.indptr.tolist(), graph.indices.tolist(), graph.global_ids.tolist(),
                                seeds.tolist(), batch_size, fanouts, [int(k) for k in keys])
    assert result.num_batches == len(expected)
    assert result.num_hops == len(fanouts)
    for b, (nodes, src, dst, counts, edge_counts) in enumerate(expected):
        batch = result.batch(b)
        assert batch.nodes.tolist() == nodes
        assert batch.edge_index.shape == (2, len(src))
        assert batch.edge_index[0].tolist() == src
        assert batch.edge_index[1].tolist() == dst
        assert batch.num_sampled_nodes.tolist() == counts
        assert batch.num_sampled_edges.tolist() == edge_counts
    return result


# ---- equality with the reference ----

@PROPERTY
@given(passes())
def test_sample_pass_equals_reference(case):
    assert_matches_reference(*case)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), extra=st.integers(0, 120), fanouts=st.lists(st.integers(5, 40), min_size=1, max_size=2),
       seed=st.integers(0, 2**32 - 1))
def test_large_fanouts_on_dense_multigraph_equal_reference(n, extra, fanouts, seed):
    """Fanouts in the tens exercise Floyd's collision path and larger membership tables."""
    rng = np.random.default_rng(seed)
    edges = list(zip(rng.integers(0, n, 40 + extra).tolist(), rng.integers(0, n, 40 + extra).tolist()))
    indptr, indices = csc(n, edges)
    graph = CSCGraph(indptr, indices, rng.permutation(10 * n)[:n].astype(np.int64))
    seeds = rng.permutation(n).astype(np.int64)
    batch_size = max(1, n // 2)
    assert_matches_reference(graph, seeds, batch_size, fanouts, batch_keys(seed, 0, 0, 0, 0, -(-n // batch_size)))


def test_edge_cases_equal_reference():
    one = CSCGraph(np.array([0, 1]), np.array([0]), np.array([7]))  # one node, a self loop
    assert_matches_reference(one, np.array([0]), 1, [3, -1], np.array([5], dtype=np.uint64))
    lonely = CSCGraph(np.array([0, 0]), np.array([], dtype=np.int64), np.array([7]))  # one node, no edge
    result = assert_matches_reference(lonely, np.array([0]), 4, [2, 2], np.array([5], dtype=np.uint64))
    assert result.num_sampled_nodes.tolist() == [[1, 0, 0]]
    indptr, indices = csc(3, [(1, 0), (2, 0), (1, 0), (0, 1)])
    graph = CSCGraph(indptr, indices, np.array([10, 11, 12]))
    zero = assert_matches_reference(graph, np.array([0, 1]), 2, [0, 3], np.array([1], dtype=np.uint64))
    assert zero.num_sampled_edges.tolist() == [[0, 0]] and zero.nodes.tolist() == [0, 1]
    dups = assert_matches_reference(graph, np.array([0]), 1, [-1], np.array([1], dtype=np.uint64))
    assert dups.edge_src.tolist() == [1, 2, 1]  # a duplicate edge taken twice is emitted twice
    empty = sample_pass(graph, np.array([], dtype=np.int64), 4, [2], np.array([], dtype=np.uint64))
    assert empty.num_batches == 0 and empty.max_batch_nodes() == 0 and empty.max_batch_edges() == 0
    assert empty.num_sampled_nodes.shape == (0, 2)
    no_hops = assert_matches_reference(graph, np.array([2, 0, 1]), 2, [], np.array([1, 2], dtype=np.uint64))
    assert no_hops.num_sampled_edges.shape == (2, 0)


# ---- structural properties (independent of the reference) ----

@PROPERTY
@given(passes(max_fanout=6))
def test_structure(case):
    graph, seeds, batch_size, fanouts, keys = case
    result = sample_pass(graph, seeds, batch_size, fanouts, keys)
    indptr, indices = graph.indptr, graph.indices
    assert result.max_batch_nodes() == max((len(result.batch(b).nodes) for b in range(result.num_batches)), default=0)
    for b in range(result.num_batches):
        batch = result.batch(b)
        nodes, (src, dst) = batch.nodes, batch.edge_index
        batch_seeds = seeds[b * batch_size:(b + 1) * batch_size]
        assert nodes.dtype == np.int64 and batch.edge_index.dtype == np.int64
        assert nodes[:batch.num_sampled_nodes[0]].tolist() == batch_seeds.tolist()
        assert len(set(nodes.tolist())) == len(nodes)
        assert batch.num_sampled_nodes.sum() == len(nodes) and batch.num_sampled_edges.sum() == src.shape[0]
        hop_nodes = np.concatenate(([0], np.cumsum(batch.num_sampled_nodes)))
        hop_edges = np.concatenate(([0], np.cumsum(batch.num_sampled_edges)))
        for h, fanout in enumerate(fanouts):
            frontier = range(hop_nodes[h], hop_nodes[h + 1])
            s, d = src[hop_edges[h]:hop_edges[h + 1]], dst[hop_edges[h]:hop_edges[h + 1]]
            assert all(t in frontier for t in d.tolist())
            assert (s < hop_nodes[h + 2]).all()  # nothing beyond the nodes reached by this hop
            for t in frontier:
                v = nodes[t]
                neighbours = indices[indptr[v]:indptr[v + 1]].tolist()
                taken = nodes[s[d == t]].tolist()
                expected = len(neighbours) if fanout == -1 else min(len(neighbours), fanout)
                assert len(taken) == expected
                for u in set(taken):
                    assert taken.count(u) <= neighbours.count(u)
            new = range(hop_nodes[h + 1], hop_nodes[h + 2])
            assert set(new) <= set(s.tolist())  # every newly added node is the source of some edge


@settings(max_examples=40, deadline=None)
@given(passes(), st.data())
def test_relabelling_local_ids_keeps_the_sampled_global_edges(case, data):
    """The choice for a target depends only on its global id and neighbour list, not on local ids."""
    graph, seeds, batch_size, fanouts, keys = case
    n = graph.num_nodes
    perm = np.array(data.draw(st.permutations(range(n))), dtype=np.int64)  # old local id -> new local id
    inverse = np.argsort(perm)
    degrees = np.diff(graph.indptr)[inverse]
    indptr = np.concatenate(([0], np.cumsum(degrees))).astype(np.int64)
    indices = np.concatenate([perm[graph.indices[graph.indptr[v]:graph.indptr[v + 1]]] for v in inverse] +
                             [np.zeros(0, np.int64)])
    relabelled = CSCGraph(indptr, indices, graph.global_ids[inverse])
    first = sample_pass(graph, seeds, batch_size, fanouts, keys)
    second = sample_pass(relabelled, perm[seeds], batch_size, fanouts, keys)
    assert np.array_equal(first.num_sampled_nodes, second.num_sampled_nodes)
    for b in range(first.num_batches):
        one, two = first.batch(b), second.batch(b)
        ids_one, ids_two = graph.global_ids[one.nodes], relabelled.global_ids[two.nodes]
        assert ids_one.tolist() == ids_two.tolist()
        assert ids_one[one.edge_index].tolist() == ids_two[two.edge_index].tolist()


def test_same_target_and_list_in_a_larger_graph_samples_the_same():
    rng = np.random.default_rng(3)
    n = 50
    edges = list(zip(rng.integers(0, n, 600).tolist(), rng.integers(0, n, 600).tolist()))
    indptr, indices = csc(n, edges)
    small = CSCGraph(indptr, indices, np.arange(100, 100 + n))
    # 30 more nodes whose lists point anywhere, appended without touching the first 50 lists
    more = edges + list(zip(rng.integers(0, n + 30, 300).tolist(), rng.integers(n, n + 30, 300).tolist()))
    big_indptr, big_indices = csc(n + 30, more)
    big = CSCGraph(big_indptr, big_indices, np.concatenate((np.arange(100, 100 + n), np.arange(5000, 5030))))
    seeds = rng.permutation(n).astype(np.int64)
    keys = batch_keys(1, 2, 3, 4, 0, 5)
    a, b = sample_pass(small, seeds, 10, [4, 3], keys), sample_pass(big, seeds, 10, [4, 3], keys)
    for name in ("node_ptr", "nodes", "edge_ptr", "edge_src", "edge_dst"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_determinism_and_key_sensitivity():
    rng = np.random.default_rng(0)
    edges = list(zip(rng.integers(0, 200, 4000).tolist(), rng.integers(0, 200, 4000).tolist()))
    indptr, indices = csc(200, edges)
    graph = CSCGraph(indptr, indices, np.arange(200) * 3 + 1)
    seeds = rng.permutation(200)[:64].astype(np.int64)
    keys = batch_keys(7, 0, 1, 0, 0, 4)
    one, two = sample_pass(graph, seeds, 16, [5, 3], keys), sample_pass(graph, seeds, 16, [5, 3], keys.copy())
    for name in ("node_ptr", "nodes", "edge_ptr", "edge_src", "edge_dst", "num_sampled_nodes", "num_sampled_edges"):
        assert np.array_equal(getattr(one, name), getattr(two, name)), name
    other = sample_pass(graph, seeds, 16, [5, 3], batch_keys(8, 0, 1, 0, 0, 4))
    for b in range(4):
        assert one.batch(b).nodes.tolist() != other.batch(b).nodes.tolist()
    # a batch's sample depends on its own key only: swapping keys swaps the batches' hop-1 picks
    swapped = sample_pass(graph, np.concatenate((seeds[16:32], seeds[:16], seeds[32:])), 16, [5, 3],
                          keys[[1, 0, 2, 3]])
    assert swapped.batch(0).nodes.tolist() == one.batch(1).nodes.tolist()


def test_batch_keys_follow_the_documented_derivation():
    for args in [(0, 0, 0, 0, 0, 5), (123, 2, 7, 1, 40, 9), (-1, -5, 3, 2, 0, 3), (2**70, 1, 1, 1, 1, 2)]:
        assert batch_keys(*args).tolist() == reference_keys(*args)
    keys = batch_keys(5, 0, 2, 0, 0, 8)
    assert keys.dtype == np.uint64 and keys.shape == (8,)
    assert batch_keys(5, 0, 2, 0, 3, 4).tolist() == keys[3:7].tolist()  # a pure function of the batch index
    for changed in [(6, 0, 2, 0), (5, 1, 2, 0), (5, 0, 3, 0), (5, 0, 2, 1)]:
        assert not set(batch_keys(*changed, 0, 8).tolist()) & set(keys.tolist())
    assert len(set(batch_keys(0, 0, 0, 0, 0, 1000).tolist())) == 1000
    assert batch_keys(0, 0, 0, 0, 0, 0).shape == (0,)
    with pytest.raises(ValueError, match="num_batches"):
        batch_keys(0, 0, 0, 0, 0, -1)
    with pytest.raises(ValueError, match="first_batch"):
        batch_keys(0, 0, 0, 0, -1, 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=50), st.integers(0, 2**63), st.integers(0, 40))
def test_position_keys_are_the_batch_keys_of_each_position(positions, seed, epoch):
    keys = position_keys(seed, 30, epoch, np.array(positions, dtype=np.int64))
    assert keys.dtype == np.uint64
    assert keys.tolist() == [int(batch_keys(seed, 30, epoch, 0, p, 1)[0]) for p in positions]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(1, 2**32 - 1)), max_size=50))
def test_key_shares_is_the_top_32_bits_scaled(pairs):
    keys = np.array([k for k, _ in pairs], dtype=np.uint64)
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    shares = key_shares(keys, counts)
    assert shares.tolist() == [((k >> 32) * c) >> 32 for k, c in pairs]  # Python integers: no wrap-around
    assert all(0 <= s < c for s, (_, c) in zip(shares.tolist(), pairs))


def test_key_shares_are_about_even_and_refuse_bad_counts():
    shares = key_shares(position_keys(1, 30, 1, np.arange(70_000, dtype=np.int64)), np.full(70_000, 7))
    assert np.bincount(shares, minlength=7).min() > 9_500  # 10,000 each expected, sd about 93
    for bad in (0, 2**32):
        with pytest.raises(ValueError, match="counts"):
            key_shares(np.zeros(1, dtype=np.uint64), np.array([bad]))
    with pytest.raises(ValueError, match="negative"):
        position_keys(0, 0, 0, np.array([-1]))


def test_shuffle_is_a_deterministic_permutation_copy():
    ids = np.arange(100, 200, dtype=np.int64)
    a, b = shuffle(ids, 42), shuffle(ids, np.uint64(42))
    assert np.array_equal(a, b) and sorted(a.tolist()) == ids.tolist() and a.tolist() != ids.tolist()
    assert ids.tolist() == list(range(100, 200))
    assert shuffle(ids, 43).tolist() != a.tolist()
    assert shuffle(ids, 2**64 - 1).tolist() == shuffle(ids, 2**64 - 1).tolist()


# ---- validation and input handling ----

def small_graph(**overrides):
    fields = {"indptr": np.array([0, 1, 3, 3]), "indices": np.array([1, 0, 2]), "global_ids": np.array([4, 5, 6])}
    fields.update(overrides)
    return CSCGraph(**fields)


@pytest.mark.parametrize("field, value", [
    ("indptr", np.array([0.0, 1, 3, 3])),
    ("indptr", np.array([0, 1, 3, 3], dtype=np.uint64)),
    ("indptr", np.array([[0, 1, 3, 3]])),
    ("indptr", np.array([1, 1, 3, 3])),
    ("indptr", np.array([0, 1, 3, 4])),
    ("indptr", np.array([], dtype=np.int64)),
    ("indices", np.array([1, 0, 2], dtype=np.uint64)),
    ("indices", np.array([1.0, 0, 2])),
    ("indices", np.array([True, False, True])),
    ("global_ids", np.array([4, 5])),
    ("global_ids", np.array([4, 5, 6], dtype=np.float32)),
])
def test_graph_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        small_graph(**{field: value})


def test_graph_converts_losslessly_and_keeps_memmaps(tmp_path):
    graph = small_graph(indptr=np.array([0, 1, 3, 3], dtype=np.int32), indices=np.array([1, 0, 2], dtype=np.uint16),
                        global_ids=np.array([4, 5, 6], dtype=np.uint32))
    assert graph.indptr.dtype == np.int64 and graph.indices.dtype == np.int32 and graph.global_ids.dtype == np.int64
    assert small_graph(indices=np.array([1, 0, 2], dtype=np.uint32)).indices.dtype == np.int64
    strided = np.array([0, 9, 1, 9, 3, 9, 3])[::2]
    assert small_graph(indptr=strided).indptr.flags.c_contiguous
    arrays = {}
    for name, values, dtype in [("indptr", [0, 1, 3, 3], np.int64), ("indices", [1, 0, 2], np.int32),
                                ("global_ids", [4, 5, 6], np.int64)]:
        np.array(values, dtype=dtype).tofile(tmp_path / name)
        arrays[name] = np.memmap(tmp_path / name, dtype=dtype, mode="r")
    mapped = CSCGraph(**arrays)
    for name, array in arrays.items():
        assert getattr(mapped, name) is array
    result = sample_pass(mapped, np.array([0, 1]), 2, [-1, 1], np.array([9], dtype=np.uint64))
    assert result.batch(0).nodes.tolist() == [0, 1, 2]


def test_sample_pass_validation_names_the_field():
    graph = small_graph()
    key = np.array([1], dtype=np.uint64)
    with pytest.raises(ValueError, match="seeds"):
        sample_pass(graph, np.array([0, 1, 0]), 3, [1], key)
    with pytest.raises(ValueError, match="seeds"):
        sample_pass(graph, np.array([0, 3]), 2, [1], key)
    with pytest.raises(ValueError, match="seeds"):
        sample_pass(graph, np.array([0.0, 1.0]), 2, [1], key)
    with pytest.raises(ValueError, match="keys"):
        sample_pass(graph, np.array([0, 1, 2]), 2, [1], key)
    with pytest.raises(ValueError, match="keys"):
        sample_pass(graph, np.array([0]), 2, [1], np.array([-1]))
    with pytest.raises(ValueError, match="fanouts"):
        sample_pass(graph, np.array([0]), 2, [-2], key)
    with pytest.raises(ValueError, match="batch_size"):
        sample_pass(graph, np.array([0]), 0, [1], key)
    broken = small_graph(indices=np.array([1, 0, 3]))  # an in-neighbour outside [0, M), found when reached
    with pytest.raises(ValueError, match="indices"):
        sample_pass(broken, np.array([1]), 1, [-1], key)
    # the same seed in two different batches is fine, and a failed call leaves no state behind
    result = sample_pass(graph, np.array([0, 1, 0, 2]), 2, [1], np.array([1, 2], dtype=np.uint64))
    assert result.batch(1).nodes[:2].tolist() == [0, 2]
    with pytest.raises(IndexError):
        result.batch(2)


def test_sampled_pass_checks_its_shapes():
    good = sample_pass(small_graph(), np.array([0, 1]), 1, [1], np.array([1, 2], dtype=np.uint64))
    fields = {name: getattr(good, name) for name in SampledPass.__dataclass_fields__}
    with pytest.raises(ValueError, match="edge_dst"):
        SampledPass(**{**fields, "edge_dst": fields["edge_dst"][:-1]})
    with pytest.raises(ValueError, match="num_sampled_nodes"):
        SampledPass(**{**fields, "num_hops": 2})


def table_size_loop(fanout: int) -> int:
    """How the three samplers sized Floyd's pick table before ``pick_table_size`` (each wrote this loop)."""
    size = 2
    while size < 2 * fanout:
        size *= 2
    return size


@settings(max_examples=300, deadline=None)
@given(st.integers(-1, 1 << 40))
def test_pick_table_size_is_the_smallest_power_of_two_holding_twice_the_fanout(fanout):
    size = pick_table_size(fanout)
    assert size == table_size_loop(fanout)
    assert size >= 2 and size & (size - 1) == 0 and size >= 2 * fanout
    assert size == 2 or size // 2 < 2 * fanout  # the smallest such: half of it would be over half full
