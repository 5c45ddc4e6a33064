"""Link-prediction batches in PyG's ``LinkNeighborLoader`` layout: the in-memory reference (issue 31).

The out-of-core modes must later produce these batches bitwise, so every choice below is a pure
function of the arguments, specified here.

Epoch plan (``link_batch_plan``): the training positive edges are positions 0..P-1 of the caller's
(src, dst) arrays. Epoch e orders them by ``shuffle(arange(P), link_shuffle_key(seed, e))`` and cuts
the order into consecutive batches of ``batch_size`` (the last may be short); batch b is sampled
with key b of ``batch_keys(seed, STREAM_LINK_TRAIN, e, 0, 0, B)``. ``link_batch_plan_in_order``
takes an explicit order instead (the COMET / bucket order), optionally with its own batch
boundaries, and gives batch b the same key, so one sampler serves both orders.

One batch (``sample_link_batch``), with B positives (src_i, dst_i) and k = negatives_per_positive:

* Negatives (tail corruption): negative m = j * B + i (j = 0..k-1, i = 0..B-1) is the pair
  (src_i, t_m): the positives' sources tiled k times, as PyG's ``src.repeat(k)``. With
  ``negative_key = mix64(batch_key)`` (the hop-0 key, which no hop of the sampler uses) and
  ``draw_m = mix64(negative_key + (m + 1) * GAMMA)`` (mod 2^64, ``mix64``/``GAMMA`` as in
  ``loader.sampling.sampling``), t_m = draw_m mod num_nodes, or ``negative_pool[draw_m mod len(pool)]``
  with a pool. The modulo's bias is below n / 2^64, nothing at any graph size. A negative is not
  checked against the graph's edges (it may be a true edge, or src_i itself), as in PyG's binary
  negative sampling: rejecting them would make the draw count data-dependent.
* Supervision pairs: positives first, then the negatives, in m order; labels 1.0 then 0.0.
* Seeds: the distinct endpoints of all supervision pairs, sorted by global id (as PyG's
  ``unique`` sorts them). Sorted by global id, not by local id or first appearance, so a mode whose
  local numbering differs still gets the same seed order.
* Neighbour sample: ``sample_pass`` of the seeds as one batch with the batch key, exactly as a
  node-classification batch with those seeds (frontier, Floyd picks, first-seen numbering).
* ``disjoint=True``: after sampling, every sampled edge (u, v) with {u, v} = {src_i, dst_i} for
  some positive i (either direction, each copy of a multi-edge) is dropped; edges keep their order
  and ``num_sampled_edges`` counts what is left. Nothing else changes: both endpoints of a dropped
  edge are seeds, so the node set and its order are those of ``disjoint=False``. This differs from
  PyG's ``disjoint_train_ratio`` (which removes the edges before sampling, so a target may pick
  another neighbour in their place); a drop after sampling keeps the Floyd draws, and so the
  batch, identical otherwise. Negatives are never edges to drop.

Local ids: ``src``, ``dst`` and ``negative_pool`` are ids of ``graph`` (local ids; equal to the
dataset's ids in the in-memory reference, where ``global_ids = arange(N)``); ``nodes`` and
``edge_label_global`` are the dataset's ids (``graph.global_ids``), ``edge_label_index`` and
``edge_index`` positions into ``nodes``.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from loader.sampling.sampling import (
    CSCGraph,
    SampledBatch,
    SampledPass,
    as_int,
    as_int_array,
    batch_keys,
    mix64_array,
    sample_pass,
    shuffle,
)
from proto.held_pairs import HeldPairs

__all__ = ["STREAM_LINK_SHUFFLE", "STREAM_LINK_TRAIN", "STREAM_LINK_VAL", "STREAM_LINK_TEST", "LinkEpochPlan",
           "SampledLinkBatch", "link_shuffle_key", "link_batch_plan", "link_batch_plan_in_order", "link_eval_plan",
           "sample_link_batch", "sample_link_batch_by", "SeedSampler", "held_out_pairs", "link_pass",
           "PassLinkLabels", "HeldOutShares", "STREAM_LINK_TRAIN_RANK", "link_rank_key"]

# A block of its own: 0-4 are the node streams (``loader.sampling.inmemory``) and 16 the hierarchical
# mega-batch shuffle; 24-27 stay clear of both and of the next small numbers other streams will take.
STREAM_LINK_SHUFFLE = 24
"""``batch_keys`` stream of the per-epoch order of the training edges (never used to sample a batch)."""
STREAM_LINK_TRAIN = 25
"""``batch_keys`` stream of the link-prediction training batches (negatives and neighbour sample)."""
STREAM_LINK_VAL = 26
"""``batch_keys`` stream of link-prediction validation batches (``link_eval_plan``)."""
STREAM_LINK_TEST = 27
"""``batch_keys`` stream of link-prediction test batches (``link_eval_plan``)."""
STREAM_LINK_TRAIN_RANK = 29
"""Keys of rank r > 0's pieces of the global training batches under several ranks (``link_rank_key``)."""


