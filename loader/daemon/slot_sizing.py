"""``slot_bytes = "auto"``: size the shared-memory slots from a pilot sample.

Slots are fixed when a client connects, before any mega-batch is loaded. The hard bound
B (1 + f1 + f1 f2 + ...) capped at N is tight for small batches and hopeless for large ones
(a 1024-seed, [10, 5] batch is bounded by 62k nodes but holds a few thousand), so we sample a
few real batches over the full graph (a superset of any mega-batch's neighbourhoods, so
training batches only get smaller) and allow the pilot's largest batch plus six standard
deviations of the full batches' sizes (a batch's size is a sum of many nearly independent
draws, so it concentrates), never more than 50% over the largest, and the hard bound as a
ceiling. A flat 50% made a slot of coauthor-physics (8415-dim rows) the whole feature file,
897 MiB, where batches hold 19k of its 34k nodes. A batch that still does not fit is refused
with a message naming the size to configure.

``size_sessions`` then picks, where the config says "auto", how many slots per client and how
many clients the budget funds: slots may take half of it, so a dataset much smaller than the
budget always starts, in every mode.
"""

from dataclasses import dataclass

import numpy as np

from loader.daemon.config import SamplerConfig
from loader.daemon.link_serving import LinkServing
from loader.daemon.mapped_graph import MappedGraph, map_graph
from loader.daemon.resident import ResidentData
from loader.format.dataset import Dataset
from loader.sampling.inmemory import STREAM_TEST, STREAM_VAL, EpochBatches, epoch_batches_inmemory, eval_split_batches
from loader.sampling.link_sampling import (
    STREAM_LINK_TEST,
    STREAM_LINK_VAL,
    SampledLinkBatch,
    link_batch_plan,
    sample_link_batch,
)
from loader.sampling.pilot import mean_nodes_per_hop
from loader.sampling.sampling import sample_pass
from proto.batch_arrays import BatchShape
from proto.errors import UserError
from proto.sizes import counted, format_size
from proto.slots import HEADER_BYTES, slot_bytes_for

__all__ = ["BatchBound", "NO_BATCH", "PilotSizes", "SessionSizing", "estimate_slot_bytes", "pilot_batch_sizes",
           "size_sessions", "PILOT_BATCHES", "HEADROOM", "SIGMAS"]

PILOT_BATCHES = 16
HEADROOM = 1.5
"""Most a slot's bound exceeds the pilot's largest batch by (a factor)."""
SIGMAS = 6
"""Standard deviations of the pilot's full batches added to its largest batch."""
SLOT_SHARE = 0.5
"""Share of the budget automatically sized slots (all clients') may take."""
AUTO_SLOTS = (2, 4)
"""Fewest and most slots per client ``slots = "auto"`` picks (2: one training, one being filled)."""
AUTO_CLIENTS = 8
"""Most clients ``max_clients = "auto"`` funds."""


def _hard_bound(batch_size: int, fanouts: tuple[int, ...], num_nodes: int, num_edges: int) -> tuple[int, int]:
    nodes, edges, frontier = batch_size, 0, batch_size
    for fanout in fanouts:
        if fanout < 0:
            return num_nodes, num_edges
        frontier *= fanout
        edges += frontier
        nodes += frontier
    return min(nodes, num_nodes), min(edges, num_edges)


@dataclass(frozen=True)
class BatchBound:
    """Sampled nodes and edges one batch is expected to stay under."""

    nodes: int
    edges: int
    seeds: int | None = None
    """Most seeds a batch has; None: the batch size (a link batch's seeds are its pairs' endpoints)."""
    pairs: int = 0
    """Most link-prediction pairs a batch carries (``edge_label_index`` or ``pair_index``)."""
    tails: int = 0
    """Negative tails per evaluation pair (``pair_tails``)."""


NO_BATCH = BatchBound(0, 0)
"""The bound of a split with no batch: nothing to hold memory for."""


@dataclass(frozen=True)
class PilotSizes:
    """What a training and an evaluation batch are expected to stay under (pilot max x 1.5, capped by
    the hard bound); None where the split is empty (no such batch will ever exist)."""

    train: BatchBound | None
    eval: BatchBound | None
    full_nodes_per_hop: tuple[float, ...] | None = None
    """Mean nodes per hop of a few training batches sampled with every hop of ``fanouts`` (seeds first); None
    where not asked for (``pilot_batch_sizes(full_hops=False)``) or without training nodes."""

    @property
    def train_or_zero(self) -> BatchBound:
        """The training bound, ``NO_BATCH`` without training nodes (then no training batch needs memory)."""
        return self.train if self.train is not None else NO_BATCH


