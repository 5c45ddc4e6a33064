"""loader.daemon.gather_kernels: row gather and byte-offset lookup against plain Python references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.gather_kernels import gather_rows
from loader.format.partition_table import row_offsets_for


def reference_gather(src, row_offsets, row_bytes, nodes):
    out = b""
    for node in nodes:
        out += bytes(src[row_offsets[node]:row_offsets[node] + row_bytes])
    return out


@settings(max_examples=150, deadline=None)
@given(src_bytes=st.integers(0, 300), row_bytes=st.integers(0, 40), num_local=st.integers(1, 20),
       num_nodes=st.integers(0, 30), spare=st.integers(0, 50), seed=st.integers(0, 2**32 - 1),
       words=st.booleans(), src_shift=st.integers(0, 7), out_shift=st.integers(0, 7))
def test_gather_rows_equals_reference(src_bytes, row_bytes, num_local, num_nodes, spare, seed, words, src_shift,
                                      out_shift):
    # words: rows of whole 8-byte words at offsets that are multiples of 8 (the word copy), else any (byte
    # slices); either array may start at any address
    rng = np.random.default_rng(seed)
    if words:
        row_bytes -= row_bytes % 8
    src = rng.integers(0, 256, src_shift + src_bytes + row_bytes, dtype=np.uint8)[src_shift:]
    row_offsets = rng.integers(0, src_bytes + 1, num_local).astype(np.int64)  # rows may overlap
    if words:
        row_offsets -= row_offsets % 8
    nodes = rng.integers(0, num_local, num_nodes).astype(np.int64)  # repeats allowed
    out = np.full(out_shift + num_nodes * row_bytes + spare, 7, dtype=np.uint8)[out_shift:]
    gather_rows(src, row_offsets, row_bytes, nodes, out)
    assert bytes(out[:num_nodes * row_bytes]) == reference_gather(src, row_offsets, row_bytes, nodes)
    assert (out[num_nodes * row_bytes:] == 7).all()


def test_gather_rows_reads_a_memmap_and_a_float_view(tmp_path):
    features = np.arange(60, dtype=np.float32).reshape(10, 6)
    features.tofile(tmp_path / "features.bin")
    src = np.memmap(tmp_path / "features.bin", dtype=np.uint8, mode="r")
    row_bytes = 6 * 4
    x = np.zeros((3, 6), dtype=np.float32)
    gather_rows(src, np.arange(10, dtype=np.int64) * row_bytes, row_bytes, np.array([9, 0, 4], dtype=np.int32),
                x.reshape(-1).view(np.uint8))
    assert np.array_equal(x, features[[9, 0, 4]])


@pytest.mark.parametrize("field, change", [
    ("out", {"out": np.full(11, 9, dtype=np.uint8)}),
    ("out", {"out": np.full(12, 9, dtype=np.int8)}),
    ("src", {"src": np.zeros(40, dtype=np.float32)}),
    ("nodes", {"nodes": np.array([0, 5])}),
    ("nodes", {"nodes": np.array([-1, 0])}),
    ("nodes", {"nodes": np.array([0.0, 1.0])}),
    ("row_offsets", {"row_offsets": np.array([0, 6, 35], dtype=np.int64)}),
    ("row_offsets", {"row_offsets": np.array([-1, 6, 12], dtype=np.int64)}),
    ("row_offsets", {"row_offsets": np.array([0, 6, 12], dtype=np.int32)}),
    ("row_bytes", {"row_bytes": -1}),
])
def test_gather_rows_rejects_bad_input_without_writing(field, change):
    args = {"src": np.arange(40, dtype=np.uint8), "row_offsets": np.array([0, 6, 12], dtype=np.int64),
            "row_bytes": 6, "nodes": np.array([2, 0]), "out": np.full(12, 9, dtype=np.uint8)}
    args.update(change)
    with pytest.raises(ValueError, match=field):
        gather_rows(**args)
    assert (args["out"] == 9).all()


def reference_offsets(global_ids, node_begin, feat_offset, row_bytes):
    offsets = []
    for g in global_ids:
        part = max(p for p in range(len(node_begin)) if node_begin[p] <= g)
        offsets.append(feat_offset[part] + (g - node_begin[part]) * row_bytes)
    return offsets


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 10), min_size=1, max_size=6), row_bytes=st.integers(0, 64),
       data=st.data())
def test_row_offsets_for_equals_reference(sizes, row_bytes, data):
    node_begin = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    padded = [-(-s * row_bytes // 4096) * 4096 for s in sizes]  # each partition on its own aligned start
    feat_offset = np.concatenate(([0], np.cumsum(padded)[:-1])).astype(np.int64)
    total = sum(sizes)
    global_ids = data.draw(st.lists(st.integers(0, max(total - 1, 0)), max_size=20)) if total else []
    got = row_offsets_for(np.array(global_ids, dtype=np.int64), node_begin, feat_offset, row_bytes)
    assert got.dtype == np.int64
    # an empty partition shares its begin with the next one, which holds the node: the last one wins
    assert got.tolist() == reference_offsets(global_ids, node_begin.tolist(), feat_offset.tolist(), row_bytes)


def test_row_offsets_for_rejects_bad_tables():
    with pytest.raises(ValueError, match="global_ids"):
        row_offsets_for(np.array([3]), np.array([5, 9]), np.array([0, 4096]), 8)
    with pytest.raises(ValueError, match="part_node_begin"):
        row_offsets_for(np.array([3]), np.array([0, 9]), np.array([0]), 8)
    with pytest.raises(ValueError, match="row_bytes"):
        row_offsets_for(np.array([3]), np.array([0]), np.array([0]), -8)
