"""loader.sampling.link_sampling: link batches and epoch plans against a plain Python reference; properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.sampling.inmemory import STREAM_SHUFFLE, STREAM_TEST, STREAM_TRAIN, STREAM_TRAIN_RANK, STREAM_VAL
from loader.sampling.link_sampling import (
    STREAM_LINK_SHUFFLE,
    STREAM_LINK_TEST,
    STREAM_LINK_TRAIN,
    STREAM_LINK_VAL,
    SampledLinkBatch,
    link_batch_plan,
    link_batch_plan_in_order,
    link_eval_plan,
    link_shuffle_key,
    sample_link_batch,
)
from loader.sampling.sampling import CSCGraph
from tests.loader.sampling.test_sampling import GAMMA, MASK, csc, floyd, mix64
from tests.loader.sampling.test_sampling import reference_keys as sampler_keys

PROPERTY = settings(max_examples=150, deadline=None)


# ---- reference: the module docstrings of link_sampling and sampling, transcribed in plain Python ----

def reference_keys(seed, stream, epoch, num_batches):
    """A link plan's batch keys: the node sampler's keys of pass 0 from batch 0 (``batch_keys``)."""
    return sampler_keys(seed, stream, epoch, 0, 0, num_batches)


def reference_neighbours(indptr, indices, global_ids, seeds, fanouts, key):
    """One batch of the node sampler: (nodes, src, dst, hops of the edges, num_sampled_nodes)."""
    nodes = list(seeds)
    position = {v: i for i, v in enumerate(nodes)}
    src, dst, hops, counts = [], [], [], [len(nodes)]
    begin, end = 0, len(nodes)
    for hop, fanout in enumerate(fanouts, start=1):
        hop_key = mix64(key + hop * GAMMA)
        for i in range(begin, end):
            v = nodes[i]
            neighbours = indices[indptr[v]:indptr[v + 1]]
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
                hops.append(hop - 1)
        counts.append(len(nodes) - end)
        begin, end = end, len(nodes)
    return nodes, src, dst, hops, counts


def reference_link_batch(graph, src, dst, num_nodes, fanouts, key, k, pool, disjoint):
    indptr, indices, global_ids = graph.indptr.tolist(), graph.indices.tolist(), graph.global_ids.tolist()
    b = len(src)
    negative_key = mix64(key)
    negatives = []
    for m in range(b * k):
        draw = mix64(negative_key + (m + 1) * GAMMA)
        negatives.append(pool[draw % len(pool)] if pool is not None else draw % num_nodes)
    label_src, label_dst = src * (1 + k), dst + negatives
    seeds = sorted(set(label_src + label_dst), key=lambda v: global_ids[v])
    seat = {v: i for i, v in enumerate(seeds)}
    label_index = [[seat[v] for v in label_src], [seat[v] for v in label_dst]]
    if b:
        nodes, esrc, edst, hops, counts = reference_neighbours(indptr, indices, global_ids, seeds, fanouts, key)
    else:
        nodes, esrc, edst, hops, counts = [], [], [], [], [0] * (len(fanouts) + 1)
    if disjoint:
        pairs = {(seat[s], seat[d]) for s, d in zip(src, dst)} | {(seat[d], seat[s]) for s, d in zip(src, dst)}
        kept = [e for e in range(len(esrc)) if (esrc[e], edst[e]) not in pairs]
        esrc, edst, hops = [esrc[e] for e in kept], [edst[e] for e in kept], [hops[e] for e in kept]
    return {"nodes": [global_ids[v] for v in nodes], "local_nodes": nodes, "edge_index": [esrc, edst],
            "num_sampled_nodes": counts, "num_sampled_edges": [hops.count(h) for h in range(len(fanouts))],
            "edge_label_index": label_index, "edge_label": [1.0] * b + [0.0] * (b * k),
            "edge_label_global": [[global_ids[v] for v in label_src], [global_ids[v] for v in label_dst]]}


# ---- strategies ----

@st.composite
def link_cases(draw, max_nodes=10, max_edges=40):
    n = draw(st.integers(1, max_nodes))
    node = st.integers(0, n - 1)
    edges = draw(st.lists(st.tuples(node, node), max_size=max_edges))
    indptr, indices = csc(n, edges, draw(st.sampled_from([np.int32, np.int64])))
    global_ids = draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n, unique=True))
    graph = CSCGraph(indptr, indices, np.array(global_ids, dtype=np.int64))
    # positives: graph edges (so disjoint has something to drop) or any pairs, repeats allowed
    pair = st.sampled_from(edges) if edges else st.tuples(node, node)
    positives = draw(st.lists(st.one_of(pair, st.tuples(node, node)), min_size=1, max_size=6))
    src, dst = [s for s, _ in positives], [d for _, d in positives]
    pool = draw(st.one_of(st.none(), st.lists(node, min_size=1, max_size=6)))
    return {"graph": graph, "src": src, "dst": dst, "num_nodes": draw(st.integers(1, n)),
            "fanouts": draw(st.lists(st.integers(-1, 4), max_size=3)), "key": draw(st.integers(0, MASK)),
            "k": draw(st.integers(0, 3)), "pool": pool, "disjoint": draw(st.booleans())}


def run(case, **changes) -> SampledLinkBatch:
    c = {**case, **changes}
    pool = None if c["pool"] is None else np.array(c["pool"], dtype=np.int64)
    return sample_link_batch(c["graph"], np.array(c["src"], dtype=np.int64), np.array(c["dst"], dtype=np.int64),
                             c["num_nodes"], c["fanouts"], c["key"], negatives_per_positive=c["k"],
                             negative_pool=pool, disjoint=c["disjoint"])


def as_lists(batch: SampledLinkBatch) -> dict:
    return {name: getattr(batch, name).tolist() for name in
            ("nodes", "local_nodes", "edge_index", "num_sampled_nodes", "num_sampled_edges", "edge_label_index",
             "edge_label", "edge_label_global")}


DTYPES = {"nodes": np.int64, "local_nodes": np.int64, "edge_index": np.int64, "num_sampled_nodes": np.int64,
          "num_sampled_edges": np.int64, "edge_label_index": np.int64, "edge_label": np.float32,
          "edge_label_global": np.int64}


# ---- equality with the reference ----

@PROPERTY
@given(link_cases())
def test_sample_link_batch_equals_reference(case):
    batch = run(case)
    for name, dtype in DTYPES.items():
        assert getattr(batch, name).dtype == dtype, name
    assert batch.edge_index.shape[0] == 2 and batch.edge_label_index.shape[0] == 2
    expected = reference_link_batch(case["graph"], case["src"], case["dst"], case["num_nodes"], case["fanouts"],
                                    case["key"], case["k"], case["pool"], case["disjoint"])
    assert as_lists(batch) == expected


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(0, 4), disjoint=st.booleans())
def test_larger_graph_equals_reference(seed, k, disjoint):
    """Hundreds of edges and fanouts past the degrees of most nodes: Floyd's collisions, many repeats."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    edges = list(zip(rng.integers(0, n, 8 * n).tolist(), rng.integers(0, n, 8 * n).tolist()))
    graph = CSCGraph(*csc(n, edges), rng.permutation(10 * n)[:n].astype(np.int64))
    chosen = rng.integers(0, len(edges), int(rng.integers(1, 20)))
    case = {"graph": graph, "src": [edges[i][0] for i in chosen], "dst": [edges[i][1] for i in chosen],
            "num_nodes": n, "fanouts": [int(f) for f in rng.integers(1, 12, int(rng.integers(1, 4)))],
            "key": int(rng.integers(0, 2**63)), "k": k, "pool": None, "disjoint": disjoint}
    expected = reference_link_batch(graph, case["src"], case["dst"], n, case["fanouts"], case["key"], k, None,
                                    disjoint)
    assert as_lists(run(case)) == expected