def _pilot(data: MappedGraph, plan: EpochBatches, batch_size: int, fanouts: tuple[int, ...], num_nodes: int,
           num_edges: int) -> BatchBound | None:
    count = min(PILOT_BATCHES, len(plan.keys))
    if count == 0:
        return None
    sampled = sample_pass(data.graph, plan.seeds[:count * batch_size], batch_size, fanouts, plan.keys[:count])
    bound_nodes, bound_edges = _hard_bound(batch_size, fanouts, num_nodes, num_edges)
    full = sampled.num_sampled_nodes[:, 0] == batch_size  # the epoch's last batch may be short: not a sample
    return BatchBound(min(bound_nodes, _allowance(np.diff(sampled.node_ptr), full)),
                      min(bound_edges, _allowance(np.diff(sampled.edge_ptr), full)))


def _larger(a: BatchBound | None, b: BatchBound | None) -> BatchBound | None:
    """The bound that holds batches of both (None where neither split has a batch)."""
    if a is None or b is None:
        return a if b is None else b
    return BatchBound(max(a.nodes, b.nodes), max(a.edges, b.edges))


def _allowance(sizes: np.ndarray, full: np.ndarray) -> int:
    """The pilot's largest size plus SIGMAS deviations of its full batches, capped at HEADROOM x largest."""
    largest = int(sizes.max())
    spread = float(sizes[full].std()) if full.sum() >= 2 else largest  # too few to tell: the cap decides
    return min(int(largest * HEADROOM), int(largest + SIGMAS * spread)) + 64


