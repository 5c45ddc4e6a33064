"""Stage 1 with ``[hierarchy] formation = "comet"``: MariusGNN's node-classification replacement policy as
mega-batches (EuroSys '23, "Replacement Policy for Node Classification"; issue 28's COMET-style remedy).

``schedule_epoch`` replaces the whole mega-batch each time: its groups of partitions are disjoint, and a
training node is trained with the partitions of its group only. Here the epoch's partitions are grouped the
same way (``schedule``: "balanced" or "random") into l *logical* partitions of ceil(p / l) physical ones,
with l the least for which two of them fit the mega-batch (``comet.default_logical``: MariusGNN's l = 2p/c;
"random" is ``comet.logical_groups``, "balanced" deals the shuffle as ``schedule_epoch`` does, so each
logical partition's training labels mix like the epoch's). The buffer holds c_l logical partitions (as many
of the largest as fit the mega-batch's N_d physical ones); each next state swaps one resident logical
partition, drawn at random, for the next one not yet seen (a seeded permutation: without replacement), until
every one has been resident: l - c_l + 1 states, the first read whole and each later one reading only its
incoming partition (the reader copies the rest from the buffer before), so an epoch reads the graph once, as
with groups.

A logical partition is resident in a contiguous run of states; each of its training nodes is trained
in one of them, drawn uniformly and independently per node, so a state's seeds come from every
partition it holds and a node meets different partners from epoch to epoch. Every training node is
trained exactly once per pass over the epoch (a test). The draws use
``numpy.random.Generator(PCG64([seed, STREAM, epoch]))`` with ``STREAM_SWAPS`` (the permutation, then
the partition swapped out at each step) and ``STREAM_NODES`` (each node's state): a pure function of
its arguments.
"""

import numpy as np

from loader.daemon.hierarchical.schedule import ScheduledMegaBatch, schedule_epoch
from loader.sampling.comet import default_logical, logical_groups

__all__ = ["STREAM_SWAPS", "STREAM_NODES", "swap_schedule", "swap_refusal"]

STREAM_SWAPS = 0x5A9_0001
"""PCG64 stream of the logical partitions' order and of which resident one each step swaps out."""
STREAM_NODES = 0x5A9_0002
"""PCG64 stream of each training node's state among those that hold its partition."""


def swap_refusal(num_partitions: int, per_megabatch: int) -> str | None:
    """Why ``formation = "comet"`` cannot run with mega-batches of ``per_megabatch`` partitions (None: it can)."""
    if per_megabatch < 2 <= num_partitions and per_megabatch < num_partitions:
        return (f"[hierarchy] formation = \"comet\" swaps one of several logical partitions at a time, but a "
                f"mega-batch holds {per_megabatch} partition of {num_partitions}: raise [hierarchy] "
                f"megabatch_fraction or [memory] budget, or use formation = \"groups\"")
    return None


def _rng(seed: int, stream: int, epoch: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, stream, epoch]))


def _swap_states(num_logical: int, held: int, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray,
                                                                                  np.ndarray]:
    """The states (resident logical ids, ascending) and each logical partition's first and last state."""
    order = rng.permutation(num_logical).astype(np.int64)
    resident = order[:held].copy()
    count = num_logical - held + 1
    first = np.zeros(num_logical, dtype=np.int64)
    last = np.full(num_logical, count - 1, dtype=np.int64)
    states = [np.sort(resident)]
    for step, incoming in enumerate(order[held:]):  # one iteration per logical partition, not per node
        out = int(rng.integers(held))
        last[resident[out]] = step
        resident[out] = incoming
        first[incoming] = step + 1
        states.append(np.sort(resident))
    return states, first, last


def swap_schedule(num_partitions: int, per_megabatch: int, seed: int, epoch: int, train_ids: np.ndarray,
                  train_partition: np.ndarray, label_counts: np.ndarray | None = None) -> list[ScheduledMegaBatch]:
    """The epoch's buffer states as mega-batches, each with the training nodes it trains (``train_nodes``).

    train_ids: int64 dataset ids of the training nodes, ascending; train_partition: each one's partition;
    label_counts: as ``schedule_epoch``'s (None: "random" grouping). One state holding every partition (and
    every training node) when a mega-batch holds them all. ValueError where ``swap_refusal`` says why.
    """
    problem = swap_refusal(num_partitions, per_megabatch)
    if problem is not None:
        raise ValueError(problem)
    ids = np.ascontiguousarray(train_ids, dtype=np.int64)
    part_of = np.ascontiguousarray(train_partition, dtype=np.int64)
    if ids.shape != part_of.shape:
        raise ValueError(f"train_ids {ids.shape} and train_partition {part_of.shape} differ in shape")
    if per_megabatch >= num_partitions:
        return [ScheduledMegaBatch(epoch, 0, 1, np.arange(num_partitions, dtype=np.int64), train_nodes=ids)]
    num_logical = default_logical(num_partitions, per_megabatch)
    if label_counts is None:  # MariusGNN's random grouping, sizes differing by at most one
        grouping = logical_groups(num_partitions, num_logical, seed, epoch)
        groups = [np.flatnonzero(grouping == logical) for logical in range(num_logical)]
    else:  # dealt as balanced mega-batches of ceil(p / l) are (at most l groups, sizes differing by at most one)
        size = -(-num_partitions // num_logical)
        groups = [g.partitions for g in schedule_epoch(num_partitions, size, seed, epoch, label_counts)]
    held = min(len(groups), per_megabatch // max(len(g) for g in groups))
    states, first, last = _swap_states(len(groups), held, _rng(seed, STREAM_SWAPS, epoch))

    logical_of = np.empty(num_partitions, dtype=np.int64)
    for logical, members in enumerate(groups):
        logical_of[members] = logical
    node_logical = logical_of[part_of]
    lo, span = first[node_logical], last[node_logical] - first[node_logical] + 1
    state_of = lo + np.minimum((_rng(seed, STREAM_NODES, epoch).random(len(ids)) * span).astype(np.int64), span - 1)
    by_state = np.argsort(state_of, kind="stable")  # stable: each state's ids stay ascending
    bounds = np.cumsum(np.bincount(state_of, minlength=len(states)))[:-1]
    nodes = np.split(ids[by_state], bounds)
    return [ScheduledMegaBatch(epoch, i, len(states), np.sort(np.concatenate([groups[j] for j in state])),
                               train_nodes=nodes[i])
            for i, state in enumerate(states)]
