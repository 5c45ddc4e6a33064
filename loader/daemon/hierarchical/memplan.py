"""Split one ``memory_budget`` between the static cache, two mega-batch buffers and the slots.

HierBatching (Appendix B) keeps two copies of (static + dynamic) data so loading mega-batch
i+1 overlaps training on i: 2 (r_s + r_d)(A + B) <= C. We hold the static *features* once (both
buffers gather from the same static region) and only the per-mega-batch parts twice, so the
bound we enforce is

    node arrays + static cache + 2 x buffer(N_d) + 3 sampled passes + evaluation reader
        + clients x slots x slot_bytes <= budget

where buffer(N_d) is an upper bound over *any* N_d partitions (the N_d largest of each kind),
so no shuffle can overflow it. The static cache is its rows and its in-lists (ids, partitions, indptr,
indices), held once: the assembler reads the static nodes' lists where they lie, so a buffer's raw
lists hold only its partitions' lists as read. The evaluation reader (``loader.daemon.disk_graph.eval_graph_bytes``) is
what validation and test batches are read through, beside training: indptr and the sampler's maps (16 B
per node), the read checks' block tables (8 B per check block of features.bin and per page of
indices.npy: 0.2% to 1.6% of the feature file) and its read buffers. ``megabatch_fraction = "auto"``
picks the largest N_d that fits, up to every partition: at the same bytes read per epoch, a larger
mega-batch keeps more neighbours and mixes more labels (docs/PERFORMANCE.md, "Training quality of the
hierarchical mode").

``static_cache = "auto"`` (``plan_with_static``) also chooses how many of the prepared static nodes to
hold: static rows are held once but cost budget that could hold a larger N_d, and both keep cut
neighbours. Each candidate prefix of the static nodes (by degree) gets its largest N_d, and the pair
with the highest expected edge coverage wins, the smaller static cache on a tie (with N_d = every
partition a static cache adds nothing).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loader.daemon.budget_plan import BudgetPlan, FixedPart, Part, budget_too_small, fixed_part
from loader.daemon.hierarchical.coverage import expected_edge_coverage, static_cut_share
from loader.daemon.slot_sizing import SessionSizing
from loader.format.partition_table import PartitionTable
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["PAGE", "PER_STATIC_NODE_BYTES", "HEAD_SOURCE_BYTES", "STATIC_SHARES", "BufferSizes",
           "HierarchicalBudget", "plan_memory", "plan_with_static", "buffer_sizes", "static_cache_bytes", "round_up"]

PAGE = 4096

MODE = "hierarchical"
"""The mode this plan is for, as its refusals name it."""

PASSES_IN_FLIGHT = 3
"""Sampled passes alive at once: one being sampled, one queued, one being published."""

PER_LOCAL_NODE_BYTES = 8 * 6
"""Per mega-batch node: global id, row offset, raw indptr, induced indptr, full degree, label/seed scratch."""

PER_STATIC_NODE_BYTES = 8 * 4
"""Per static node, besides its row and in-list entries: dataset id, partition, indptr and heads entries
(``StaticCache``)."""

HEAD_SOURCE_BYTES = 4
"""Per static in-list entry whose source is a static node, besides the entry: the source's position among the
static nodes (``StaticCache.head_sources``, int32)."""


STATIC_SHARES = (0.0, 0.125, 0.25, 0.5, 1.0)
"""Shares of the prepared static nodes ``static_cache = "auto"`` weighs (more would only refine a rough estimate)."""


def round_up(value: int, multiple: int = PAGE) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class BufferSizes:
    """Capacity of one mega-batch buffer (an upper bound over every choice of N_d partitions)."""

    partitions: int
    """N_d: partitions per mega-batch."""
    max_nodes: int
    """Mega-batch nodes plus every static node (static nodes outside the mega-batch join it)."""
    max_raw_edges: int
    """In-edges of the N_d partitions as read, before filtering to the induced subgraph (the static nodes'
    in-lists are not copied into a buffer: the assembler reads them in the static cache)."""
    feature_bytes: int
    """Page-padded feature bytes of the N_d largest partitions."""
    index_bytes: int
    """Raw edge lists + induced edge lists (bounded by every raw in-edge of the mega-batch and static nodes) +
    per-node arrays."""
    pass_bytes: int = 0
    """One sampled pass over such a mega-batch (all its batches' nodes and edges, from a pilot sample)."""
    aggregate_bytes: int = 0
    """With ``[sampler] aggregation_cache``: the same partitions' rows of the aggregation cache (its file has
    features.bin's layout), held beside their features; 0 without."""

    @property
    def total(self) -> int:
        return self.feature_bytes + self.aggregate_bytes + self.index_bytes


@dataclass(frozen=True)
class HierarchicalBudget(BudgetPlan):
    """The resolved split of the budget; ``describe()`` is what ``serve`` logs at startup."""

    budget: int
    fixed: FixedPart
    """Node arrays and slots (``budget_plan.fixed_part``, as in every mode)."""
    static_nodes: int
    static_bytes: int
    buffer: BufferSizes
    eval_bytes: int = 0
    """The evaluation reader: indptr, the sampler's maps, the read checks' block tables, its read buffers."""

    def parts(self) -> list[Part]:
        """Every part of the plan, named as the plan line and a refusal name it."""
        node_arrays, slots, *others = self.fixed.parts()
        with_aggregates = " with their aggregates" if self.buffer.aggregate_bytes else ""
        return [node_arrays, (f"static cache {self.static_nodes:,} nodes (rows and in-lists)", self.static_bytes),
                (f"2 x mega-batch buffer ({self.buffer.partitions} partitions{with_aggregates}, "
                 f"{format_size(self.buffer.total)} each)", 2 * self.buffer.total),
                (f"{PASSES_IN_FLIGHT} sampled passes x {format_size(self.buffer.pass_bytes)}",
                 PASSES_IN_FLIGHT * self.buffer.pass_bytes),
                ("evaluation reads (indptr, read checks, buffers)", self.eval_bytes), slots, *others]

    @property
    def total(self) -> int:
        return sum(size for _, size in self.parts())

    def describe(self) -> str:
        listed = " + ".join(f"{what} {format_size(size)}" for what, size in self.parts())
        return f"memory plan: budget {format_size(self.budget)} = {listed} = {format_size(self.total)} used"


def static_cache_bytes(static_nodes: int, row_bytes: int, static_edges: int, index_itemsize: int,
                       static_sources: int = 0) -> int:
    """The static cache held for the daemon's life: its rows (in the feature arena) and its in-lists, of whose
    entries ``static_sources`` come from static nodes (``assembly_kernels.static_sources_by_prefix``)."""
    lists = (static_nodes * PER_STATIC_NODE_BYTES + 16 + static_edges * index_itemsize
             + static_sources * HEAD_SOURCE_BYTES if static_nodes else 0)
    return round_up(static_nodes * row_bytes) + round_up(lists)


def buffer_sizes(partitions: PartitionTable, n_d: int, static_nodes: int, static_edges: int,
                 index_itemsize: int, train_counts: np.ndarray | None = None, batch_size: int = 1,
                 batch_bytes: int = 0, aggregated: bool = False, pass_batches: int | None = None) -> BufferSizes:
    """Upper bound of one buffer for ``n_d`` partitions.

    train_counts (training nodes per partition), batch_size and batch_bytes (a sampled batch's
    nodes and edges) bound a sampled pass: the batches of the N_d partitions richest in seeds; with
    ``pass_batches``, a pass of at most that many batches (a link dataset's, whose states are cut into such).
    aggregated: the buffer holds the partitions' aggregation cache rows too.
    """
    nodes, edges, feat = partitions.num_nodes, partitions.num_edges, partitions.feat_padded
    top_nodes = int(np.sort(nodes)[::-1][:n_d].sum())
    top_edges = int(np.sort(edges)[::-1][:n_d].sum())
    top_feat = int(np.sort(feat)[::-1][:n_d].sum())
    max_nodes = top_nodes + static_nodes
    # raw lists arrive in the file's index width; the induced lists are int32 local ids, at most every raw entry
    index_bytes = (top_edges * index_itemsize + (top_edges + static_edges) * 4
                   + (max_nodes + 1) * PER_LOCAL_NODE_BYTES + 2 * PAGE)
    pass_bytes = 0
    if pass_batches is not None:
        pass_bytes = pass_batches * (batch_bytes + 8 * batch_size)
    elif train_counts is not None and batch_bytes:
        seeds = int(np.sort(train_counts)[::-1][:n_d].sum())
        pass_bytes = -(-seeds // max(1, batch_size)) * batch_bytes + 8 * seeds
    return BufferSizes(n_d, max_nodes, top_edges, top_feat + PAGE, round_up(index_bytes), pass_bytes,
                       top_feat + PAGE if aggregated else 0)


def plan_memory(*, budget: int, num_nodes: int, partitions: PartitionTable, fraction: float | None,
                static_nodes: int, static_row_bytes: int, static_edges: int, index_itemsize: int,
                sessions: SessionSizing, static_sources: int = 0, train_counts: np.ndarray | None = None,
                batch_size: int = 1, batch_bytes: int = 0, eval_bytes: int = 0, aggregated: bool = False,
                fixed: FixedPart | None = None, pass_batches: int | None = None) -> HierarchicalBudget:
    """Resolve N_d (``fraction=None`` = largest that fits) and check the whole plan fits ``budget``
    (``eval_bytes``: the evaluation reader, held whatever N_d is; ``aggregated``: buffers hold the partitions'
    aggregation cache rows too; ``fixed``: the mode's fixed part, default node arrays and ``sessions``)."""
    num_partitions = len(partitions)
    fixed = fixed if fixed is not None else fixed_part(num_nodes, sessions)
    static_bytes = static_cache_bytes(static_nodes, static_row_bytes, static_edges, index_itemsize, static_sources)

    def make(n_d: int) -> HierarchicalBudget:
        return HierarchicalBudget(budget, fixed, static_nodes, static_bytes,
                                  buffer_sizes(partitions, n_d, static_nodes, static_edges, index_itemsize,
                                               train_counts, batch_size, batch_bytes, aggregated, pass_batches),
                                  eval_bytes)

    others = "[publisher] slots or [server] max_clients, or set [hierarchy] static_cache = false"
    if fraction is not None:
        n_d = min(num_partitions, max(1, round(fraction * num_partitions)))
        plan = make(n_d)
        if plan.total > budget:
            raise budget_too_small(budget, MODE, plan.parts(), f"lower [hierarchy] megabatch_fraction, {others}")
        return plan
    lo, hi = 1, num_partitions
    if make(lo).total > budget:
        raise budget_too_small(budget, MODE, make(lo).parts(),
                               f"lower {others} (not even one partition per mega-batch fits)")
    while lo < hi:  # the total grows with n_d, so the largest fitting n_d is a binary search away
        mid = (lo + hi + 1) // 2
        if make(mid).total <= budget:
            lo = mid
        else:
            hi = mid - 1
    return make(lo)


def plan_with_static(plan: Callable[[int, int, int], HierarchicalBudget], *, static_degrees: np.ndarray,
                     static_cut_edges: np.ndarray, static_sources: np.ndarray, cut_edges: int, edge_cut: float,
                     num_partitions: int) -> HierarchicalBudget:
    """``static_cache = "auto"``: the static prefix and N_d with the highest expected edge coverage.

    plan(static_nodes, static_edges, static_sources): ``plan_memory`` with every other argument bound
    (``fraction`` None or fixed). static_degrees and static_cut_edges: in-degree and cut in-edges of each
    prepared static node, in the order prefixes are kept (highest degree first); static_sources: per prefix
    length k (K+1 entries), the in-list entries of the first k from among them
    (``assembly_kernels.static_sources_by_prefix``); cut_edges: all cut edges of the graph.
    Raises ``plan``'s error when not even the plan without a static cache fits.
    """
    best: tuple[float, HierarchicalBudget] | None = None
    for share in STATIC_SHARES:  # smallest first: a tie keeps the smaller cache
        k = round(share * len(static_degrees))
        try:
            candidate = plan(k, int(static_degrees[:k].sum()), int(static_sources[k]))
        except UserError:
            if best is None:
                raise
            break  # a larger cache leaves even less room
        coverage = expected_edge_coverage(edge_cut, num_partitions, candidate.buffer.partitions,
                                          static_cut_share(int(static_cut_edges[:k].sum()), cut_edges))
        if best is None or coverage > best[0] + 1e-9:
            best = coverage, candidate
    assert best is not None
    return best[1]