def link_rank_key(seed: int, epoch: int, rank: int, batch: int, single_key: int) -> int:
    """The sampling key of rank ``rank``'s piece of global training batch ``batch``: rank 0 keeps the batch's
    own key (``single_key``, so one rank of one is the single process exactly), the others draw from their own
    stream (their negatives and neighbours must not repeat rank 0's)."""
    if rank == 0:
        return single_key
    return int(batch_keys(seed, STREAM_LINK_TRAIN_RANK, epoch, rank, batch, 1)[0])


_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_KEY_LIMIT = 1 << 64


@dataclass(frozen=True)
class LinkEpochPlan:
    """Which training edges form which batch, and each batch's key.

    order: int64 [P], positions into the caller's training (src, dst) arrays, in batch order;
    batch_ptr: int64 [B + 1], batch b is ``order[batch_ptr[b]:batch_ptr[b + 1]]`` (never empty);
    keys: uint64 [B], batch b is sampled with ``keys[b]`` (``sample_link_batch``'s ``key``).
    """

    order: np.ndarray
    batch_ptr: np.ndarray
    keys: np.ndarray

    @property
    def num_batches(self) -> int:
        return int(self.keys.shape[0])

    def batch(self, b: int) -> tuple[np.ndarray, int]:
        """Batch ``b``'s edge positions (a view of ``order``) and its key; ``IndexError`` outside the plan."""
        if not 0 <= b < self.num_batches:
            raise IndexError(f"batch {b} outside [0, {self.num_batches})")
        return self.order[self.batch_ptr[b]:self.batch_ptr[b + 1]], int(self.keys[b])


@dataclass(frozen=True)
class SampledLinkBatch:
    """One link-prediction batch in ``LinkNeighborLoader``'s layout (B positives, k negatives each).

    nodes: int64 [n], global ids, the seeds (``num_sampled_nodes[0]`` of them) first, sorted by id;
    local_nodes: int64 [n], the same nodes as ids of the sampled graph (rows of a partition buffer);
    edge_index: int64 [2, E], positions into ``nodes``, row 0 the source (sampled neighbour), row 1
    the target, hop by hop; num_sampled_nodes: int64 [L + 1]; num_sampled_edges: int64 [L];
    edge_label_index: int64 [2, B * (1 + k)], positions into ``nodes`` (all seeds), positives first;
    edge_label: float32 [B * (1 + k)], 1.0 for the B positives, then 0.0;
    edge_label_global: int64 [2, B * (1 + k)], the same pairs as global ids (``nodes[edge_label_index]``).
    """

    nodes: np.ndarray
    local_nodes: np.ndarray
    edge_index: np.ndarray
    num_sampled_nodes: np.ndarray
    num_sampled_edges: np.ndarray
    edge_label_index: np.ndarray
    edge_label: np.ndarray
    edge_label_global: np.ndarray

    @property
    def num_positives(self) -> int:
        return int(np.count_nonzero(self.edge_label))

    @property
    def num_seeds(self) -> int:
        return int(self.num_sampled_nodes[0])


def link_shuffle_key(seed: int, epoch: int) -> int:
    """The key that orders the training edges of ``epoch`` (a function of ``seed`` and ``epoch`` only)."""
    return int(batch_keys(seed, STREAM_LINK_SHUFFLE, epoch, 0, 0, 1)[0])


def _batch_size(batch_size: int) -> int:
    size = as_int("batch_size", batch_size)
    if size < 1:
        raise ValueError(f"batch_size: {size}, expected >= 1")
    return size


