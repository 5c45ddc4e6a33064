"""Mode hybrid's choice of resident partitions, against a plain loop, and its partitions' row positions."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.fullgraph.hybrid import ResidentPartitions, choose_resident
from loader.format.partition_table import PARTITION_COLUMNS, PartitionTable


def choose_reference(accesses, distinct, ram, passes, capacity, row_pages, sequential_rate, random_reads):
    worth = [d * row_pages / random_reads > p / sequential_rate for d, p in zip(distinct, passes)]
    # by accesses per byte, ties to the lower partition; the prefix that fits
    order = sorted(range(len(ram)), key=lambda p: (-accesses[p] / max(ram[p], 1), p))
    chosen, used = set(), 0
    for p in order:
        if not worth[p]:
            continue
        if used + ram[p] > capacity:
            break
        used += ram[p]
        chosen.add(p)
    return [p in chosen for p in range(len(ram))]


@st.composite
def partitions(draw):
    n = draw(st.integers(1, 12))
    sizes = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    accesses = [draw(st.integers(0, 300)) for _ in range(n)]
    distinct = [min(a, s) for a, s in zip(accesses, sizes)]
    return sizes, accesses, distinct


@settings(max_examples=300, deadline=None)
@given(partitions(), st.integers(0, 2000), st.sampled_from([8, 64, 100, 4096]), st.sampled_from([1e6, 7e8]),
       st.sampled_from([1e3, 3e4]))
def test_choose_resident_is_the_prefix_by_accesses_per_byte_that_fits_among_those_worth_a_pass(
        parts, capacity, row_bytes, sequential_rate, random_reads):
    sizes, accesses, distinct = parts
    ram = [s * row_bytes for s in sizes]
    passes = [-(-r // 4096) * 4096 for r in ram]
    row_pages = -(-row_bytes // 4096)
    got = choose_resident(np.array(accesses), np.array(distinct), np.array(ram), np.array(passes), capacity,
                          row_pages=row_pages, sequential_rate=sequential_rate, random_reads=random_reads)
    assert got.tolist() == choose_reference(accesses, distinct, ram, passes, capacity, row_pages, sequential_rate,
                                            random_reads)
    assert sum(r for r, c in zip(ram, got) if c) <= capacity


def test_resident_positions_follow_each_chosen_partition_from_its_base():
    node_begin = np.array([0, 4, 4, 9], dtype=np.int64)  # an empty partition among them
    node_end = np.array([4, 4, 9, 12], dtype=np.int64)
    table = np.zeros((4, len(PARTITION_COLUMNS)), dtype=np.int64)
    table[:, 0], table[:, 1] = node_begin, node_end
    parts = PartitionTable(table)
    resident = ResidentPartitions(np.empty((8, 2)), np.array([-1, -1, 0, 5], dtype=np.int64), parts)
    nodes = np.array([0, 3, 4, 8, 9, 11, 5], dtype=np.int64)
    np.testing.assert_array_equal(resident.positions(nodes), [-1, -1, 0, 4, 5, 7, 1])