# ---- structural properties (independent of the reference) ----

@PROPERTY
@given(link_cases())
def test_structure(case):
    batch = run(case)
    graph, src, dst, k = case["graph"], case["src"], case["dst"], case["k"]
    b, n = len(src), len(batch.nodes)
    label_src, label_dst = batch.edge_label_index
    local = batch.local_nodes
    # positives map back to the given pairs; negatives keep their positive's source
    assert local[label_src[:b]].tolist() == src and local[label_dst[:b]].tolist() == dst
    assert local[label_src].tolist() == src * (1 + k)
    negatives = local[label_dst[b:]]
    assert len(negatives) == b * k
    if case["pool"] is None:
        assert ((negatives >= 0) & (negatives < case["num_nodes"])).all()
    else:
        assert set(negatives.tolist()) <= set(case["pool"])
    assert batch.edge_label.tolist() == [1.0] * b + [0.0] * (b * k) and batch.num_positives == b
    assert (batch.nodes == graph.global_ids[local]).all()
    assert (batch.edge_label_global == batch.nodes[batch.edge_label_index]).all()
    # seeds: exactly the endpoints, once each, sorted by global id; every node once
    seeds = batch.num_seeds
    assert set(local[:seeds].tolist()) == set(src + dst + negatives.tolist())
    assert (np.diff(batch.nodes[:seeds]) > 0).all()
    assert (batch.edge_label_index < seeds).all()
    assert len(set(local.tolist())) == n
    assert batch.num_sampled_nodes.sum() == n and batch.num_sampled_edges.sum() == batch.edge_index.shape[1]
    assert batch.num_sampled_nodes.shape == (len(case["fanouts"]) + 1,)
    # every sampled edge is a graph edge u -> v (row the in-neighbour u, column the target v)
    supervision = {frozenset(p) for p in zip(src, dst)}
    for row, col in batch.edge_index.T.tolist():
        u, v = int(local[row]), int(local[col])
        assert u in graph.indices[graph.indptr[v]:graph.indptr[v + 1]].tolist()
        if case["disjoint"]:
            assert frozenset((u, v)) not in supervision