def _link_pilot(data: MappedGraph, link: LinkServing, sampler: SamplerConfig, num_nodes: int, num_edges: int
                ) -> tuple[BatchBound | None, BatchBound | None]:
    """The training and evaluation bounds of a link dataset: a few training batches sampled as the daemon samples
    them (their seeds: every endpoint of B(1 + k) pairs), and each split's node batches with the most pairs one
    carries."""
    batch_size, fanouts, k = sampler.batch_size, sampler.sampled_fanouts, link.negatives
    plan = link_batch_plan(link.train_positives, batch_size, sampler.seed, 0)
    train = None
    count = min(PILOT_BATCHES, plan.num_batches)
    if count:
        sampled: list[SampledLinkBatch] = []
        for b in range(count):
            positions, key = plan.batch(b)
            sampled.append(sample_link_batch(data.graph, link.train_edges[0, positions], link.train_edges[1, positions],
                                             num_nodes, fanouts, key, negatives_per_positive=k,
                                             disjoint=link.disjoint))
        seeds = min(num_nodes, batch_size * (2 + k))  # B sources, B targets, Bk negative tails at most
        bound_nodes, bound_edges = _hard_bound(seeds, fanouts, num_nodes, num_edges)
        full = np.array([b.num_positives == batch_size for b in sampled])
        train = BatchBound(min(bound_nodes, _allowance(np.array([len(b.nodes) for b in sampled]), full)),
                           min(bound_edges, _allowance(np.array([b.edge_index.shape[1] for b in sampled]), full)),
                           seeds=seeds, pairs=batch_size * (1 + k))
    evaluation = None
    for split, stream in (("val", STREAM_LINK_VAL), ("test", STREAM_LINK_TEST)):
        held = link.held_out[split]
        nodes = _pilot(data, eval_split_batches(held.nodes, sampler.eval_batch_size, sampler.seed, stream),
                       sampler.eval_batch_size, sampler.sampled_eval_fanouts, num_nodes, num_edges)
        if nodes is None:
            continue
        batches = -(-len(held.nodes) // sampler.eval_batch_size)
        pairs = -(-held.num_positives // batches)  # HeldOutShares: at most ceil(E / batches) a batch
        bound = BatchBound(nodes.nodes, nodes.edges, pairs=pairs, tails=link.eval_negatives)
        evaluation = bound if evaluation is None else BatchBound(
            max(evaluation.nodes, bound.nodes), max(evaluation.edges, bound.edges), pairs=max(evaluation.pairs, pairs),
            tails=link.eval_negatives)
    return train, evaluation


def pilot_batch_sizes(dataset: Dataset, resident: ResidentData, sampler: SamplerConfig, *,
                      full_hops: bool = False, link: LinkServing | None = None) -> PilotSizes:
    """Sample a few training, validation and test batches (the hops they sample: ``sampled_fanouts``) over the full
    graph (a superset of any mega-batch's neighbourhoods, so training batches there only get smaller). Done
    once at startup: slot sizing and the memory plans read the result. With ``full_hops``, a few training
    batches with every hop of ``fanouts`` too, for the aggregation cache's cost model. With ``link``, the link
    task's batches (``_link_pilot``) instead of node batches."""
    m = dataset.manifest
    data = map_graph(dataset, resident.partitions)
    try:
        if link is not None:
            train_bound, eval_bound = _link_pilot(data, link, sampler, m.num_nodes, m.num_edges)
            return PilotSizes(train_bound, eval_bound)
        train = _pilot(data, epoch_batches_inmemory(resident.split_ids["train"], sampler.batch_size, sampler.seed, 0),
                       sampler.batch_size, sampler.sampled_fanouts, m.num_nodes, m.num_edges)
        # both evaluation splits: their batches differ in size where a split is smaller than a batch (Planetoid's
        # 500 validation nodes against 1000 test nodes), which a 2-hop batch hides and a 1-hop one does not
        evaluation = _larger(*(_pilot(data, eval_split_batches(resident.split_ids[split], sampler.eval_batch_size,
                                                               sampler.seed, stream),
                                      sampler.eval_batch_size, sampler.sampled_eval_fanouts, m.num_nodes, m.num_edges)
                               for split, stream in (("val", STREAM_VAL), ("test", STREAM_TEST))))
        hops = None
        if full_hops:
            mean = mean_nodes_per_hop(data.graph, resident.split_ids["train"], PILOT_BATCHES, sampler.batch_size,
                                      sampler.fanouts, sampler.seed)
            hops = None if mean is None else tuple(mean)
    except ValueError as err:
        # the sampler validates every neighbour id it reads: one out of range is a damaged indices.npy
        raise UserError(f"{dataset.file('indices')}: {err}; the file is damaged: run 'megabatch verify'") from None
    finally:
        data.close()
    return PilotSizes(train, evaluation, hops)


def estimate_slot_bytes(dataset: Dataset, pilot: PilotSizes, sampler: SamplerConfig, *, class_weights: bool = False
                        ) -> int:
    """Bytes per slot that fit every training and evaluation batch with high margin (a training batch with
    the arrays of a trainer feature cache's plan: any client may ask for one; ``x_agg`` where batches carry it;
    with ``class_weights``, a training batch's ``class_weight``)."""
    m = dataset.manifest
    worst = 0
    cases = [(pilot.train, sampler.batch_size, sampler.sampled_fanouts, sampler.aggregation_cache),
             (pilot.eval, sampler.eval_batch_size, sampler.sampled_eval_fanouts, sampler.eval_aggregated)]
    for training, (bound, batch_size, fanouts, aggregated) in zip((True, False), cases):
        if bound is None:
            continue  # no batch of this kind to size for
        # a training batch for a client with a feature cache may ship every row (at their first access) and
        # carry its plan too: hit_slot for every node, an update per node at most (12 bytes a node in all); and
        # its seeds' micro-batch groups, for a client that cuts batches (4 bytes a seed)
        seeds = min(batch_size if bound.seeds is None else bound.seeds, bound.nodes)
        pairs = "" if not bound.pairs else "train" if training else "eval"
        shape = BatchShape(bound.nodes, seeds, bound.edges, len(fanouts), m.feat_dim,
                           m.value_dtype, shipped_rows=bound.nodes if training else None,
                           num_updates=bound.nodes if training else 0, aggregated=aggregated,
                           num_classes=m.num_classes if training and class_weights else 0, seed_groups=training,
                           pairs=pairs, num_pairs=bound.pairs, num_tails=bound.tails,
                           pair_weights=training)  # a buffer state's pairs may carry their weights
        worst = max(worst, slot_bytes_for(shape.specs(), HEADER_BYTES))
    return max(worst, 2 * HEADER_BYTES)


@dataclass(frozen=True)
class SessionSizing:
    """How many clients the daemon serves at once and the slots each gets (resolved from "auto")."""

    clients: int
    slots: int
    slot_bytes: int

    @property
    def total(self) -> int:
        """Bytes of every client's slots: what the memory plans charge."""
        return self.clients * self.slots * self.slot_bytes

    def describe(self) -> str:
        return f"{counted(self.clients, 'client')} x {counted(self.slots, 'slot')} x {format_size(self.slot_bytes)}"


def size_sessions(budget: int, slot_bytes: int, slots: int | None, clients: int | None) -> SessionSizing:
    """Resolve ``[publisher] slots`` and ``[server] max_clients`` (None = "auto") for ``budget``.

    "auto" lets all clients' slots take up to SLOT_SHARE of the budget: slots per client from
    AUTO_SLOTS (the most that fit, never under the fewest), then as many clients as fit (1 to
    AUTO_CLIENTS). Explicit values are kept; the memory plans refuse them if they do not fit.
    """
    share = int(budget * SLOT_SHARE)
    if slots is None:
        slots = max(AUTO_SLOTS[0], min(AUTO_SLOTS[1], share // max(1, slot_bytes)))
    if clients is None:
        clients = max(1, min(AUTO_CLIENTS, share // max(1, slots * slot_bytes)))
    return SessionSizing(clients, slots, slot_bytes)
