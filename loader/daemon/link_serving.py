"""Link prediction in the daemon (issue 31): a link dataset's splits, held in RAM, and how its batches are made.

A dataset imported with ``--task link`` is served as link prediction, never as node classification (its
node labels are not what it is trained for). Training batches are ``loader.sampling.link_sampling``'s:
epoch e's plan over the training positives (``link_batch_plan``), each batch's negatives, seeds and
neighbour sample exactly as the in-memory reference draws them, the neighbours sampled by the mode's own
sampler (its neighbour cache and checked reads: ``FullGraphMode.sample``, which gives ``sample_pass``'s
batch for the same seeds and key), so a full-graph mode's link batches are the reference's, bitwise.

Evaluation embeds the nodes a split's scores need (``HeldPairs.nodes``) in node batches of
``eval_batch_size`` with the keys of ``eval_split_batches`` on the split's link stream, as the in-memory
trainer does, and each batch carries its share of the split's positives and their fixed negative tails
(``HeldOutShares``), as positions into those nodes: the trainer scores them once the stream has ended.

The hierarchical mode serves MariusGNN's partition buffer orders (``[link] order``, COMET by default): its
mega-batch is the buffer, of as many partitions as the budget holds (``link_states``); each state of the
epoch's ``buffer_epoch`` is a mega-batch, loaded whole, whose edges (COMET: its share of every bucket it holds)
are trained with neighbours sampled in the subgraph the buffer induces and negatives drawn from its nodes
(``sample_link_state``), exactly as ``megabatch train --mode inmemory --link-order comet`` emulates it; a
buffer of every partition trains the shuffled order. The static cache is off for a link dataset (a static
node joining the buffer would change the subgraph the order's batches are defined on). A state's partitions
that the previous state held are copied from the other buffer and only the swapped-in ones are read
(``megabatch_partitions_loaded{source}``), so an
epoch reads what MariusGNN's I/O model says: one logical partition per swap.

A training job of several ranks (DDP) is served by the full-graph modes as the in-memory trainer deals it: epoch
e's plan over global batches of ``batch_size`` x W positives, each dealt to the ranks in W contiguous, even pieces
(``ranks.even_piece``: rank r's the r-th ``batch_size`` of a full one), sampled with ``link_rank_key``
(``sample_link_steps``), every batch published to its rank with the global batch's positives
(``BatchReady.global_seeds``) that scale its loss. The hierarchical mode deals its buffer states' batches the same
way: each state's edges are cut into global batches, so every rank trains the same states in lockstep.

What is not served yet: mode staged (its memory plan charges spilled superbatches, which link batches are
not) and the aggregation cache. Each is refused in one line
(``link_problem``, the handshake).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from loader.daemon.config import LoaderConfig
from loader.format.dataset import Dataset
from loader.format.link import HELD_OUT, read_edge_buckets, read_link_tables
from loader.format.partition_table import PartitionTable
from loader.sampling.buffer_order import Assignment, LinkOrder, buffer_epoch, buffer_plan, resolved_logical
from loader.sampling.comet import logical_capacity
from loader.sampling.link_sampling import (
    LinkEpochPlan,
    PassLinkLabels,
    SampledLinkBatch,
    held_out_pairs,
    link_batch_plan,
    link_pass,
    link_rank_key,
    sample_link_batch,
    sample_link_batch_by,
)
from loader.sampling.negative_weights import link_batch_weights
from loader.sampling.ranks import SINGLE_RANK, LocalRanks, even_piece
from loader.sampling.sampling import CSCGraph, SampledBatch, SampledPass
from proto.held_pairs import HeldPairs
from proto.messages import DatasetInfo

__all__ = ["LinkServing", "LinkStateWork", "load_link_serving", "link_problem", "LinkSteps", "sample_link_steps",
           "link_states", "buffer_order_warning", "check_buffer", "sample_link_state", "task_refusal", "LINK_MODES",
           "LINK_PASS_BATCHES"]

LINK_MODES = ("hierarchical", "exact", "static", "hybrid", "mmap", "inmemory")
"""``[loader] mode`` values that serve a link dataset: the full-graph modes whose batches are the shuffled reference's,
and the hierarchical mode in MariusGNN's buffer order."""

PassSampler = Callable[[np.ndarray, int, tuple[int, ...], np.ndarray], SampledPass]
"""A mode's ``sample(seeds, batch_size, fanouts, keys)``."""