@PROPERTY
@given(link_cases())
def test_deterministic_for_a_key_and_disjoint_only_drops(case):
    first, again = run(case, disjoint=False), run(case, disjoint=False)
    assert as_lists(first) == as_lists(again)
    dropped = run(case, disjoint=True)
    # the node set and everything but the supervision edges are those of the non-disjoint batch
    for name in ("nodes", "local_nodes", "num_sampled_nodes", "edge_label_index", "edge_label"):
        assert getattr(dropped, name).tolist() == getattr(first, name).tolist()
    b = len(case["src"])
    pairs = {frozenset(p) for p in first.edge_label_index[:, :b].T.tolist()}
    kept = [e for e in first.edge_index.T.tolist() if frozenset(e) not in pairs]
    assert dropped.edge_index.T.tolist() == kept


def test_input_dtypes_do_not_change_the_batch():
    indptr, indices = csc(4, [(1, 0), (2, 0), (3, 1), (0, 2), (1, 3)])
    graph = CSCGraph(indptr, indices, np.array([40, 10, 30, 20]))
    wide = sample_link_batch(graph, np.array([1, 3]), np.array([0, 1]), 4, [2, 2], 99, 2)
    narrow = sample_link_batch(graph, np.array([1, 3], dtype=np.int32), [0, 1], 4, (2, 2), np.uint64(99), 2)
    assert as_lists(wide) == as_lists(narrow)
    assert wide.nodes[:wide.num_seeds].tolist() == sorted(wide.nodes[:wide.num_seeds].tolist())


def test_uniform_negatives_cover_the_range_evenly():
    graph = CSCGraph(np.zeros(11, dtype=np.int64), np.zeros(0, dtype=np.int64), np.arange(10))
    batch = sample_link_batch(graph, np.zeros(1000, dtype=np.int64), np.ones(1000, dtype=np.int64), 10, [], 7,
                              negatives_per_positive=10)
    counts = np.bincount(batch.local_nodes[batch.edge_label_index[1, 1000:]], minlength=10)
    assert counts.sum() == 10_000 and counts.min() > 850 and counts.max() < 1150  # mean 1000, sd 30
    pooled = sample_link_batch(graph, np.zeros(1000, dtype=np.int64), np.ones(1000, dtype=np.int64), 10, [], 7,
                               negatives_per_positive=3, negative_pool=np.array([4, 8]))
    counts = np.bincount(pooled.local_nodes[pooled.edge_label_index[1, 1000:]], minlength=10)
    assert counts[[4, 8]].sum() == 3000 and min(counts[4], counts[8]) > 1350


def test_empty_batch_and_no_negatives():
    indptr, indices = csc(3, [(1, 0), (0, 1)])
    graph = CSCGraph(indptr, indices, np.array([5, 6, 7]))
    empty = sample_link_batch(graph, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 3, [2, 2], 1, 3)
    assert empty.nodes.shape == (0,) and empty.edge_index.shape == (2, 0) and empty.edge_label_index.shape == (2, 0)
    assert empty.num_sampled_nodes.tolist() == [0, 0, 0] and empty.num_sampled_edges.tolist() == [0, 0]
    only = sample_link_batch(graph, [0], [1], 3, [-1], 1, negatives_per_positive=0, disjoint=True)
    assert only.edge_label.tolist() == [1.0] and only.edge_index.shape == (2, 0)  # both edges are the pair's own
    assert only.num_sampled_edges.tolist() == [0] and only.local_nodes.tolist() == [0, 1]