def _plan(order: np.ndarray, batch_ptr: np.ndarray, seed: int, stream: int, epoch: int) -> LinkEpochPlan:
    return LinkEpochPlan(order=order, batch_ptr=batch_ptr,
                         keys=batch_keys(seed, stream, epoch, 0, 0, len(batch_ptr) - 1))


def _even_cuts(num_items: int, batch_size: int) -> np.ndarray:
    return np.append(np.arange(0, num_items, batch_size, dtype=np.int64), np.int64(num_items))


def link_batch_plan(num_edges: int, batch_size: int, seed: int, epoch: int) -> LinkEpochPlan:
    """Epoch ``epoch``'s training plan over ``num_edges`` positive edges: every position once, in a seeded order.

    ``order = shuffle(arange(num_edges), link_shuffle_key(seed, epoch))``, cut into batches of
    ``batch_size`` (the last may be short); keys from ``STREAM_LINK_TRAIN``. The same arguments give
    the same plan.
    """
    count = as_int("num_edges", num_edges)
    if count < 0:
        raise ValueError(f"num_edges: {count} is negative")
    size = _batch_size(batch_size)
    order = shuffle(np.arange(count, dtype=np.int64), link_shuffle_key(seed, epoch))
    return _plan(order, _even_cuts(count, size), seed, STREAM_LINK_TRAIN, epoch)


def link_batch_plan_in_order(order: np.ndarray, batch_size: int, seed: int, epoch: int,
                             batch_ptr: np.ndarray | None = None) -> LinkEpochPlan:
    """A training plan over an explicit edge order (another sampler's, e.g. the COMET bucket order).

    ``order``: distinct non-negative edge positions, in batch order (kept as given). Without
    ``batch_ptr`` it is cut into batches of ``batch_size`` as ``link_batch_plan`` cuts; with it,
    batch b is ``order[batch_ptr[b]:batch_ptr[b + 1]]`` (pointers from 0 to len(order), each batch
    of 1..batch_size edges: ``batch_size`` stays the bound a slot is sized by). Batch b's key is
    ``link_batch_plan``'s key b, whatever the order.
    """
    edges = as_int_array("order", order, (np.int64,))
    size = _batch_size(batch_size)
    if edges.size and edges.min() < 0:
        raise ValueError(f"order: edge position {edges.min()} is negative")
    # an edge twice in one epoch would be trained twice and another never: refuse it (one sort per epoch)
    ordered = np.sort(edges)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size:
        raise ValueError(f"order: edge position {repeated[0]} occurs twice")
    if batch_ptr is None:
        cuts = _even_cuts(len(edges), size)
    else:
        cuts = as_int_array("batch_ptr", batch_ptr, (np.int64,))
        sizes = np.diff(cuts)
        if len(cuts) == 0 or cuts[0] != 0 or cuts[-1] != len(edges):
            raise ValueError(f"batch_ptr: expected pointers from 0 to len(order) = {len(edges)}")
        if sizes.size and (sizes.min() < 1 or sizes.max() > size):
            raise ValueError(f"batch_ptr: batch sizes must be in [1, batch_size = {size}], got "
                             f"{sizes.min()}..{sizes.max()}")
    return _plan(edges, cuts, seed, STREAM_LINK_TRAIN, epoch)


def link_eval_plan(num_edges: int, batch_size: int, seed: int, split: str) -> LinkEpochPlan:
    """Evaluation batches of one split's ``num_edges`` supervision edges: in order, no shuffle, keys of epoch 0.

    ``split`` is "val" or "test" (streams ``STREAM_LINK_VAL``, ``STREAM_LINK_TEST``); the negatives
    are drawn from the keys as in training, so every evaluation of a split sees the same negatives.
    """
    streams = {"val": STREAM_LINK_VAL, "test": STREAM_LINK_TEST}
    if split not in streams:
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    count = as_int("num_edges", num_edges)
    if count < 0:
        raise ValueError(f"num_edges: {count} is negative")
    size = _batch_size(batch_size)
    return _plan(np.arange(count, dtype=np.int64), _even_cuts(count, size), seed, streams[split], 0)


