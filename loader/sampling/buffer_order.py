"""An epoch of link-prediction training in a partition buffer order (COMET or BETA): which training edges
are trained in which buffer state, in which batches, and which nodes each state holds. Pure numpy.

MariusGNN (EuroSys '23) trains link prediction out of core by keeping c of p partitions in a buffer and
training an edge bucket (i, j) only while partitions i and j are both resident; ``comet.py`` plans the
states and assigns each bucket one (``BufferPlan``, ``bucket_order``). This module turns a plan into
the batches of one epoch, so that the in-memory trainer can measure what the order costs in accuracy
before any daemon mode serves it (``--link-order comet|beta``):

* ``buffer_plan(order, p, c, l, seed, epoch)``: ``comet_plan`` or ``beta_plan`` of (seed, epoch).
* ``buffer_epoch(plan, edge_buckets, partitions, batch_size)``: for each state t in plan order, its training
  edges (bucket (i, j) is positions ``edge_buckets[i*P + j]:edge_buckets[i*P + j + 1]`` of ``train_edges.npy``,
  docs/FORMAT.md), in bucket order, shuffled by ``shuffle(positions, key_t)`` with key_t = key t of
  ``batch_keys(seed, STREAM_LINK_BUFFER, epoch, 0, 0, num_states)``, and cut into the fewest batches of
  at most ``batch_size``, as equal as they can be (``balanced_cuts``: a batch never spans two states, since
  the buffer changes between them, and a short tail would be a full optimizer step on a few pairs). A state
  without edges has no batch. Every stored training edge is in exactly one bucket, and every bucket in one
  state, so an epoch trains each edge once; an undirected pair is stored once, in bucket (i, j) or (j, i)
  as its orientation says, and is trained where that bucket is.
* The epoch's batches are ``link_batch_plan_in_order`` over the states' orders concatenated, with the
  states' batch boundaries: batch b gets the same key as batch b of the shuffled order
  (``STREAM_LINK_TRAIN``), so the one link sampler serves both orders.

Which edges a state trains (``assignment``). BETA: the buckets ``bucket_order(plan)[t]`` assigns it, whole.
COMET, ``"edge"`` (the default): every bucket (i, j) whose two partitions state t holds, ascending by (i, j), and
of each only the edges of state t's share: with n_ij the states holding both i and j and m the states before t
that held both (``comet.bucket_shares``), edge e (its position) is in share
``key_shares(position_keys(seed, STREAM_LINK_EDGE_STATE, epoch, [e]), [n_ij])``, and state t keeps the edges of
share m. So each edge goes to one of its bucket's co-resident states, uniformly and independently of the others,
and a METIS partition's own bucket (i, i), most of its edges, is spread over every state that holds i instead of
falling whole on one of them: a state trains a share of each resident partition's edges, not one or two
partitions' all (MariusGNN's form, ``"bucket"``: ``bucket_order(plan)[t]``, whole). It reads nothing more: a
state's edges are the resident partitions' either way.

What a state's batches may see (the trainer's part, ``trainer/link/inmemory.py``): negatives drawn
from the resident nodes (``BufferState.node_begin``/``node_end``, the resident partitions' node
ranges) and message passing over the subgraph those nodes induce (``induced.induced_by_ranges``).
Both endpoints of every edge of a state are resident (the plan trains a bucket only where both its
partitions are).
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np

from loader.format.partition_table import PartitionTable
from loader.sampling.comet import BufferPlan, beta_plan, bucket_order, bucket_shares, comet_plan, default_logical
from loader.sampling.induced import range_nodes
from loader.sampling.link_sampling import LinkEpochPlan, link_batch_plan_in_order
from loader.sampling.sampling import as_int, as_int_array, batch_keys, key_shares, position_keys, shuffle

__all__ = ["LINK_ORDERS", "LinkOrder", "STREAM_LINK_BUFFER", "STREAM_LINK_EDGE_STATE", "Assignment", "ASSIGNMENTS",
           "BufferState", "BufferEpoch", "balanced_cuts", "buffer_plan", "buffer_epoch", "resolved_logical"]

LinkOrder = Literal["shuffled", "comet", "beta"]
LINK_ORDERS: tuple[LinkOrder, ...] = ("shuffled", "comet", "beta")
"""``--link-order``: ``shuffled`` (``link_batch_plan``, every edge in one random order over the whole graph),
or a partition buffer order of ``comet.py``."""

STREAM_LINK_BUFFER = 28
"""``batch_keys`` stream of the shuffle of each buffer state's edges (the next of the link block 24-27)."""
STREAM_LINK_EDGE_STATE = 30
"""``position_keys`` stream of COMET's edge assignment: which share of its bucket an edge is (after 29, the ranks')."""

