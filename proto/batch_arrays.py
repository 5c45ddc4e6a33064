"""One batch in a slot: its arrays by name, how the daemon lays them out, and what a reader checks.

proto/PROTOCOL.md, "Batch arrays" and "Batches for a client with a feature cache", is the contract;
this module is its only implementation. The daemon sizes a batch (``BatchShape``), opens a slot
for it (``open_batch``: writable views as ``BatchArrays``), fills the arrays in place and commits;
the trainer turns a committed slot's views into ``BatchArrays.read``, which refuses a batch whose
arrays contradict each other before any of them reaches a tensor.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from proto.errors import SlotError
from proto.messages import BatchId
from proto.slots import ArraySpec, SlotPlacement, SlotRing, place_arrays

__all__ = ["BatchShape", "BatchArrays", "OpenBatch", "open_batch"]

_INT64 = np.dtype(np.int64)
_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)


@dataclass(frozen=True)
class BatchShape:
    """The sizes that fix a batch's arrays."""

    num_nodes: int
    num_seeds: int
    num_edges: int
    num_hops: int
    feat_dim: int
    feat_dtype: np.dtype
    shipped_rows: int | None = None
    """A batch for a client with a feature cache: ``x`` holds only this many rows, and the batch
    carries ``hit_slot`` and an update of ``num_updates`` rows. None (default): every row, no cache arrays."""
    num_updates: int = 0
    aggregated: bool = False
    """The batch carries ``x_agg``: a row of the dataset's aggregation cache per node, in the feature dtype."""
    num_classes: int = 0
    """The batch carries ``class_weight`` (float32, one per class) where > 0."""
    seed_groups: bool = False
    """The batch carries ``seed_group`` (int32, one per seed): its seeds' micro-batch groups."""
    pairs: str = ""
    """A link-prediction batch's supervision pairs: "train" (``edge_label_index`` and ``edge_label``: pairs among
    the seeds), "eval" (``pair_index`` and ``pair_tails``: held-out pairs of the split's nodes); "" none."""
    num_pairs: int = 0
    """Pairs the batch carries (with ``pairs``)."""
    num_tails: int = 0
    """Negative tails per evaluation pair (``pairs = "eval"``)."""
    pair_weights: bool = False
    """A training batch's pairs carry ``edge_weight`` (float32, one per pair): their loss weights."""

    def specs(self) -> list[ArraySpec]:
        rows = self.num_nodes if self.shipped_rows is None else self.shipped_rows
        specs = [ArraySpec("x", self.feat_dtype, (rows, self.feat_dim)),
                 ArraySpec("n_id", _INT64, (self.num_nodes,)),
                 ArraySpec("y", _INT64, (self.num_seeds,)),
                 ArraySpec("edge_index", _INT64, (2, self.num_edges)),
                 ArraySpec("nodes_per_hop", _INT64, (self.num_hops + 1,)),
                 ArraySpec("edges_per_hop", _INT64, (self.num_hops,))]
        if self.aggregated:
            specs.append(ArraySpec("x_agg", self.feat_dtype, (self.num_nodes, self.feat_dim)))
        if self.num_classes:
            specs.append(ArraySpec("class_weight", _FLOAT32, (self.num_classes,)))
        if self.seed_groups:
            specs.append(ArraySpec("seed_group", _INT32, (self.num_seeds,)))
        if self.pairs == "train":
            specs += [ArraySpec("edge_label_index", _INT64, (2, self.num_pairs)),
                      ArraySpec("edge_label", _FLOAT32, (self.num_pairs,))]
            if self.pair_weights:
                specs.append(ArraySpec("edge_weight", _FLOAT32, (self.num_pairs,)))
        elif self.pairs == "eval":
            specs += [ArraySpec("pair_index", _INT64, (2, self.num_pairs)),
                      ArraySpec("pair_tails", _INT64, (self.num_pairs, self.num_tails))]
        elif self.pairs:
            raise ValueError(f"pairs: {self.pairs!r}, expected 'train', 'eval' or ''")
        if self.shipped_rows is not None:
            specs += [ArraySpec("hit_slot", _INT32, (self.num_nodes,)),
                      ArraySpec("upd_slot", _INT32, (self.num_updates,)),
                      ArraySpec("upd_pos", _INT32, (self.num_updates,))]
        return specs

    @property
    def payload_bytes(self) -> int:
        return sum(spec.nbytes for spec in self.specs())


