"""The subgraph induced by node ranges (loader/sampling/induced.py) against a plain Python reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.sampling.induced import check_ranges, induced_by_ranges, local_in_ranges, range_nodes
from loader.sampling.sampling import CSCGraph, sample_pass

PROPERTY = settings(max_examples=150, deadline=None)


def ref_induced(indptr: list[int], indices: list[int], global_ids: list[int], ranges: list[tuple[int, int]]
                ) -> tuple[list[int], list[int], list[int]]:
    """(indptr, indices, global_ids) of the induced subgraph, node by node and edge by edge."""
    resident = [v for b, e in ranges for v in range(b, e)]
    local = {v: k for k, v in enumerate(resident)}
    out_ptr, out_idx = [0], []
    for v in resident:
        out_idx += [local[u] for u in indices[indptr[v]:indptr[v + 1]] if u in local]
        out_ptr.append(len(out_idx))
    return out_ptr, out_idx, [global_ids[v] for v in resident]


@st.composite
def graphs_and_ranges(draw):
    n = draw(st.integers(0, 30))
    degrees = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    indices = [draw(st.integers(0, n - 1)) for _ in range(sum(degrees))]  # duplicates and self-loops included
    indptr = np.concatenate(([0], np.cumsum(degrees, dtype=np.int64))).tolist()
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=8)))
    bounds = [0, *cuts, n]
    # consecutive pieces of [0, n), some kept: ranges ascending, disjoint, possibly empty or adjacent
    ranges = [(b, e) for b, e in zip(bounds, bounds[1:]) if draw(st.booleans())]
    global_ids = draw(st.permutations(range(0, 3 * n, 3)))  # not the local ids: the result must carry them
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    return indptr, indices, list(global_ids), ranges, dtype


@PROPERTY
@given(graphs_and_ranges())
def test_induced_matches_the_reference(case):
    indptr, indices, global_ids, ranges, dtype = case
    graph = CSCGraph(np.array(indptr, np.int64), np.array(indices, dtype), np.array(global_ids, np.int64))
    begin = np.array([b for b, _ in ranges], np.int64)
    end = np.array([e for _, e in ranges], np.int64)
    sub = induced_by_ranges(graph, begin, end)
    assert (sub.indptr.tolist(), sub.indices.tolist(), sub.global_ids.tolist()) == ref_induced(
        indptr, indices, global_ids, ranges)
    assert sub.indices.dtype == dtype
    resident = [v for b, e in ranges for v in range(b, e)]
    assert range_nodes(begin, end).tolist() == resident
    assert local_in_ranges(np.array(resident, np.int64), begin, end).tolist() == list(range(len(resident)))
    outside = sorted(set(range(len(global_ids))) - set(resident))
    for v in outside[:3]:
        with pytest.raises(ValueError, match=f"node {v} lies outside"):
            local_in_ranges(np.array([v], np.int64), begin, end)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_target_whose_list_is_resident_samples_as_in_the_full_graph(seed):
    """Draws are keyed by global id: a seed whose in-neighbours are all resident picks the same neighbours."""
    rng = np.random.default_rng(seed)
    n = 40
    degrees = rng.integers(0, 8, n)
    indptr = np.concatenate(([0], np.cumsum(degrees)))
    indices = rng.integers(0, 20, int(degrees.sum()))  # every neighbour below 20: the range [0, 20) holds them
    graph = CSCGraph(indptr, indices, np.arange(n, dtype=np.int64))
    sub = induced_by_ranges(graph, np.array([0, 30]), np.array([20, 40]))
    target = int(rng.integers(0, 20))
    key = np.array([rng.integers(0, 2**63)], dtype=np.uint64)
    full, part = sample_pass(graph, np.array([target]), 1, [3], key).batch(0), \
        sample_pass(sub, np.array([target]), 1, [3], key).batch(0)
    assert graph.global_ids[full.nodes].tolist() == sub.global_ids[part.nodes].tolist()
    assert full.edge_index.tolist() == part.edge_index.tolist()


@pytest.mark.parametrize("begin, end, message", [
    ([0, 3], [4, 6], "ascending and disjoint"),
    ([3], [2], "begin <= end"),
    ([0], [11], r"in \[0, 10\)"),
    ([0, 1], [2], "lengths 2 and 1 differ"),
])
def test_bad_ranges_are_refused(begin, end, message):
    with pytest.raises(ValueError, match=message):
        check_ranges(np.array(begin, np.int64), np.array(end, np.int64), 10)