Assignment = Literal["edge", "bucket"]
ASSIGNMENTS: tuple[Assignment, ...] = ("edge", "bucket")
"""How a COMET epoch gives its states their edges: ``edge`` (the default since 2026-11-29) splits each bucket's
edges at random among all the states that hold both its partitions; ``bucket`` trains each bucket whole in one of
them, drawn at random (MariusGNN's ``randomlyAssignEdgeBucketsToBuffers``, ``BufferPlan.bucket_state``)."""


@dataclass(frozen=True)
class BufferState:
    """One buffer state of an epoch: what is resident and which training edges it trains, in batches.

    index: the state's number in the plan; partitions: int64, the resident physical partitions,
    ascending; node_begin, node_end: int64, their node ranges (ascending, disjoint); order: int64,
    positions into ``train_edges``, in batch order; batch_ptr: int64 [B_t + 1], batch k of the state is
    ``order[batch_ptr[k]:batch_ptr[k + 1]]``.
    """

    index: int
    partitions: np.ndarray
    node_begin: np.ndarray
    node_end: np.ndarray
    order: np.ndarray
    batch_ptr: np.ndarray

    @property
    def num_batches(self) -> int:
        return len(self.batch_ptr) - 1

    @property
    def num_nodes(self) -> int:
        """Resident nodes."""
        return int((self.node_end - self.node_begin).sum())

    def resident_nodes(self) -> np.ndarray:
        """int64: the resident node ids, ascending (the negative pool of the state's batches)."""
        return range_nodes(self.node_begin, self.node_end)


@dataclass(frozen=True)
class BufferEpoch:
    """An epoch in a buffer order: the plan, its states in order and the epoch's batches.

    batches: the whole epoch's ``LinkEpochPlan`` (the states' orders back to back); state_batches:
    int64 [S + 1], state t's batches are ``state_batches[t]:state_batches[t + 1]`` of ``batches``.
    """

    plan: BufferPlan
    states: list[BufferState]
    batches: LinkEpochPlan
    state_batches: np.ndarray

    @property
    def num_batches(self) -> int:
        return self.batches.num_batches


def resolved_logical(order: LinkOrder, num_partitions: int, capacity: int, num_logical: int | None) -> int:
    """The logical partitions a plan groups into: ``default_logical`` for COMET unless given, p for BETA."""
    if order == "beta":
        return num_partitions
    return default_logical(num_partitions, capacity) if num_logical is None else num_logical


def buffer_plan(order: LinkOrder, num_partitions: int, capacity: int, num_logical: int | None, seed: int,
                epoch: int) -> BufferPlan:
    """Epoch ``epoch``'s plan: ``comet_plan`` (l = ``num_logical``, None: MariusGNN's default) or ``beta_plan``
    (which has no logical partitions: ``num_logical`` must be None). ValueError as theirs, or for "shuffled"."""
    if order == "comet":
        return comet_plan(num_partitions, capacity, num_logical, seed=seed, epoch=epoch)
    if order == "beta":
        if num_logical is not None:
            raise ValueError("BETA swaps physical partitions: it takes no number of logical partitions")
        return beta_plan(num_partitions, capacity, seed, epoch)
    raise ValueError(f"order must be 'comet' or 'beta' for a buffer plan, got {order!r}")


def _check_buckets(edge_buckets: np.ndarray, num_partitions: int) -> np.ndarray:
    offsets = as_int_array("edge_buckets", edge_buckets, (np.int64,))
    if len(offsets) != num_partitions * num_partitions + 1:
        raise ValueError(f"edge_buckets: {len(offsets)} offsets, expected P*P + 1 = "
                         f"{num_partitions * num_partitions + 1} for {num_partitions} partitions")
    if offsets[0] != 0 or (np.diff(offsets) < 0).any():
        raise ValueError("edge_buckets: offsets must rise from 0")
    return offsets


