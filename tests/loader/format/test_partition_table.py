"""PartitionTable: named columns of partitions.npy, against plain Python over the rows."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.partition_table import PARTITION_COLUMNS, PartitionTable


@st.composite
def tables(draw):
    sizes = draw(st.lists(st.integers(0, 20), min_size=1, max_size=8))
    edges = draw(st.lists(st.integers(0, 50), min_size=len(sizes), max_size=len(sizes)))
    row_bytes = draw(st.integers(1, 3000))
    rows, node, edge, offset = [], 0, 0, 0
    for n, e in zip(sizes, edges):
        rows.append([node, node + n, edge, edge + e, offset, n * row_bytes])
        node, edge, offset = node + n, edge + e, offset + -(-n * row_bytes // 4096) * 4096
    return PartitionTable(np.array(rows, dtype=np.int64)), rows


@settings(max_examples=100, deadline=None)
@given(table_and_rows=tables(), data=st.data())
def test_columns_sizes_lookup_and_rows_agree_with_the_plain_rows(table_and_rows, data):
    table, rows = table_and_rows
    for k, name in enumerate(PARTITION_COLUMNS):
        assert getattr(table, name).tolist() == [r[k] for r in rows]
    assert table.num_nodes.tolist() == [r[1] - r[0] for r in rows]
    assert table.num_edges.tolist() == [r[3] - r[2] for r in rows]
    assert table.feat_padded.tolist() == [-(-r[5] // 4096) * 4096 for r in rows]
    total = rows[-1][1]
    nodes = data.draw(st.lists(st.integers(0, max(0, total - 1)), max_size=20)) if total else []
    # a node's partition is the one whose range holds it (empty partitions hold none)
    assert table.partition_of(np.array(nodes, np.int64)).tolist() == \
        [next(p for p, r in enumerate(rows) if r[0] <= v < r[1]) for v in nodes]
    sorted_nodes = np.unique(np.array(nodes, np.int64))
    assert table.count_in(sorted_nodes).tolist() == [sum(r[0] <= v < r[1] for v in sorted_nodes.tolist()) for r in rows]
    picked = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=5))
    assert table.take(picked).array.tolist() == [rows[p] for p in picked]
    assert [[getattr(row, name) for name in PARTITION_COLUMNS] for row in table.rows()] == rows
    assert len(table) == len(rows)


def test_a_table_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"\(P, 6\)"):
        PartitionTable(np.zeros((3, 5), np.int64))