def _key(key: object) -> int:
    value = as_int("key", key)
    if not 0 <= value < _KEY_LIMIT:
        raise ValueError(f"key: {value} outside [0, 2^64)")
    return value


def _check_local(field: str, ids: np.ndarray, num_local: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= num_local):
        bad = ids[(ids < 0) | (ids >= num_local)][0]
        raise ValueError(f"{field}: local id {bad} outside [0, {num_local})")


def _negatives(num_local: int, num_positives: int, k: int, key: int, num_nodes: object,
               negative_pool: np.ndarray | None) -> np.ndarray:
    """The B * k negative targets t_m of the module docstring, as local ids of a graph of ``num_local`` nodes."""
    count = num_positives * k
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    # one-element arrays: numpy wraps array arithmetic mod 2^64 silently, scalar arithmetic warns
    negative_key = mix64_array(np.array([key], dtype=np.uint64))
    draws = mix64_array(negative_key + np.arange(1, count + 1, dtype=np.uint64) * _GAMMA)
    if negative_pool is None:
        span = as_int("num_nodes", num_nodes)
        if not 1 <= span <= num_local:
            raise ValueError(f"num_nodes: {span}, expected 1..{num_local} (the graph's nodes)")
        return (draws % np.uint64(span)).astype(np.int64)
    pool = as_int_array("negative_pool", negative_pool, (np.int64,))
    if pool.size == 0:
        raise ValueError("negative_pool: empty, expected at least one node to draw negatives from")
    targets = pool[(draws % np.uint64(len(pool))).astype(np.int64)]
    # only the drawn entries are checked: a pool of every resident node would cost a scan per batch
    _check_local("negative_pool", targets, num_local)
    return targets