@dataclass(frozen=True)
class LinkServing:
    """A link dataset's positives, read once at startup (int64 dataset ids), and ``[link]``'s settings."""

    train_edges: np.ndarray
    """(2, P) training positives, source row 0."""
    held_out: dict[str, HeldPairs]
    """"val", "test" -> the split's positives and fixed negative tails as positions into its nodes."""
    eval_negatives: int
    negatives: int
    disjoint: bool
    edge_buckets: np.ndarray
    """int64 (P*P + 1,): the edge buckets' offsets in ``train_edges`` (the buffer orders' unit)."""
    order: LinkOrder = "comet"
    """The hierarchical mode's buffer order (``[link] order``)."""
    logical_partitions: int | None = None
    negative_weights: bool = False
    """A buffer state's negatives weighted (``[link] negative_weights``; ``loader.sampling.negative_weights``)."""
    assignment: Assignment = "edge"
    """How a COMET epoch gives its states their edges (``[link] assignment``; ``buffer_order.ASSIGNMENTS``)."""

    @property
    def train_positives(self) -> int:
        return int(self.train_edges.shape[1])

    @property
    def nbytes(self) -> int:
        held = sum(h.nodes.nbytes + h.src.nbytes + h.dst.nbytes + h.tails.nbytes for h in self.held_out.values())
        return int(self.train_edges.nbytes) + held + int(self.edge_buckets.nbytes)


@dataclass(frozen=True)
class LinkStateWork:
    """Hierarchical scheduler -> sampler: the training edges one mega-batch (a buffer state) trains.

    order: int64 positions into ``train_edges``, in batch order; batch_ptr: int64 [B + 1], batch k is
    ``order[batch_ptr[k]:batch_ptr[k + 1]]``; keys: uint64 [B], each batch's key; first_batch: the state's first
    batch in the epoch; pool: negatives from the resident nodes (a buffer state), else uniform over every node (a
    mega-batch of the whole graph: the shuffled order, exactly the full-graph modes' batches).
    """

    order: np.ndarray
    batch_ptr: np.ndarray
    keys: np.ndarray
    first_batch: int
    pool: bool

    @property
    def num_batches(self) -> int:
        return len(self.batch_ptr) - 1

    def chunk(self, begin: int, end: int) -> "LinkStateWork":
        """Batches ``begin:end`` of the state's (a pass of them)."""
        ptr = self.batch_ptr[begin:end + 1]
        return LinkStateWork(self.order[ptr[0]:ptr[-1]], ptr - ptr[0], self.keys[begin:end], self.first_batch + begin,
                             self.pool)


LINK_PASS_BATCHES = 32
"""The hierarchical mode samples a buffer state's batches in passes of at most this many (a state of a large graph
trains thousands of batches; its memory plan charges passes of this size)."""


def link_states(link: LinkServing, partitions: PartitionTable, capacity: int, batch_size: int, seed: int,
                epoch: int, world_size: int = 1) -> tuple[list[tuple[np.ndarray, LinkStateWork]], int]:
    """Epoch ``epoch`` of the hierarchical mode for a link dataset: (the resident partitions and the work of each
    state that trains something, in order; the epoch's steps). With ``capacity`` below the P partitions, the
    states of ``buffer_epoch`` (MariusGNN's order, as ``megabatch train --mode inmemory --link-order`` trains it);
    with every partition resident, one state, the shuffled order over the whole graph. Batches are global
    batches of ``batch_size`` x ``world_size`` positives (``sample_link_state`` deals them to the ranks)."""
    p = len(partitions)
    global_size = batch_size * world_size
    if capacity >= p:
        plan = link_batch_plan(link.train_positives, global_size, seed, epoch)
        work = LinkStateWork(plan.order, plan.batch_ptr, plan.keys, 0, pool=False)
        return [(np.arange(p, dtype=np.int64), work)], plan.num_batches
    logical = None if link.order == "beta" else resolved_logical(link.order, p, capacity, link.logical_partitions)
    epoch_order = buffer_epoch(buffer_plan(link.order, p, capacity, logical, seed, epoch), link.edge_buckets,
                               partitions, global_size, assignment=link.assignment)
    states = []
    for state in epoch_order.states:
        if not state.num_batches:  # a state that trains nothing is not loaded
            continue
        first = int(epoch_order.state_batches[state.index])
        keys = epoch_order.batches.keys[first:first + state.num_batches]
        states.append((state.partitions, LinkStateWork(state.order, state.batch_ptr, keys, first, pool=True)))
    return states, epoch_order.num_batches


