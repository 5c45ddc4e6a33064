"""loader.format.link: the edge-bucket key is a bijection in the documented order; the split table and its errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.link import (
    LinkSplit,
    bucket_ids,
    bucket_keys,
    check_edge_split,
    decode_bucket_keys,
    unit_keys,
)
from proto.errors import UserError


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=7), e=st.integers(0, 80), seed=st.integers(0, 2**31))
def test_bucket_keys_sort_by_partitions_then_ids(sizes, e, seed):
    """Against the plain order: sorting by key is sorting by (partition of src, of dst, src, dst); keys decode back."""
    if sum(sizes) == 0:
        sizes = [*sizes, 1]
    n = sum(sizes)
    node_end = np.cumsum(sizes).astype(np.int64)
    node_begin = node_end - np.array(sizes, dtype=np.int64)
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    keys = bucket_keys(src, dst, node_begin, node_end, n)
    assert keys.size == 0 or (keys.min() >= 0 and keys.max() < n * n)
    back = decode_bucket_keys(keys, node_begin, node_end, n)
    np.testing.assert_array_equal(back[0], src)
    np.testing.assert_array_equal(back[1], dst)

    def part(v: int) -> int:
        return next(p for p in range(len(sizes)) if node_begin[p] <= v < node_end[p])

    plain = sorted(zip(src.tolist(), dst.tolist()), key=lambda sd: (part(sd[0]), part(sd[1]), sd[0], sd[1]))
    order = np.argsort(keys, kind="stable")
    assert list(zip(src[order].tolist(), dst[order].tolist())) == plain
    p = len(sizes)
    np.testing.assert_array_equal(bucket_ids(src, dst, node_end),
                                  [part(s) * p + part(d) for s, d in zip(src.tolist(), dst.tolist())])
    assert len(set(keys.tolist())) == len(set(zip(src.tolist(), dst.tolist())))  # one key per edge


def test_every_key_of_a_small_graph_is_one_edge():
    sizes = [2, 0, 3, 1]
    n = sum(sizes)
    node_end = np.cumsum(sizes)
    node_begin = node_end - np.array(sizes)
    src, dst = np.divmod(np.arange(n * n), n)
    keys = bucket_keys(src, dst, node_begin, node_end, n)
    np.testing.assert_array_equal(np.sort(keys), np.arange(n * n))


def test_unit_keys_join_both_directions_only_when_undirected():
    src, dst = np.array([1, 4, 2]), np.array([4, 1, 2])
    assert unit_keys(src, dst, 5, directed=False).tolist() == [9, 9, 12]
    assert unit_keys(src, dst, 5, directed=True).tolist() == [9, 21, 12]


def test_link_table_round_trips_and_names_missing_keys():
    link = LinkSplit(False, (0.85, 0.05, 0.1), 3, 100, 850, 50, 100)
    assert LinkSplit.from_json(link.to_json()) == link
    assert link.of("val") == 50
    data = link.to_json()
    del data["eval_negatives"]
    with pytest.raises(KeyError, match="link.eval_negatives"):
        LinkSplit.from_json(data)
    with pytest.raises(ValueError, match="link.train"):
        LinkSplit.from_json({**link.to_json(), "train": -1})


@pytest.mark.parametrize("ratios", [(0.5, 0.5), (0.8, 0.1, 0.2), (0.0, 0.5, 0.5), (1.2, -0.1, -0.1), ("a", 0, 1)])
def test_check_edge_split_refuses(ratios):
    with pytest.raises(UserError, match="--edge-split"):
        check_edge_split(ratios)
