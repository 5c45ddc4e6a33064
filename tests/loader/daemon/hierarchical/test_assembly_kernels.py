"""loader.daemon.hierarchical.assembly_kernels: induced subgraph and the local_of map against plain Python
references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.hierarchical.assembly_kernels import clear_local_of, fill_local_of, induce_subgraph


def reference_induce(global_ids, raw_lists):
    local = {g: i for i, g in enumerate(global_ids)}
    indptr, indices = [0], []
    for neighbours in raw_lists:
        indices += [local[u] for u in neighbours if u in local]
        indptr.append(len(indices))
    return indptr, indices


@st.composite
def megabatches(draw):
    n = draw(st.integers(1, 40))
    global_ids = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    # the first targets' lists as read, the others' in a CSC held in memory (the static cache), any of its lists
    # in any order, its index dtype possibly not the read lists'
    read = draw(st.integers(0, len(global_ids)))
    raw_lists = [draw(st.lists(st.integers(0, n - 1), max_size=8)) for _ in range(read)]
    held_lists = [draw(st.lists(st.integers(0, n - 1), max_size=8)) for _ in range(draw(st.integers(0, 6)))]
    held = draw(st.lists(st.integers(0, len(held_lists) - 1), max_size=len(global_ids) - read)) if held_lists else []
    dtype, held_dtype = (draw(st.sampled_from([np.int32, np.int64])) for _ in range(2))
    lead = draw(st.integers(0, 5))  # raw_indptr as a slice of a larger CSC that does not start at 0
    return n, global_ids, raw_lists, held_lists, held, dtype, held_dtype, lead


def csc(lists, dtype, lead=0):
    indices = np.array([0] * lead + [u for neighbours in lists for u in neighbours], dtype=dtype)
    indptr = lead + np.concatenate(([0], np.cumsum([len(x) for x in lists]))).astype(np.int64)
    return indptr, indices


NO_HELD = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


@settings(max_examples=150, deadline=None)
@given(megabatches())
def test_induce_subgraph_equals_reference(case):
    n, global_ids, raw_lists, held_lists, held, dtype, held_dtype, lead = case
    ids = np.array(global_ids, dtype=np.int64)
    raw_indptr, raw_indices = csc(raw_lists, dtype, lead)
    held_indptr, held_indices = csc(held_lists, held_dtype)
    local_of = np.full(n, -1, dtype=np.int32)
    fill_local_of(local_of, ids)
    assert [local_of[g] for g in global_ids] == list(range(len(global_ids)))
    assert (np.delete(local_of, ids) == -1).all()
    indptr, indices = induce_subgraph(local_of, raw_indptr, raw_indices, held_indptr, held_indices,
                                      np.array(held, dtype=np.int64))
    clear_local_of(local_of, ids)
    assert (local_of == -1).all()
    expected_indptr, expected_indices = reference_induce(global_ids, raw_lists + [held_lists[p] for p in held])
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    assert indptr.tolist() == expected_indptr
    assert indices.tolist() == expected_indices


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
        induce_subgraph(local_of, np.array([0, 2], dtype=np.int64), np.array([2, 3], dtype=np.int64), *NO_HELD)
    with pytest.raises(ValueError, match="outside"):  # in a held list too
        induce_subgraph(local_of, np.array([0], dtype=np.int64), np.zeros(0, dtype=np.int64),
                        np.array([0, 2], dtype=np.int64), np.array([0, -1], dtype=np.int64), np.array([0]))
    indptr, indices = induce_subgraph(local_of, np.array([0, 0, 0], dtype=np.int64), np.zeros(0, dtype=np.int64),
                                      *NO_HELD)
    assert indptr.tolist() == [0, 0, 0] and indices.tolist() == []