def buffer_order_warning(link: LinkServing, num_partitions: int, capacity: int) -> str | None:
    """The startup warning of a buffer order (one line), None where the buffer holds every partition (the shuffled
    order): it can cost far more accuracy than the exact modes' shuffled order, and only a comparison shows it."""
    if capacity >= num_partitions:
        return None
    return (f"link order {link.order} with a buffer of {capacity} of {num_partitions} partitions: at the trainer's "
            f"default learning rates, with a buffer of a quarter of the graph, COMET (its buckets split) was within "
            f"an MRR point of the shuffled order on Cora, citeseer, amazon-photo and coauthor-cs (3 seeds each), "
            f"and BETA up to 11 points below it (docs/PERFORMANCE.md, \"Link prediction\"); compare with mode exact, "
            f"which serves the shuffled order, on this graph")


def check_buffer(link: LinkServing, num_partitions: int, capacity: int) -> str | None:
    """Why a buffer of ``capacity`` partitions cannot follow ``link``'s order (one line), or None."""
    if capacity >= num_partitions:
        return None
    if capacity < 2:
        return (f"a link buffer needs 2 partitions and the mega-batch holds {capacity} of {num_partitions}: raise "
                f"[memory] budget or [hierarchy] megabatch_fraction")
    try:
        logical = resolved_logical(link.order, num_partitions, capacity, link.logical_partitions)
        if link.order == "comet":
            logical_capacity(num_partitions, capacity, logical)
    except ValueError as err:
        return f"[link] logical_partitions: {err} (a buffer of {capacity} of {num_partitions} partitions)"
    return None


def sample_link_state(graph: CSCGraph, link: LinkServing, work: LinkStateWork, fanouts: tuple[int, ...],
                      local: LocalRanks = SINGLE_RANK, seed: int = 0, epoch: int = 0,
                      partitions: PartitionTable | None = None) -> "LinkSteps":
    """A mega-batch's link batches over its subgraph ``graph`` (local ids; ``global_ids`` ascending: ascending
    partitions, no static node joined), as ``trainer/link/inmemory.py`` samples a buffer state's, bitwise: each
    global batch of ``work`` dealt to ``local``'s ranks as the full-graph modes deal the shuffled order (in even,
    contiguous pieces, ``even_piece``, keyed by ``link_rank_key``), step-major. A
    buffer state's pairs carry their weights (``link.negative_weights``) over the dataset's ``partitions``."""
    weighted = work.pool and link.negative_weights
    if weighted and partitions is None:
        raise ValueError("partitions: needed to weigh a buffer state's negatives")
    weights: list[np.ndarray] | None = [] if weighted else None
    pool = np.arange(graph.num_nodes, dtype=np.int64) if work.pool else None
    src = np.searchsorted(graph.global_ids, link.train_edges[0, work.order])
    dst = np.searchsorted(graph.global_ids, link.train_edges[1, work.order])
    batches: list[SampledLinkBatch] = []
    member: list[int] = []
    global_size: list[int] = []
    for k in range(work.num_batches):
        begin, end = int(work.batch_ptr[k]), int(work.batch_ptr[k + 1])
        step = work.first_batch + k
        for index, rank in enumerate(local.ranks):
            lo, hi = (begin + offset for offset in even_piece(end - begin, local.world_size, rank))
            batch = sample_link_batch(graph, src[lo:hi], dst[lo:hi], graph.num_nodes, fanouts,
                                      link_rank_key(seed, epoch, rank, step, int(work.keys[k])),
                                      negatives_per_positive=link.negatives, negative_pool=pool,
                                      disjoint=link.disjoint)
            batches.append(batch)
            if weights is not None:
                assert partitions is not None
                weights.append(link_batch_weights(batch, partitions, graph.num_nodes))
            member.append(index)
            global_size.append(end - begin)
    sampled, labels = link_pass(batches, len(fanouts), weights)
    if not local.several:
        return LinkSteps(sampled, labels, None, None)
    return LinkSteps(sampled, labels, np.array(member, dtype=np.int64), np.array(global_size, dtype=np.int64))


