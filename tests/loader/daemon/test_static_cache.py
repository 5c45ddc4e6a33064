"""The static cache's degree ranking and the subsets ``static_cache = "auto"`` keeps, against plain Python."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.resident import StaticCache
from loader.format.partition_table import PartitionTable


@st.composite
def static_caches(draw):
    k = draw(st.integers(0, 12))
    nodes = np.sort(np.asarray(draw(st.lists(st.integers(0, 500), min_size=k, max_size=k, unique=True)), np.int64))
    lists = [draw(st.lists(st.integers(0, 500), max_size=6)) for _ in range(k)]
    indptr = np.zeros(k + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=indptr[1:])
    indices = np.asarray([v for x in lists for v in x], np.int32)
    features = np.arange(k * 3, dtype=np.float32).reshape(k, 3)
    return StaticCache(nodes, nodes % 4, indptr, indices, features), lists


@settings(max_examples=100, deadline=None)
@given(cache_and_lists=static_caches(), data=st.data())
def test_select_keeps_each_node_with_its_list_and_row(cache_and_lists, data):
    cache, lists = cache_and_lists
    positions = data.draw(st.lists(st.integers(0, max(0, cache.num_nodes - 1)), unique=True,
                                   max_size=cache.num_nodes)) if cache.num_nodes else []
    chosen = cache.select(np.asarray(positions, np.int64))
    expect = sorted(positions)
    assert chosen.nodes.tolist() == [int(cache.nodes[i]) for i in expect]
    assert chosen.partition.tolist() == [int(cache.partition[i]) for i in expect]
    assert [chosen.indices[chosen.indptr[j]:chosen.indptr[j + 1]].tolist() for j in range(len(expect))] == \
        [lists[i] for i in expect]
    np.testing.assert_array_equal(chosen.features, cache.features[expect].reshape(-1, 3))


@settings(max_examples=100, deadline=None)
@given(cache_and_lists=static_caches())
def test_by_degree_ranks_highest_in_degree_first_then_lower_id(cache_and_lists):
    cache, lists = cache_and_lists
    expect = sorted(range(cache.num_nodes), key=lambda i: (-len(lists[i]), int(cache.nodes[i])))
    assert cache.by_degree().tolist() == expect


@settings(max_examples=100, deadline=None)
@given(cache_and_lists=static_caches(), ends=st.lists(st.integers(1, 500), min_size=1, max_size=5, unique=True))
def test_cut_in_degree_counts_neighbours_of_other_partitions(cache_and_lists, ends):
    cache, lists = cache_and_lists
    partition_ends = np.asarray(sorted(ends) + [501], np.int64)

    def partition_of(node):
        return next(p for p, end in enumerate(partition_ends.tolist()) if node < end)

    cache = StaticCache(cache.nodes, np.asarray([partition_of(int(v)) for v in cache.nodes], np.int64),
                        cache.indptr, cache.indices, cache.features)
    expect = [sum(partition_of(u) != partition_of(int(v)) for u in lists[i]) for i, v in enumerate(cache.nodes)]
    table = np.zeros((len(partition_ends), 6), np.int64)
    table[:, 1] = partition_ends
    table[1:, 0] = partition_ends[:-1]
    assert cache.cut_in_degree(PartitionTable(table)).tolist() == expect