@dataclass(frozen=True)
class BatchArrays:
    """The arrays of one batch (views of a slot; PyG's names but for the two per-hop counts)."""

    x: np.ndarray
    """(n, D) feature rows of ``n_id`` in order; with a cache plan, (k, D): only the rows with ``hit_slot < 0``."""
    n_id: np.ndarray
    """int64 (n,) dataset ids: seeds first, then the nodes first reached at hop 1, 2, ..."""
    y: np.ndarray
    """int64 (seeds,) labels of the seeds (-1 = unlabeled)."""
    edge_index: np.ndarray
    """int64 (2, E) batch-local positions: row 0 source (sampled neighbour), row 1 target."""
    nodes_per_hop: np.ndarray
    """int64 (L+1,), PyG's ``num_sampled_nodes``."""
    edges_per_hop: np.ndarray
    """int64 (L,), PyG's ``num_sampled_edges``."""
    hit_slot: np.ndarray | None = None
    """int32 (n,): the client cache slot of each node's row, -1 = the next row of ``x``."""
    upd_slot: np.ndarray | None = None
    """int32 (u,): cache slots to overwrite after assembly."""
    upd_pos: np.ndarray | None = None
    """int32 (u,): for each, the row of the assembled batch to copy in."""
    x_agg: np.ndarray | None = None
    """(n, D) in the feature dtype: each node's row of the dataset's aggregation cache (its features aggregated
    over all its in-neighbours), for a model's first layer; None where the batch samples every hop."""
    class_weight: np.ndarray | None = None
    """float32 (C,): the weight of each class in the batch's loss (``[hierarchy] label_prior_loss``); None: 1."""
    seed_group: np.ndarray | None = None
    """int32 (seeds,): each seed's micro-batch group, 0..K-1 (``Hello.micro_batches`` = K); None: not grouped."""
    edge_label_index: np.ndarray | None = None
    """int64 (2, S): a link-prediction training batch's supervision pairs as positions among its seeds, positives
    first (PyG's ``LinkNeighborLoader``); None: a node batch."""
    edge_label: np.ndarray | None = None
    """float32 (S,): 1 for each positive pair of ``edge_label_index``, 0 for each negative."""
    edge_weight: np.ndarray | None = None
    """float32 (S,): each pair's weight in the loss (a buffer order's weighted negatives); None: all 1."""
    pair_index: np.ndarray | None = None
    """int64 (2, S): a link-prediction evaluation batch's share of its split's held-out positives, as positions
    into the split's nodes (the seeds of its evaluation batches, concatenated in stream order)."""
    pair_tails: np.ndarray | None = None
    """int64 (S, K): each of those positives' fixed negative tails, positions as ``pair_index``'s."""

    @property
    def has_cache_plan(self) -> bool:
        return self.hit_slot is not None

    @classmethod
    def from_views(cls, views: Mapping[str, np.ndarray]) -> "BatchArrays":
        """Writer side: the views ``SlotRing.arrays_for`` made from ``BatchShape.specs`` (no checks needed)."""
        return cls(x=views["x"], n_id=views["n_id"], y=views["y"], edge_index=views["edge_index"],
                   nodes_per_hop=views["nodes_per_hop"], edges_per_hop=views["edges_per_hop"],
                   hit_slot=views.get("hit_slot"), upd_slot=views.get("upd_slot"), upd_pos=views.get("upd_pos"),
                   x_agg=views.get("x_agg"), class_weight=views.get("class_weight"), seed_group=views.get("seed_group"),
                   edge_label_index=views.get("edge_label_index"), edge_label=views.get("edge_label"),
                   edge_weight=views.get("edge_weight"), pair_index=views.get("pair_index"),
                   pair_tails=views.get("pair_tails"))

    @classmethod
    def read(cls, views: Mapping[str, np.ndarray], feature_cache_rows: int) -> "BatchArrays":
        """Reader side: the arrays of a committed slot, checked against each other; ``SlotError`` naming the
        first contradiction. ``feature_cache_rows``: the session's client cache (0 = none).

        Vectorized and O(n + E); run on the host, where the slot is: on a GPU a bad index is an
        asynchronous device assert, not an error naming the batch.
        """
        for name in ("x", "n_id", "y", "edge_index", "nodes_per_hop", "edges_per_hop"):
            if name not in views:
                raise SlotError(f"batch has no {name!r} array")
        arrays = cls.from_views(views)
        for name in ("n_id", "y", "edge_index", "nodes_per_hop", "edges_per_hop"):
            if getattr(arrays, name).dtype != _INT64:
                raise SlotError(f"{name}: dtype {getattr(arrays, name).dtype}, expected int64")
        nodes, edges = arrays.nodes_per_hop, arrays.edges_per_hop
        if nodes.ndim != 1 or edges.ndim != 1 or len(nodes) != len(edges) + 1:
            raise SlotError(f"nodes_per_hop {nodes.shape} and edges_per_hop {edges.shape}: expected (L+1,) and (L,)")
        n, seeds = len(arrays.n_id), int(nodes[0]) if len(nodes) else 0
        if arrays.n_id.ndim != 1 or int(nodes.sum()) != n or (nodes < 0).any():
            raise SlotError(f"n_id has {n} nodes, nodes_per_hop {nodes.tolist()}")
        if arrays.y.shape != (seeds,):
            raise SlotError(f"y has shape {arrays.y.shape}, expected ({seeds},) for {seeds} seeds")
        e = arrays.edge_index
        if e.ndim != 2 or e.shape[0] != 2 or int(edges.sum()) != e.shape[1] or (edges < 0).any():
            raise SlotError(f"edge_index has shape {e.shape}, edges_per_hop {edges.tolist()}")
        if e.size and (e.min() < 0 or e.max() >= n):
            raise SlotError(f"edge_index holds a position outside [0, {n})")
        if arrays.x.ndim != 2:
            raise SlotError(f"x has shape {arrays.x.shape}, expected (rows, features)")
        agg = arrays.x_agg
        if agg is not None and (agg.shape != (n, arrays.x.shape[1]) or agg.dtype != arrays.x.dtype):
            raise SlotError(f"x_agg has shape {agg.shape} and dtype {agg.dtype}, expected ({n}, "
                            f"{arrays.x.shape[1]}) and x's {arrays.x.dtype}")
        weight = arrays.class_weight
        if weight is not None:
            if weight.ndim != 1 or weight.dtype != _FLOAT32 or not np.isfinite(weight).all() or (weight < 0).any():
                raise SlotError(f"class_weight: expected finite, non-negative float32 (classes,), got {weight.dtype} "
                                f"{weight.shape}")
            labelled = arrays.y[arrays.y >= 0]
            if labelled.size and int(labelled.max()) >= len(weight):
                raise SlotError(f"class_weight has {len(weight)} classes, a seed is labelled {int(labelled.max())}")
        group = arrays.seed_group
        if group is not None and (group.shape != (seeds,) or group.dtype != _INT32 or (group.size and group.min() < 0)):
            raise SlotError(f"seed_group: expected non-negative int32 ({seeds},), got {group.dtype} {group.shape}")
        arrays._check_pairs(seeds)
        if arrays.hit_slot is None:
            if arrays.x.shape[0] != n:
                raise SlotError(f"x has {arrays.x.shape[0]} rows for {n} nodes")
            return arrays
        arrays._check_cache_plan(feature_cache_rows)
        return arrays

    def _check_pairs(self, seeds: int) -> None:
        """Refuse link-prediction pairs that would index outside the seeds (training) or be negative (evaluation)."""
        index, label = self.edge_label_index, self.edge_label
        if (index is None) != (label is None):
            raise SlotError("a link-prediction training batch needs both edge_label_index and edge_label")
        if index is not None and label is not None:
            if index.dtype != _INT64 or index.ndim != 2 or index.shape[0] != 2:
                raise SlotError(f"edge_label_index: expected int64 (2, pairs), got {index.dtype} {index.shape}")
            if label.dtype != _FLOAT32 or label.shape != (index.shape[1],):
                raise SlotError(f"edge_label: expected float32 ({index.shape[1]},), got {label.dtype} {label.shape}")
            if index.size and (index.min() < 0 or index.max() >= seeds):
                raise SlotError(f"edge_label_index holds a position outside the {seeds} seeds")
        weight = self.edge_weight
        if weight is not None:
            if label is None:
                raise SlotError("edge_weight without the training pairs it weighs (edge_label_index)")
            if weight.dtype != _FLOAT32 or weight.shape != label.shape:
                raise SlotError(f"edge_weight: expected float32 {label.shape}, got {weight.dtype} {weight.shape}")
            if weight.size and not (np.isfinite(weight).all() and weight.min() >= 0):
                raise SlotError("edge_weight holds a negative or non-finite weight")
        pairs, tails = self.pair_index, self.pair_tails
        if (pairs is None) != (tails is None):
            raise SlotError("a link-prediction evaluation batch needs both pair_index and pair_tails")
        if pairs is not None and tails is not None:
            if pairs.dtype != _INT64 or pairs.ndim != 2 or pairs.shape[0] != 2:
                raise SlotError(f"pair_index: expected int64 (2, pairs), got {pairs.dtype} {pairs.shape}")
            if tails.dtype != _INT64 or tails.ndim != 2 or tails.shape[0] != pairs.shape[1]:
                raise SlotError(f"pair_tails: expected int64 ({pairs.shape[1]}, tails), got {tails.dtype} "
                                f"{tails.shape}")
            if (pairs.size and pairs.min() < 0) or (tails.size and tails.min() < 0):
                raise SlotError("pair_index or pair_tails holds a negative position")

    def _check_cache_plan(self, rows: int) -> None:
        """Refuse a cache plan that would index out of range or leave a row unwritten."""
        hit, slots, pos = self.hit_slot, self.upd_slot, self.upd_pos
        assert hit is not None
        if rows == 0:
            raise SlotError("the daemon sent a feature cache plan, but this session has no feature cache")
        if slots is None or pos is None or hit.dtype != _INT32 or slots.dtype != _INT32 or pos.dtype != _INT32:
            raise SlotError("a feature cache plan needs int32 hit_slot, upd_slot and upd_pos arrays")
        n = len(self.n_id)
        if hit.shape != (n,):
            raise SlotError(f"hit_slot has shape {hit.shape}, expected ({n},)")
        if hit.size and (hit.min() < -1 or hit.max() >= rows):
            raise SlotError(f"hit_slot outside [-1, {rows})")
        if slots.shape != pos.shape or (slots.size and (slots.min() < 0 or slots.max() >= rows
                                                        or pos.min() < 0 or pos.max() >= n)):
            raise SlotError(f"upd_slot/upd_pos: shapes {slots.shape}/{pos.shape}, or outside [0, {rows})/[0, {n})")
        shipped = int(np.count_nonzero(hit < 0))
        if self.x.shape[0] != shipped:
            raise SlotError(f"x has {self.x.shape[0]} rows, the cache plan ships {shipped}")


@dataclass(frozen=True)
class OpenBatch:
    """A slot being written: fill ``arrays`` in place, then ``commit``."""

    ring: SlotRing
    slot: int
    layout: SlotPlacement
    arrays: BatchArrays

    def commit(self, batch_id: BatchId) -> int:
        """Publish the slot (``SlotRing.commit``); returns the bytes of its arrays (padding excluded)."""
        self.ring.commit(self.slot, batch_id, self.layout)
        return sum(a.nbytes for a in self.layout.arrays)


def open_batch(ring: SlotRing, slot: int, shape: BatchShape) -> OpenBatch:
    """Lay ``shape``'s arrays out in ``slot`` (invalidating what it held); ``SlotOverflow`` if they do not fit."""
    layout = place_arrays(shape.specs(), ring.slot_bytes, ring.header_bytes)
    return OpenBatch(ring, slot, layout, BatchArrays.from_views(ring.arrays_for(slot, layout)))