def balanced_cuts(count: int, batch_size: int) -> np.ndarray:
    """Pointers (int64, [B + 1]) that cut ``count`` items into the fewest batches of at most ``batch_size``,
    B = ceil(count / batch_size), as equal as they can be: batch k ends at floor(k * count / B) (sizes differ
    by at most one; no batch for count 0).

    Why not full batches and a short last one: a state holds a few batches (Cora's 29 COMET states about 2.5
    of 64 pairs each), so a tail of a handful of pairs would be a tenth of the epoch's steps, each as large
    an optimizer step as a full batch's on far fewer examples (the hierarchical node mode evens its mega-batches'
    batches for the same reason, ``ranks.even_batch_size``)."""
    batches = -(-count // batch_size)
    if batches == 0:
        return np.zeros(1, dtype=np.int64)
    return (np.arange(batches + 1, dtype=np.int64) * count) // batches


def _state_edges_by_bucket(offsets: np.ndarray, p: int, buckets: np.ndarray) -> np.ndarray:
    """The edges of whole buckets (int64 (k, 2), ascending), bucket after bucket."""
    flat = buckets[:, 0] * p + buckets[:, 1]
    return range_nodes(offsets[flat], offsets[flat + 1])


def _state_edges_by_edge(plan: BufferPlan, offsets: np.ndarray, t: int, counts: np.ndarray,
                         shares: np.ndarray) -> np.ndarray:
    """State t's share of every bucket whose two partitions it holds (module docstring: edge assignment)."""
    p = plan.num_partitions
    members = plan.states[t]
    flat = (members[:, None] * p + members[None, :]).ravel()  # ascending (i, j): members are ascending
    begin, end = offsets[flat], offsets[flat + 1]
    positions = range_nodes(begin, end)
    lengths = end - begin
    keys = position_keys(plan.seed, STREAM_LINK_EDGE_STATE, plan.epoch, positions)
    share = key_shares(keys, np.repeat(counts.ravel()[flat], lengths))
    return positions[share == np.repeat(shares.ravel(), lengths)]


def buffer_epoch(plan: BufferPlan, edge_buckets: np.ndarray, partitions: PartitionTable,
                 batch_size: int, *, balanced: bool = True, assignment: Assignment = "edge") -> BufferEpoch:
    """The epoch of ``plan`` (its seed and epoch key the shuffles and batches; module docstring).

    balanced=False cuts each state into full batches and a short last one, the form before 2026-11-28
    (bench/link_variants.py's ``comet-tail-batches`` measures what balancing changed). assignment: how a COMET
    plan's states get their edges (``ASSIGNMENTS``; BETA trains each bucket whole in its first co-resident state
    whatever this says).

    edge_buckets: int64 (P*P + 1,), the bucket offsets of ``train_edges.npy`` (the edges are
    positions 0..edge_buckets[-1]-1); partitions: the dataset's P partitions (their node ranges).
    ValueError when the offsets, the table and the plan disagree on P, or batch_size < 1.
    """
    p = plan.num_partitions
    if len(partitions) != p:
        raise ValueError(f"partitions: {len(partitions)} rows, the plan has {p} partitions")
    offsets = _check_buckets(edge_buckets, p)
    size = as_int("batch_size", batch_size)
    if size < 1:
        raise ValueError(f"batch_size: {size}, expected >= 1")
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {ASSIGNMENTS}, got {assignment!r}")
    keys = batch_keys(plan.seed, STREAM_LINK_BUFFER, plan.epoch, 0, 0, plan.num_states)
    by_edge = assignment == "edge" and plan.policy == "comet"
    counts, shares = bucket_shares(plan) if by_edge else (None, None)
    whole = None if by_edge else bucket_order(plan)
    states: list[BufferState] = []
    for t, members in enumerate(plan.states):
        if counts is not None and shares is not None:
            positions = _state_edges_by_edge(plan, offsets, t, counts, shares[t])
        else:
            assert whole is not None
            positions = _state_edges_by_bucket(offsets, p, whole[t])
        order = shuffle(positions, int(keys[t]))
        ptr = balanced_cuts(len(order), size) if balanced else \
            np.append(np.arange(0, len(order), size, dtype=np.int64), np.int64(len(order)))
        states.append(BufferState(t, members, partitions.node_begin[members], partitions.node_end[members], order,
                                  ptr))
    counts = np.array([s.num_batches for s in states], dtype=np.int64)
    state_batches = np.zeros(len(states) + 1, dtype=np.int64)
    np.cumsum(counts, out=state_batches[1:])
    edge_starts = np.cumsum([0] + [len(s.order) for s in states])
    order = np.concatenate([s.order for s in states]) if states else np.zeros(0, dtype=np.int64)
    batch_ptr = np.concatenate([[0]] + [s.batch_ptr[1:] + first for s, first in zip(states, edge_starts)])
    batches = link_batch_plan_in_order(order, size, plan.seed, plan.epoch, batch_ptr.astype(np.int64))
    return BufferEpoch(plan, states, batches, state_batches)