def _seed_set(global_ids: np.ndarray | None, endpoints: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seeds as local ids sorted by global id, each endpoint's position among them); ``global_ids`` None:
    local ids are the dataset's."""
    if global_ids is None:
        seeds, inverse = np.unique(endpoints, return_inverse=True)
        return seeds.astype(np.int64, copy=False), inverse.reshape(-1).astype(np.int64, copy=False)
    _, first, inverse = np.unique(global_ids[endpoints], return_index=True, return_inverse=True)
    seeds = endpoints[first]
    inverse = inverse.reshape(-1)
    if not np.array_equal(seeds[inverse], endpoints):
        clash = endpoints[seeds[inverse] != endpoints][0]
        raise ValueError(f"global_ids: local node {clash} shares its global id with another node")
    return seeds, inverse


def _supervision_mask(edge_index: np.ndarray, pairs: np.ndarray, num_nodes: int) -> np.ndarray:
    """True for each edge of ``edge_index`` equal to a pair of ``pairs`` (2 x B positions) in either direction."""
    # one int64 code per ordered pair: positions are below num_nodes, and num_nodes^2 < 2^63 for any batch
    forward = pairs[0] * num_nodes + pairs[1]
    backward = pairs[1] * num_nodes + pairs[0]
    return np.isin(edge_index[0] * num_nodes + edge_index[1], np.concatenate((forward, backward)))


SeedSampler = Callable[[np.ndarray, int], SampledBatch]
"""(seeds as local ids, batch key) -> the seeds sampled as one batch of ``sample_pass`` with that key."""


def sample_link_batch(graph: CSCGraph, src: np.ndarray, dst: np.ndarray, num_nodes: int, fanouts: Sequence[int],
                      key: int, negatives_per_positive: int = 1, negative_pool: np.ndarray | None = None,
                      disjoint: bool = False) -> SampledLinkBatch:
    """Sample one link-prediction batch (the rules are in the module docstring).

    src, dst: the B positive pairs, local ids of ``graph``; num_nodes: negatives are uniform over
    local ids [0, num_nodes) (1 <= num_nodes <= graph.num_nodes; unused with a pool);
    fanouts: as ``sample_pass``'s; key: the batch's key (``LinkEpochPlan.batch``), uint64;
    negatives_per_positive: k >= 0; negative_pool: int64 local ids the negatives are drawn from
    uniformly by entry (a repeated entry is drawn more often); disjoint: drop the positives' own
    edges from message passing. Raises ValueError on bad input, naming the field.
    """
    if not isinstance(graph, CSCGraph):
        raise ValueError(f"graph: expected a CSCGraph, got {type(graph).__name__}")
    fanout_list = [as_int("fanouts", fanout) for fanout in fanouts]

    def sample(seeds: np.ndarray, batch_key: int) -> SampledBatch:
        return sample_pass(graph, seeds, len(seeds), fanout_list, np.array([batch_key], dtype=np.uint64)).batch(0)

    return sample_link_batch_by(sample, graph.num_nodes, graph.global_ids, src, dst, num_nodes, len(fanout_list),
                                key, negatives_per_positive, negative_pool, disjoint)


def sample_link_batch_by(sample: SeedSampler, num_local: int, global_ids: np.ndarray | None, src: np.ndarray,
                         dst: np.ndarray, num_nodes: int, num_hops: int, key: int, negatives_per_positive: int = 1,
                         negative_pool: np.ndarray | None = None, disjoint: bool = False) -> SampledLinkBatch:
    """``sample_link_batch`` over a graph of ``num_local`` nodes that ``sample`` samples (a daemon mode's sampler,
    which must give ``sample_pass``'s batch for the same seeds and key): the same batch, bitwise.

    global_ids: int64 dataset id per local id, or None where local ids are dataset ids (the full-graph modes);
    num_hops: the sampler's hops (``len(fanouts)``); the other arguments as ``sample_link_batch``'s.
    """
    src_ids = as_int_array("src", src, (np.int64,))
    dst_ids = as_int_array("dst", dst, (np.int64,))
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"src, dst: lengths {len(src_ids)} and {len(dst_ids)} differ")
    _check_local("src", src_ids, num_local)
    _check_local("dst", dst_ids, num_local)
    k = as_int("negatives_per_positive", negatives_per_positive)
    if k < 0:
        raise ValueError(f"negatives_per_positive: {k} is negative")
    batch_key = _key(key)
    positives = len(src_ids)

    label_src = np.tile(src_ids, 1 + k)
    label_dst = np.concatenate((dst_ids, _negatives(num_local, positives, k, batch_key, num_nodes, negative_pool)))
    seeds, inverse = _seed_set(global_ids, np.concatenate((label_src, label_dst)))
    edge_label_index = inverse.reshape(2, -1).astype(np.int64, copy=False)
    if positives:  # the seeds as one batch of a pass; an empty batch has no seed, and sample_pass no batch
        batch = sample(seeds, batch_key)
        local_nodes, edge_index = batch.nodes, batch.edge_index
        num_sampled_nodes, num_sampled_edges = batch.num_sampled_nodes, batch.num_sampled_edges
    else:
        local_nodes, edge_index = np.zeros(0, dtype=np.int64), np.zeros((2, 0), dtype=np.int64)
        num_sampled_nodes = np.zeros(num_hops + 1, dtype=np.int64)
        num_sampled_edges = np.zeros(num_hops, dtype=np.int64)
    if disjoint and edge_index.shape[1]:
        keep = ~_supervision_mask(edge_index, edge_label_index[:, :positives], len(local_nodes))
        hops = np.repeat(np.arange(num_hops), num_sampled_edges)
        edge_index = edge_index[:, keep]
        num_sampled_edges = np.bincount(hops[keep], minlength=num_hops).astype(np.int64)
    nodes = local_nodes if global_ids is None else global_ids[local_nodes]
    edge_label = np.zeros(edge_label_index.shape[1], dtype=np.float32)
    edge_label[:positives] = 1.0
    return SampledLinkBatch(nodes=nodes, local_nodes=local_nodes, edge_index=edge_index,
                            num_sampled_nodes=num_sampled_nodes, num_sampled_edges=num_sampled_edges,
                            edge_label_index=edge_label_index, edge_label=edge_label,
                            edge_label_global=nodes[edge_label_index])


def held_out_pairs(edges: np.ndarray, tails: np.ndarray) -> HeldPairs:
    """A split's positives (int64 (2, E) dataset ids) and negative tails (int64 (E, K)) as ``HeldPairs``: the
    in-memory trainer and the daemon evaluate the same nodes in the same order, so their scores agree."""
    nodes = np.unique(np.concatenate((edges.reshape(-1), tails.reshape(-1))))
    return HeldPairs(nodes, np.searchsorted(nodes, edges[0]), np.searchsorted(nodes, edges[1]),
                   np.searchsorted(nodes, tails))


