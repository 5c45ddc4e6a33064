"""loader.daemon.hierarchical.assembly_kernels: induced subgraph and the local_of map against plain Python
references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.hierarchical.assemble import group_static_lists
from loader.daemon.hierarchical.assembly_kernels import (
    clear_local_of,
    fill_local_of,
    induce_subgraph,
    static_sources_by_prefix,
)
from loader.daemon.resident import StaticCache


def reference_induce(global_ids, raw_lists):
    local = {g: i for i, g in enumerate(global_ids)}
    indptr, indices = [0], []
    for neighbours in raw_lists:
        indices += [local[u] for u in neighbours if u in local]
        indptr.append(len(indices))
    return indptr, indices


@st.composite
def megabatches(draw):
    """A mega-batch as the assembler has it: partitions are contiguous id ranges, the mega-batch some of them
    plus the static nodes outside them; the first targets' lists as read (any ids), then some of the static
    nodes' held lists (grouped by ``group_static_lists``), their index dtype possibly not the read lists'."""
    n = draw(st.integers(1, 40))
    cuts = sorted(draw(st.lists(st.integers(1, n - 1), unique=True, max_size=6))) if n > 1 else []
    bounds = list(zip([0, *cuts], [*cuts, n], strict=True))
    chosen = sorted(draw(st.lists(st.integers(0, len(bounds) - 1), unique=True, max_size=len(bounds))))
    ranges = np.array([bounds[p] for p in chosen], dtype=np.int64).reshape(-1, 2)
    members = [u for begin, end in ranges.tolist() for u in range(begin, end)]
    static = sorted(draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n)))
    global_ids = draw(st.permutations(members)) + [u for u in static if u not in set(members)]
    read = draw(st.integers(0, len(global_ids)))
    raw_lists = [draw(st.lists(st.integers(0, n - 1), max_size=8)) for _ in range(read)]
    held_lists = [draw(st.lists(st.integers(0, n - 1), max_size=12)) for _ in static]
    held = draw(st.lists(st.integers(0, len(held_lists) - 1), max_size=len(global_ids) - read)) if held_lists else []
    dtype, held_dtype = (draw(st.sampled_from([np.int32, np.int64])) for _ in range(2))
    lead = draw(st.integers(0, 5))  # raw_indptr as a slice of a larger CSC that does not start at 0
    return n, global_ids, raw_lists, held_lists, held, static, ranges, dtype, held_dtype, lead


def csc(lists, dtype, lead=0):
    indices = np.array([0] * lead + [u for neighbours in lists for u in neighbours], dtype=dtype)
    indptr = lead + np.concatenate(([0], np.cumsum([len(x) for x in lists]))).astype(np.int64)
    return indptr, indices


def grouped(static, lists, dtype):
    """``group_static_lists`` of the static nodes ``static`` with in-lists ``lists``, checked against plain
    Python: each list's static sources first, then the others, each ascending; the sources as positions."""
    indptr, indices = csc(lists, dtype)
    nodes = np.array(static, dtype=np.int64)
    cache = group_static_lists(StaticCache(nodes, np.zeros(len(static), np.int64), indptr, indices,
                                           np.zeros((len(static), 1), np.float32)))
    inside = set(static)
    ahead = [sorted(u for u in x if u in inside) for x in lists]
    expect = [a + sorted(u for u in x if u not in inside) for a, x in zip(ahead, lists, strict=True)]
    assert cache.indices.dtype == indices.dtype and (cache.indptr == indptr).all()
    assert [cache.indices[indptr[v]:indptr[v + 1]].tolist() for v in range(len(lists))] == expect
    assert np.diff(cache.heads).tolist() == [len(a) for a in ahead] and cache.heads[0] == 0
    assert cache.head_sources.tolist() == [static.index(u) for a in ahead for u in a]
    return cache


NO_HELD = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64),
           np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64))
