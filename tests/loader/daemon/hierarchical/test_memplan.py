"""The memory plan: buffers bound any choice of N_d partitions; budgets that cannot fit are refused."""

import contextlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.hierarchical.coverage import expected_edge_coverage
from loader.daemon.hierarchical.memplan import (
    HEAD_SOURCE_BYTES,
    PAGE,
    PER_STATIC_NODE_BYTES,
    STATIC_SHARES,
    buffer_sizes,
    plan_memory,
    plan_with_static,
)
from loader.daemon.slot_sizing import SessionSizing
from loader.format.partition_table import PartitionTable
from proto.errors import UserError


def table(nodes, edges, row_bytes=64):
    nodes = np.asarray(nodes)
    edges = np.asarray(edges)
    node_end = np.cumsum(nodes)
    edge_end = np.cumsum(edges)
    feat_nbytes = nodes * row_bytes
    feat_offset = np.concatenate([[0], np.cumsum(-(-feat_nbytes // PAGE) * PAGE)[:-1]])
    columns = [node_end - nodes, node_end, edge_end - edges, edge_end, feat_offset, feat_nbytes]
    return PartitionTable(np.stack(columns, 1))


def test_buffer_bounds_every_choice():
    parts = table([10, 500, 30, 200, 7], [100, 10, 3000, 40, 70])
    sizes = buffer_sizes(parts, 2, static_nodes=5, static_edges=50, index_itemsize=4)
    for combo in itertools.combinations(range(5), 2):
        rows = parts.take(list(combo))
        assert rows.num_nodes.sum() + 5 <= sizes.max_nodes
        assert rows.num_edges.sum() <= sizes.max_raw_edges  # the static lists are read where they are held
        assert (-(-rows.feat_nbytes // PAGE) * PAGE).sum() <= sizes.feature_bytes


def kwargs(**over):
    args = dict(budget=64 << 20, num_nodes=747, partitions=table([10, 500, 30, 200, 7], [100, 10, 3000, 40, 70]),
                fraction=0.4, static_nodes=5, static_row_bytes=64, static_edges=50, index_itemsize=4,
                sessions=SessionSizing(clients=2, slots=2, slot_bytes=1 << 20))
    args.update(over)
    return args


def test_fits_and_describes():
    plan = plan_memory(**kwargs())
    assert plan.buffer.partitions == 2 and plan.total <= plan.budget
    assert "2 x mega-batch buffer" in plan.describe()


def test_the_static_cache_is_charged_once_with_its_in_lists():
    # 5 static nodes of 64 B rows with 5,000 in-list entries of 4 B, 1,000 of them from static nodes (each with
    # its position among them, 4 B): a page of rows and 6 of lists in the static part; a buffer's raw lists hold
    # its partitions' lists only (the assembler reads the static lists where they are held), its induced lists
    # room for every raw entry of its nodes and the static ones
    with_static = plan_memory(**kwargs(static_edges=5000, static_sources=1000))
    without = plan_memory(**kwargs(static_nodes=0, static_edges=0))
    assert with_static.static_bytes == PAGE + 6 * PAGE and without.static_bytes == 0
    assert 5 * PAGE < 5 * PER_STATIC_NODE_BYTES + 16 + 5000 * 4 + 1000 * HEAD_SOURCE_BYTES <= 6 * PAGE
    assert with_static.buffer.max_raw_edges == without.buffer.max_raw_edges == 3000 + 100  # the 2 largest lists
    assert "static cache 5 nodes (rows and in-lists) 28 KiB" in with_static.describe()
    extra = with_static.buffer.index_bytes - without.buffer.index_bytes
    assert 5000 * 4 <= extra <= 5000 * 4 + 5 * 48 + PAGE


def test_refuses_a_budget_that_cannot_fit():
    with pytest.raises(UserError, match="memory budget 4 MiB is too small for mode hierarchical: node arrays .* "
                                        "lower \\[hierarchy\\] megabatch_fraction") as err:
        plan_memory(**kwargs(budget=4 << 20))
    assert "\n" not in str(err.value)


def test_auto_fraction_picks_the_largest_fitting():
    plan = plan_memory(**kwargs(fraction=None, budget=(4 << 20) + 260_000))
    assert 1 <= plan.buffer.partitions <= 2 and plan.total <= plan.budget
    assert plan_memory(**kwargs(fraction=None, budget=plan.total)).buffer.partitions == plan.buffer.partitions
    bigger = plan_memory(**kwargs(fraction=None, budget=1 << 30))
    assert bigger.buffer.partitions == 5  # every partition: the whole graph fits twice
    with pytest.raises(UserError, match="too small for mode hierarchical: .*not even one partition per mega-batch"):
        plan_memory(**kwargs(fraction=None, budget=1 << 20))


def test_sampled_passes_in_flight_are_charged():
    train = np.array([5, 400, 20, 150, 0])  # training nodes per partition
    plain = plan_memory(**kwargs())
    charged = plan_memory(**kwargs(train_counts=train, batch_size=100, batch_bytes=1000))
    # the 2 partitions richest in seeds: 550 seeds = 6 batches of 100
    assert charged.buffer.pass_bytes == 6 * 1000 + 8 * 550
    assert charged.total == plain.total + 3 * charged.buffer.pass_bytes
    assert "3 sampled passes" in charged.describe()


def test_the_evaluation_reader_is_charged_whatever_n_d():
    plain = plan_memory(**kwargs())
    charged = plan_memory(**kwargs(eval_bytes=3 << 20))
    assert charged.total == plain.total + (3 << 20) and charged.buffer == plain.buffer
    assert "evaluation reads (indptr, read checks, buffers) 3 MiB" in charged.describe()
    with pytest.raises(UserError, match="evaluation reads"):  # what held the plan before no longer does
        plan_memory(**kwargs(budget=plain.total, eval_bytes=1))
    assert plan_memory(**kwargs(fraction=None, budget=plain.total)).buffer.partitions == 2
    assert plan_memory(**kwargs(fraction=None, budget=plain.total, eval_bytes=1)).buffer.partitions == 1


def static_plans(**over):
    """plan_memory with its static arguments left to plan_with_static (the harness's small table)."""
    return lambda k, e, h: plan_memory(**kwargs(static_nodes=k, static_edges=e, static_sources=h, **over))


def choose(make, degrees, cut=0.4, cut_edges=1000):
    return plan_with_static(make, static_degrees=degrees, static_cut_edges=degrees // 2,
                            static_sources=np.concatenate([[0], np.cumsum(degrees // 4)]), cut_edges=cut_edges,
                            edge_cut=cut, num_partitions=5)


def coverage_of(plan, degrees, cut=0.4, cut_edges=1000):
    share = min(1.0, int((degrees // 2)[:plan.static_nodes].sum()) / cut_edges)
    return expected_edge_coverage(cut, 5, plan.buffer.partitions, share)


def test_auto_static_keeps_none_when_every_partition_fits():
    degrees = np.array([400, 300, 200, 100, 50])
    plan = choose(static_plans(fraction=None, budget=1 << 30), degrees)
    assert plan.buffer.partitions == 5 and plan.static_nodes == 0  # the mega-batch is the whole graph


def test_auto_static_keeps_every_static_node_under_a_fixed_fraction():
    degrees = np.array([400, 300, 200, 100, 50])
    plan = choose(static_plans(), degrees)
    assert plan.buffer.partitions == 2 and plan.static_nodes == 5


def test_auto_static_refuses_like_plan_memory():
    with pytest.raises(UserError, match="too small"):
        choose(static_plans(budget=4 << 20), np.array([400, 300]))


@settings(max_examples=60, deadline=None)
@given(budget=st.integers(4 << 20, 12 << 20), row_bytes=st.sampled_from([64, 4096, 1 << 18]),
       degrees=st.lists(st.integers(0, 600), min_size=0, max_size=16), cut=st.floats(0.0, 1.0))
def test_auto_static_picks_the_best_fitting_candidate(budget, row_bytes, degrees, cut):
    """Against a plain search: every candidate prefix that fits, its largest N_d, the highest expected
    coverage, the smallest cache on a tie."""
    degrees = np.sort(np.asarray(degrees, dtype=np.int64))[::-1]
    make = static_plans(fraction=None, budget=budget, static_row_bytes=row_bytes)
    candidates = []
    for share in STATIC_SHARES:
        k = round(share * len(degrees))
        with contextlib.suppress(UserError):
            candidates.append(make(k, int(degrees[:k].sum()), int((degrees[:k] // 4).sum())))
    if not candidates:
        with pytest.raises(UserError):
            choose(make, degrees, cut)
        return
    plan = choose(make, degrees, cut)
    best = max(coverage_of(c, degrees, cut) for c in candidates)
    assert coverage_of(plan, degrees, cut) == pytest.approx(best, abs=1e-9)
    tied = [c.static_nodes for c in candidates if coverage_of(c, degrees, cut) >= best - 1e-9]
    assert plan.static_nodes == min(tied) and plan.total <= budget


def test_an_aggregated_buffer_holds_its_partitions_aggregates_and_auto_takes_fewer_partitions():
    parts = table([10, 500, 30, 200, 7], [100, 10, 3000, 40, 70])
    plain = buffer_sizes(parts, 2, static_nodes=5, static_edges=50, index_itemsize=4)
    both = buffer_sizes(parts, 2, static_nodes=5, static_edges=50, index_itemsize=4, aggregated=True)
    assert plain.aggregate_bytes == 0 and both.aggregate_bytes == both.feature_bytes
    assert both.total == plain.total + both.feature_bytes
    budget = 4_560_000  # the plain plan takes every partition, the aggregated one fewer
    fewer = plan_memory(**kwargs(fraction=None, budget=budget, aggregated=True))
    assert fewer.buffer.partitions < plan_memory(**kwargs(fraction=None, budget=budget)).buffer.partitions
    assert "with their aggregates" in fewer.describe() and fewer.total <= budget