@pytest.mark.parametrize(("changes", "message"), [
    ({"src": [0, 1]}, "src, dst: lengths"),
    ({"src": [3]}, "src: local id 3"),
    ({"dst": [-1]}, "dst: local id -1"),
    ({"src": [0.5]}, "src: expected an integer"),
    ({"k": -1}, "negatives_per_positive"),
    ({"num_nodes": 0}, "num_nodes: 0"),
    ({"num_nodes": 4}, "num_nodes: 4"),
    ({"pool": []}, "negative_pool: empty"),
    ({"pool": [5]}, "negative_pool: local id 5"),
    ({"key": -1}, "key: -1"),
    ({"key": 1 << 64}, "key: "),
    ({"fanouts": [-2]}, "fanouts"),
])
def test_bad_input_is_refused_naming_the_field(changes, message):
    indptr, indices = csc(3, [(1, 0), (0, 1), (2, 2)])
    case = {"graph": CSCGraph(indptr, indices, np.array([5, 6, 7])), "src": [0], "dst": [1], "num_nodes": 3,
            "fanouts": [2], "key": 1, "k": 1, "pool": None, "disjoint": False, **changes}
    with pytest.raises(ValueError, match=message):
        sample_link_batch(case["graph"], np.array(case["src"]), np.array(case["dst"], dtype=np.int64),
                          case["num_nodes"], case["fanouts"], case["key"], case["k"],
                          None if case["pool"] is None else np.array(case["pool"], dtype=np.int64))


def test_shared_global_ids_are_refused():
    graph = CSCGraph(np.zeros(3, dtype=np.int64), np.zeros(0, dtype=np.int64), np.array([9, 9]))
    with pytest.raises(ValueError, match="global_ids: local node"):
        sample_link_batch(graph, [0], [1], 2, [], 0)
    with pytest.raises(ValueError, match="graph: expected a CSCGraph"):
        sample_link_batch(None, [0], [1], 2, [], 0)  # type: ignore[arg-type]


# ---- epoch plans ----

def test_streams_are_distinct_from_every_other_stream():
    from loader.daemon.hierarchical.pipeline import STREAM_MEGABATCH_SHUFFLE

    link = {STREAM_LINK_SHUFFLE, STREAM_LINK_TRAIN, STREAM_LINK_VAL, STREAM_LINK_TEST}
    others = {STREAM_TRAIN, STREAM_VAL, STREAM_TEST, STREAM_SHUFFLE, STREAM_TRAIN_RANK, STREAM_MEGABATCH_SHUFFLE}
    assert len(link) == 4 and not link & others


@PROPERTY
@given(num_edges=st.integers(0, 300), batch_size=st.integers(1, 40), seed=st.integers(0, MASK),
       epoch=st.integers(0, 1000))