@dataclass(frozen=True)
class PassLinkLabels:
    """The supervision pairs of a pass of link batches: batch b's are columns ``ptr[b]:ptr[b + 1]``.

    ptr: int64 [B + 1]; index: int64 (2, S), positions among each batch's seeds; label: float32 (S,); weight:
    float32 (S,), each pair's loss weight (``loader.sampling.negative_weights``), or None (all 1).
    """

    ptr: np.ndarray
    index: np.ndarray
    label: np.ndarray
    weight: np.ndarray | None = None

    def batch(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``b``'s ``edge_label_index`` and ``edge_label`` (views)."""
        begin, end = int(self.ptr[b]), int(self.ptr[b + 1])
        return self.index[:, begin:end], self.label[begin:end]

    def batch_weight(self, b: int) -> np.ndarray | None:
        """Batch ``b``'s pair weights (a view), or None."""
        if self.weight is None:
            return None
        return self.weight[int(self.ptr[b]):int(self.ptr[b + 1])]


def link_pass(batches: Sequence[SampledLinkBatch], num_hops: int, weights: Sequence[np.ndarray] | None = None
              ) -> tuple[SampledPass, PassLinkLabels]:
    """Link batches as one pass (``SampledPass``, local ids as ``SampledLinkBatch.local_nodes``) and their pairs,
    with ``weights`` (one float32 array per batch, a weight per pair) where given."""
    count = len(batches)
    node_ptr = np.zeros(count + 1, dtype=np.int64)
    edge_ptr = np.zeros(count + 1, dtype=np.int64)
    pair_ptr = np.zeros(count + 1, dtype=np.int64)
    node_ptr[1:] = np.cumsum([len(b.local_nodes) for b in batches])
    edge_ptr[1:] = np.cumsum([b.edge_index.shape[1] for b in batches])
    pair_ptr[1:] = np.cumsum([len(b.edge_label) for b in batches])

    def joined(parts: list[np.ndarray], empty: tuple[int, ...], dtype: type) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(empty, dtype=dtype)

    sampled = SampledPass(
        num_batches=count, num_hops=num_hops, node_ptr=node_ptr,
        nodes=joined([b.local_nodes for b in batches], (0,), np.int64), edge_ptr=edge_ptr,
        edge_src=joined([b.edge_index[0] for b in batches], (0,), np.int64),
        edge_dst=joined([b.edge_index[1] for b in batches], (0,), np.int64),
        num_sampled_nodes=np.stack([b.num_sampled_nodes for b in batches]) if count else
        np.zeros((0, num_hops + 1), dtype=np.int64),
        num_sampled_edges=np.stack([b.num_sampled_edges for b in batches]) if count else
        np.zeros((0, num_hops), dtype=np.int64))
    index = np.concatenate([b.edge_label_index for b in batches], axis=1) if count else np.zeros((2, 0), np.int64)
    label = joined([b.edge_label for b in batches], (0,), np.float32)
    weight = None if weights is None else joined(list(weights), (0,), np.float32)
    if weight is not None and len(weight) != len(label):
        raise ValueError(f"weights: {len(weight)} for {len(label)} pairs")
    return sampled, PassLinkLabels(pair_ptr, index, label, weight)


@dataclass(frozen=True)
class HeldOutShares:
    """How an evaluation stream of ``batches`` node batches over ``held.nodes`` carries the split's pairs: stream
    batch i carries positives ``[i * E // batches, (i + 1) * E // batches)`` (every positive once, in order);
    ``first``: the stream index of this pass's batch 0."""

    held: HeldPairs
    batches: int
    first: int = 0

    def batch(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``b`` of the pass: its pairs (int64 (2, m), positions into ``held.nodes``) and their tails (m, K)."""
        i, count = self.first + b, self.held.num_positives
        if not 0 <= i < self.batches:
            raise IndexError(f"batch {i} outside the stream's [0, {self.batches})")
        lo, hi = i * count // self.batches, (i + 1) * count // self.batches
        return np.stack((self.held.src[lo:hi], self.held.dst[lo:hi])), self.held.tails[lo:hi]