NO_RANGES = np.zeros((0, 2), dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(megabatches())
def test_induce_subgraph_equals_reference(case):
    """On grouped held lists the kernel's heads and binary-searched ranges keep what a scan of the whole list
    keeps, in the grouped order."""
    n, global_ids, raw_lists, held_lists, held, static, ranges, dtype, held_dtype, lead = case
    ids = np.array(global_ids, dtype=np.int64)
    raw_indptr, raw_indices = csc(raw_lists, dtype, lead)
    cache = grouped(static, held_lists, held_dtype)
    local_of = np.full(n, -1, dtype=np.int32)
    fill_local_of(local_of, ids)
    assert [local_of[g] for g in global_ids] == list(range(len(global_ids)))
    assert (np.delete(local_of, ids) == -1).all()
    indptr, indices = induce_subgraph(local_of, raw_indptr, raw_indices, cache.indptr, cache.indices, cache.heads,
                                      cache.head_sources, local_of[cache.nodes], np.array(held, dtype=np.int64),
                                      ranges)
    clear_local_of(local_of, ids)
    assert (local_of == -1).all()
    held_order = [cache.indices[cache.indptr[p]:cache.indptr[p + 1]].tolist() for p in held]
    expected_indptr, expected_indices = reference_induce(global_ids, raw_lists + held_order)
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    assert indptr.tolist() == expected_indptr
    assert indices.tolist() == expected_indices


@settings(max_examples=150, deadline=None)
@given(data=st.data(), k=st.integers(0, 8), dtype=st.sampled_from([np.int32, np.int64]))
def test_static_sources_by_prefix_counts_what_each_prefix_keeps_first(data, k, dtype):
    """Entry j: of the first j static nodes in rank order, their in-list entries from among those j, the head
    ``group_static_lists`` makes of the cache ``select`` keeps for that prefix."""
    nodes = sorted(data.draw(st.lists(st.integers(0, 30), unique=True, min_size=k, max_size=k)))
    lists = [data.draw(st.lists(st.integers(0, 30), max_size=8)) for _ in nodes]
    order = data.draw(st.permutations(range(k)))  # positions in rank order
    rank = np.empty(k, dtype=np.int64)
    rank[order] = np.arange(k)
    indptr, indices = csc(lists, dtype)
    counts = static_sources_by_prefix(indptr, indices, np.array(nodes, dtype=np.int64), rank)
    expect = []
    for j in range(k + 1):
        kept = {nodes[v] for v in order[:j]}
        expect.append(sum(u in kept for v in order[:j] for u in lists[v]))
    assert counts.tolist() == expect


def test_fill_local_of_rejects_bad_ids_and_leaves_the_map_clean():
    local_of = np.full(10, -1, dtype=np.int32)
    with pytest.raises(ValueError, match="repeated"):
        fill_local_of(local_of, np.array([3, 5, 3], dtype=np.int64))
    assert (local_of == -1).all()
    with pytest.raises(ValueError, match="outside"):
        fill_local_of(local_of, np.array([1, 10], dtype=np.int64))
    assert (local_of == -1).all()
    fill_local_of(local_of, np.array([2], dtype=np.int64))
    with pytest.raises(ValueError, match="not cleared"):  # the previous mega-batch still set
        fill_local_of(local_of, np.array([4, 2], dtype=np.int64))
    assert local_of.tolist() == [-1, -1, 0] + [-1] * 7


def test_induce_subgraph_rejects_neighbours_outside_local_of():
    local_of = np.array([0, -1, 1], dtype=np.int32)
    with pytest.raises(ValueError, match="outside"):
        induce_subgraph(local_of, np.array([0, 2], dtype=np.int64), np.array([2, 3], dtype=np.int64), *NO_HELD,
                        NO_RANGES)
    with pytest.raises(ValueError, match="outside"):  # in a held list's range too
        induce_subgraph(local_of, np.array([0], dtype=np.int64), np.zeros(0, dtype=np.int64),
                        np.array([0, 2], dtype=np.int64), np.array([0, 5], dtype=np.int64), np.zeros(2, np.int64),
                        np.zeros(0, np.int32), np.zeros(1, np.int32), np.array([0]), np.array([[0, 9]]))
    with pytest.raises(ValueError, match="not a static node of the mega-batch"):  # a head outside the table
        induce_subgraph(local_of, np.array([0], dtype=np.int64), np.zeros(0, dtype=np.int64),
                        np.array([0, 1], dtype=np.int64), np.array([0], dtype=np.int64),
                        np.array([0, 1], dtype=np.int64), np.array([1], np.int32), np.zeros(1, np.int32),
                        np.array([0]), NO_RANGES)
    indptr, indices = induce_subgraph(local_of, np.array([0, 0, 0], dtype=np.int64), np.zeros(0, dtype=np.int64),
                                      *NO_HELD, NO_RANGES)
    assert indptr.tolist() == [0, 0, 0] and indices.tolist() == []