def test_plan_covers_every_edge_once_and_equals_reference(num_edges, batch_size, seed, epoch):
    plan = link_batch_plan(num_edges, batch_size, seed, epoch)
    assert sorted(plan.order.tolist()) == list(range(num_edges)) and plan.order.dtype == np.int64
    shuffle_key = reference_keys(seed, STREAM_LINK_SHUFFLE, epoch, 1)[0]
    assert link_shuffle_key(seed, epoch) == shuffle_key
    assert plan.order.tolist() == np.random.Generator(np.random.PCG64(shuffle_key)).permutation(num_edges).tolist()
    num_batches = -(-num_edges // batch_size)
    assert plan.num_batches == num_batches and plan.keys.dtype == np.uint64
    assert plan.keys.tolist() == reference_keys(seed, STREAM_LINK_TRAIN, epoch, num_batches)
    pieces = [plan.batch(b) for b in range(num_batches)]
    assert all(1 <= len(edges) <= batch_size for edges, _ in pieces)
    assert [e for edges, _ in pieces for e in edges.tolist()] == plan.order.tolist()
    assert [key for _, key in pieces] == plan.keys.tolist()
    again = link_batch_plan(num_edges, batch_size, seed, epoch)
    assert again.order.tolist() == plan.order.tolist() and again.keys.tolist() == plan.keys.tolist()


def test_plan_changes_with_the_epoch_and_seed():
    base = link_batch_plan(100, 8, 3, 0)
    for other in (link_batch_plan(100, 8, 3, 1), link_batch_plan(100, 8, 4, 0)):
        assert other.order.tolist() != base.order.tolist() and other.keys.tolist() != base.keys.tolist()
    with pytest.raises(IndexError):
        base.batch(base.num_batches)


@PROPERTY
@given(data=st.data(), batch_size=st.integers(1, 10), seed=st.integers(0, 2**32), epoch=st.integers(0, 9))
def test_plan_in_order_keeps_the_order_and_the_keys(data, batch_size, seed, epoch):
    order = data.draw(st.lists(st.integers(0, 500), unique=True, max_size=60))
    plan = link_batch_plan_in_order(np.array(order, dtype=np.int64), batch_size, seed, epoch)
    shuffled = link_batch_plan(len(order), batch_size, seed, epoch)
    assert plan.order.tolist() == order
    assert plan.batch_ptr.tolist() == shuffled.batch_ptr.tolist() and plan.keys.tolist() == shuffled.keys.tolist()
    sizes = data.draw(st.lists(st.integers(1, batch_size), min_size=0, max_size=len(order)))
    sizes = sizes[:len(order)]
    remainder = len(order) - sum(sizes)
    if remainder < 0:
        return
    sizes += [batch_size] * (remainder // batch_size) + ([remainder % batch_size] if remainder % batch_size else [])
    ptr = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    cut = link_batch_plan_in_order(order, batch_size, seed, epoch, batch_ptr=ptr)
    assert [cut.batch(b)[0].tolist() for b in range(cut.num_batches)] == [
        order[ptr[b]:ptr[b + 1]] for b in range(len(sizes))]
    assert cut.keys.tolist() == reference_keys(seed, STREAM_LINK_TRAIN, epoch, len(sizes))


def test_plan_in_order_refuses_bad_orders():
    with pytest.raises(ValueError, match="order: edge position 3 occurs twice"):
        link_batch_plan_in_order(np.array([3, 1, 3]), 2, 0, 0)
    with pytest.raises(ValueError, match="negative"):
        link_batch_plan_in_order(np.array([-1]), 2, 0, 0)
    with pytest.raises(ValueError, match="batch_ptr: expected pointers"):
        link_batch_plan_in_order(np.array([0, 1, 2]), 2, 0, 0, batch_ptr=np.array([0, 2]))
    with pytest.raises(ValueError, match="batch_ptr: batch sizes"):
        link_batch_plan_in_order(np.array([0, 1, 2]), 2, 0, 0, batch_ptr=np.array([0, 3]))
    with pytest.raises(ValueError, match="batch_ptr: batch sizes"):
        link_batch_plan_in_order(np.array([0, 1, 2]), 2, 0, 0, batch_ptr=np.array([0, 0, 1, 3]))
    with pytest.raises(ValueError, match="batch_size"):
        link_batch_plan(5, 0, 0, 0)
    with pytest.raises(ValueError, match="num_edges"):
        link_batch_plan(-1, 2, 0, 0)


def test_eval_plan_is_in_order_with_its_split_stream():
    val, test = link_eval_plan(10, 4, 5, "val"), link_eval_plan(10, 4, 5, "test")
    assert val.order.tolist() == list(range(10)) and val.batch_ptr.tolist() == [0, 4, 8, 10]
    assert val.keys.tolist() == reference_keys(5, STREAM_LINK_VAL, 0, 3)
    assert test.keys.tolist() == reference_keys(5, STREAM_LINK_TEST, 0, 3)
    with pytest.raises(ValueError, match="split"):
        link_eval_plan(10, 4, 5, "train")


def test_plan_batches_feed_the_sampler():
    """An epoch end to end: every positive trained once, each batch's pairs the plan's."""
    rng = np.random.default_rng(1)
    edges = list(zip(rng.integers(0, 30, 120).tolist(), rng.integers(0, 30, 120).tolist()))
    graph = CSCGraph(*csc(30, edges), np.arange(30))
    src, dst = np.array([s for s, _ in edges]), np.array([d for _, d in edges])
    plan = link_batch_plan(len(edges), 16, 11, 2)
    seen = []
    for b in range(plan.num_batches):
        positions, key = plan.batch(b)
        batch = sample_link_batch(graph, src[positions], dst[positions], 30, [3, 2], key, 2, disjoint=True)
        positives = batch.edge_label_global[:, :len(positions)]
        assert positives.tolist() == [src[positions].tolist(), dst[positions].tolist()]
        seen += positions.tolist()
    assert sorted(seen) == list(range(len(edges)))