def link_problem(dataset: Dataset, config: LoaderConfig) -> str | None:
    """Why ``config`` cannot serve ``dataset``'s link task (one line), or None (also for a node dataset)."""
    if dataset.manifest.link is None:
        return None
    mode = config.loader.mode
    if mode not in LINK_MODES:
        return (f"[loader] mode {mode}: {dataset.path.name} is a link-prediction dataset, which modes "
                f"{', '.join(LINK_MODES)} serve so far")
    if config.sampler.aggregation_cache:
        return "[sampler] aggregation_cache: not with a link-prediction dataset (the link models read no x_agg)"
    return None


def task_refusal(served: DatasetInfo, task: str) -> str | None:
    """Why a client that trains ``task`` cannot use a daemon serving ``served`` (one line, for its
    ``Error("bad_request")``), or None."""
    what = {"node": "node classification", "link": "link prediction"}
    if task != served.task:
        return (f"this daemon serves {what[served.task]} ({served.name}); the client trains {what.get(task, task)} "
                f"(megabatch train --task {served.task})")
    return None


def load_link_serving(dataset: Dataset, config: LoaderConfig) -> LinkServing | None:
    """A link dataset's splits (None for a node dataset); UserError for a file that does not fit the manifest."""
    link = dataset.manifest.link
    if link is None:
        return None
    tables = read_link_tables(dataset, link, dataset.manifest.num_nodes)
    held = {split: held_out_pairs(tables.held_edges[split], tables.held_tails[split]) for split in HELD_OUT}
    buckets = read_edge_buckets(dataset, link, dataset.manifest.num_partitions)
    return LinkServing(tables.train_edges, held, link.eval_negatives, config.link.negatives, config.link.disjoint,
                       buckets, cast(LinkOrder, config.link.order), config.link.logical_partitions,
                       config.link.negative_weights, cast(Assignment, config.link.assignment))


@dataclass(frozen=True)
class LinkSteps:
    """Global batches ``first:last`` of an epoch's plan, sampled for ``local``'s ranks: its batches step-major (each
    global batch's pieces in ``local.ranks`` order), and per batch the rank (position in ``local.ranks``) and the
    global batch's positives (both None for a lone trainer)."""

    sampled: SampledPass
    labels: PassLinkLabels
    member: np.ndarray | None
    global_size: np.ndarray | None


def sample_link_steps(sample: PassSampler, link: LinkServing, plan: LinkEpochPlan, first: int, last: int,
                      num_nodes: int, fanouts: tuple[int, ...], local: LocalRanks = SINGLE_RANK,
                      seed: int = 0, epoch: int = 0) -> LinkSteps:
    """Global batches ``first:last`` of ``plan`` (over batches of ``batch_size`` x W positives, W the job's world
    size, ``batch_size`` per rank: the plan's cut) sampled through ``sample`` (a full-graph mode's: dataset ids are
    local ids) as one pass: rank r's piece of a global batch is its r-th of W even, contiguous pieces
    (``even_piece``: positives ``[r * batch_size, (r + 1) * batch_size)`` of a full one), sampled with
    ``link_rank_key(seed, epoch, r, b, key)`` (the batch's own key for rank 0, so a lone trainer's batches are the
    plan's), as ``LinkInMemorySource(rank=r, world_size=W)`` draws it. A rank whose piece is empty gets an empty
    batch (DDP's all-reduce needs its step too). Batch by batch, since each has its own seeds (a loop over
    batches, not nodes)."""
    hops = len(fanouts)

    def seeds_sampled(seeds: np.ndarray, key: int) -> SampledBatch:
        return sample(seeds, len(seeds), fanouts, np.array([key], dtype=np.uint64)).batch(0)

    batches: list[SampledLinkBatch] = []
    member: list[int] = []
    global_size: list[int] = []
    for b in range(first, last):
        positions, key = plan.batch(b)
        for index, rank in enumerate(local.ranks):
            lo, hi = even_piece(len(positions), local.world_size, rank)
            piece = positions[lo:hi]
            batches.append(sample_link_batch_by(seeds_sampled, num_nodes, None, link.train_edges[0, piece],
                                                link.train_edges[1, piece], num_nodes, hops,
                                                link_rank_key(seed, epoch, rank, b, key),
                                                negatives_per_positive=link.negatives, disjoint=link.disjoint))
            member.append(index)
            global_size.append(len(positions))
    sampled, labels = link_pass(batches, hops)
    if not local.several:
        return LinkSteps(sampled, labels, None, None)
    return LinkSteps(sampled, labels, np.array(member, dtype=np.int64), np.array(global_size, dtype=np.int64))
