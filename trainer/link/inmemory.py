"""Link-prediction batches from a prepared link dataset held in memory: the in-memory reference path.

Training (``--link-order shuffled``, the default): epoch e's batches are ``link_batch_plan(E_train,
batch_size, seed, e)`` over the positions of ``train_edges.npy``, each sampled by ``sample_link_batch``
over the whole graph (the loader's in-memory ``CSCGraph``, as ``--mode inmemory`` builds it for node
tasks), negatives drawn uniformly over every node. Features come from ``features.bin`` as the node
task's in-memory source reads them (one checked sequential read per partition), bag-of-words features straight
into their non-zeros (``trainer.inmemory_source.load_held``).

``--link-order comet|beta`` (with ``--buffer-partitions C``, ``--logical-partitions L`` for COMET)
trains in MariusGNN's partition buffer order, in memory, to measure what the order costs before a
daemon serves it: epoch e follows ``buffer_epoch(buffer_plan(order, P, C, L, seed, e), ...)``
(``loader/sampling/buffer_order.py``), state by state, and a state's batches see only the buffer, as
they would out of core: negatives drawn from the resident partitions' nodes and neighbours sampled
on the subgraph they induce (``induced_by_ranges``, built once per state). Evaluation still samples
the whole graph, as MariusGNN evaluates.

Evaluation of a split embeds the nodes its scores need, the union of the held-out sources, targets
and negative tails, in sorted order, with node batches of ``eval_batch_size`` sampled with
``eval_fanouts`` and the keys of ``eval_split_batches`` on the split's link stream
(``STREAM_LINK_VAL``/``STREAM_LINK_TEST``): the node task's evaluation plan over those nodes, so every
evaluation of a split samples the same neighbourhoods. Message passing uses the prepared graph, which
holds the training edges only (the held-out positives were removed from it by ``import``), for val
and test alike.
"""

from collections.abc import Generator, Iterator, Sequence
from typing import cast

import numpy as np
import torch

from loader.format.dataset import Dataset
from loader.format.link import HELD_OUT, read_edge_buckets, read_link_tables
from loader.sampling.buffer_order import (
    ASSIGNMENTS,
    LINK_ORDERS,
    Assignment,
    BufferEpoch,
    BufferState,
    LinkOrder,
    buffer_epoch,
    buffer_plan,
    resolved_logical,
)
from loader.sampling.comet import logical_capacity
from loader.sampling.induced import induced_by_ranges, local_in_ranges
from loader.sampling.inmemory import InMemoryGraph, eval_split_batches
from loader.sampling.link_sampling import (
    STREAM_LINK_TEST,
    STREAM_LINK_VAL,
    SampledLinkBatch,
    held_out_pairs,
    link_batch_plan,
    link_rank_key,
    sample_link_batch,
)
from loader.sampling.negative_weights import link_batch_weights
from loader.sampling.ranks import check_rank, even_piece
from loader.sampling.sampling import CSCGraph, sample_pass
from proto.errors import UserError
from proto.held_pairs import HeldPairs
from trainer.inmemory_source import batch_rows, checked_fanouts, load_held
from trainer.link.batches import BufferSettings, LinkBatch, NodeBatch

__all__ = ["LinkInMemorySource", "EVAL_CHUNK_BATCHES"]

EVAL_CHUNK_BATCHES = 64
"""Evaluation batches sampled per ``sample_pass`` call: bounds the sampled-but-unconsumed memory."""

_EVAL_STREAMS = {"val": STREAM_LINK_VAL, "test": STREAM_LINK_TEST}


class LinkInMemorySource:
    """The batches of a link-prediction run over ``dataset`` (a prepared dataset whose task is ``link``).

    batch_size: training positives per batch; negatives: training negatives per positive (k >= 1);
    disjoint: drop each batch's positive edges from its own message passing (``sample_link_batch``);
    fanouts, eval_fanouts (default: ``fanouts``), eval_batch_size (nodes per evaluation batch), seed:
    as the node task's in-memory source; link_order: "shuffled" or a buffer order ("comet", "beta"), which
    needs buffer_partitions C (2 <= C < the dataset's partitions) and, for COMET, takes logical_partitions
    (None: MariusGNN's default). rank, world_size (default 0 of 1): this process's share under several
    ranks: global training batches of ``batch_size`` x world_size positives, of which rank r trains the r-th of
    world_size even, contiguous pieces (``even_piece``: the r-th ``batch_size`` of a full batch; an empty piece
    where a batch has fewer positives than ranks; rank 0 of 1 is the single process exactly), in
    a buffer order too: its states are cut into global batches, so every rank steps through the same states.
    negative_weights: weigh each negative of a buffer order by ``loader.sampling.negative_weights`` (its batches
    carry ``edge_weight``). assignment: how a COMET epoch gives its states their edges (``buffer_epoch``'s, the
    daemon's ``[link] assignment``). A dataset that is not a link dataset, or whose link files do not fit its manifest,
    and a buffer the dataset's partitions do not allow, are UserErrors.
    """

    balanced_batches = True
    """``buffer_epoch(balanced=...)``: each state cut into even batches (bench/link_variants.py's
    ``comet-tail-batches`` turns it off to measure the cut it replaced)."""

    def __init__(self, dataset: Dataset, *, batch_size: int = 1024, negatives: int = 1, disjoint: bool = False,
                 fanouts: Sequence[int] = (10, 5), eval_fanouts: Sequence[int] | None = None,
                 eval_batch_size: int = 1024, seed: int = 0, link_order: str = "shuffled",
                 buffer_partitions: int | None = None, logical_partitions: int | None = None, rank: int = 0,
                 world_size: int = 1, negative_weights: bool = False, assignment: str = "edge") -> None:
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size),
                            ("negatives", negatives)):
            if value <= 0:
                raise UserError(f"{name} must be positive, got {value}")
        if seed < 0:
            raise UserError(f"sampler seed must be non-negative, got {seed}")
        link = dataset.manifest.link
        if link is None:
            raise UserError(f"{dataset.path}: a node-classification dataset; --task link needs one imported with "
                            f"--task link (megabatch import --task link, then prepare)")
        self.fanouts = checked_fanouts("fanouts", fanouts)
        self.eval_fanouts = checked_fanouts("eval_fanouts", self.fanouts if eval_fanouts is None else eval_fanouts)
        if len(self.eval_fanouts) != len(self.fanouts):
            raise UserError(f"eval_fanouts {list(self.eval_fanouts)} needs one entry per hop "
                            f"({len(self.fanouts)}, as fanouts {list(self.fanouts)})")
        try:
            check_rank(rank, world_size)
        except ValueError as err:
            raise UserError(str(err)) from None
        self.rank, self.world_size = rank, world_size
        # before the dataset is read: a buffer it cannot take is refused at once
        self.buffer = self._buffer_settings(dataset, link_order, buffer_partitions, logical_partitions)
        self.link_order = cast(LinkOrder, link_order)  # one of LINK_ORDERS: _buffer_settings refuses the others
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.negatives, self.disjoint = negatives, disjoint
        if negative_weights and self.buffer is None:
            raise UserError("--negative-weights: weighs a buffer order's negatives (--link-order comet or beta)")
        self.negative_weights = negative_weights
        if assignment not in ASSIGNMENTS:
            raise UserError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {assignment!r}")
        self.assignment = cast(Assignment, assignment)
        # bag-of-words features as their non-zeros: a batch's rows gathered as CSR, not as mostly zeros
        self.data: InMemoryGraph
        self.data, self.sparse = load_held(dataset)
        n = self.data.num_nodes
        tables = read_link_tables(dataset, link, n)
        self.train_edges = tables.train_edges
        self.held_out: dict[str, HeldPairs] = {}
        for split in HELD_OUT:
            self.held_out[split] = held_out_pairs(tables.held_edges[split], tables.held_tails[split])
        self.num_nodes = n
        self.num_features = self.data.feat_dim
        self.num_hops = len(self.fanouts)
        self.eval_negatives = link.eval_negatives
        self._epoch: BufferEpoch | None = None  # the last epoch's order: the loop asks for its plan after it
        if self.buffer is not None:
            self.partitions = dataset.partitions()
            self.edge_buckets = read_edge_buckets(dataset, link, self.buffer.physical_partitions)
        order = "" if self.buffer is None else f", {link_order} order"
        held = "" if self.sparse is None else f", {self.sparse.summary}"
        self.description = f"inmemory {dataset.path} (link{order}{held})"

    @staticmethod
    def _buffer_settings(dataset: Dataset, order: str, capacity: int | None, logical: int | None
                         ) -> BufferSettings | None:
        """The resolved buffer of a buffer order (None for "shuffled"); UserError for one the dataset cannot take."""
        if order not in LINK_ORDERS:
            raise UserError(f"link order must be one of {', '.join(LINK_ORDERS)}, got {order!r}")
        if order == "shuffled":
            if capacity is not None or logical is not None:
                raise UserError("--buffer-partitions, --logical-partitions: only with --link-order comet or beta")
            return None
        if capacity is None:
            raise UserError(f"--link-order {order} needs --buffer-partitions C (the partitions resident at once)")
        if order == "beta" and logical is not None:
            raise UserError("--logical-partitions: BETA swaps physical partitions (--link-order comet takes it)")
        p = dataset.manifest.num_partitions
        if not 2 <= capacity < p:
            raise UserError(f"--buffer-partitions {capacity}: a buffer must hold at least 2 and fewer than the "
                            f"dataset's {p} partitions (prepare --partitions sets them)")
        try:
            resolved = resolved_logical(cast(LinkOrder, order), p, capacity, logical)
            held = capacity if order == "beta" else logical_capacity(p, capacity, resolved)
        except ValueError as err:
            raise UserError(f"--logical-partitions {logical}: {err}") from None
        return BufferSettings(order, capacity, p, resolved, held)

    @property
    def train_positives(self) -> int:
        return int(self.train_edges.shape[1])

    def positives(self, split: str) -> int:
        """Held-out positives of ``split`` ("val" or "test")."""
        return self.held_out[split].num_positives

    def close(self) -> None:
        """Nothing to release (the graph is the process's memory)."""

    def buffer_epoch(self, epoch: int) -> BufferEpoch:
        """Epoch ``epoch`` in the buffer order (the last one asked for is kept: the loop asks again after it)."""
        if self.buffer is None:
            raise ValueError("a shuffled run has no buffer order")
        if self._epoch is None or self._epoch.plan.epoch != epoch:
            plan = buffer_plan(self.link_order, self.buffer.physical_partitions, self.buffer.capacity,
                               None if self.link_order == "beta" else self.buffer.logical_partitions, self.seed,
                               epoch)
            # cut into global batches: rank r trains the r-th even piece of each (_buffer_batches)
            self._epoch = buffer_epoch(plan, self.edge_buckets, self.partitions, self.batch_size * self.world_size,
                                       balanced=self.balanced_batches, assignment=self.assignment)
        return self._epoch

    def train_batches(self, epoch: int) -> Generator[LinkBatch, None, None]:
        """Epoch ``epoch``'s training batches (the same epoch gives the same batches)."""
        if self.buffer is not None:
            yield from self._buffer_batches(epoch)
            return
        size, rank, several = self.batch_size, self.rank, self.world_size > 1
        plan = link_batch_plan(self.train_positives, size * self.world_size, self.seed, epoch)
        total = plan.num_batches
        for b in range(total):
            positions, key = plan.batch(b)
            whole = len(positions) if several else None
            lo, hi = even_piece(len(positions), self.world_size, rank)
            piece = positions[lo:hi]  # all of it for a single process
            if not len(piece):
                yield self._empty_link_batch(whole, total)  # DDP's all-reduce needs this rank's step too
                continue
            sampled = sample_link_batch(self.data.graph, self.train_edges[0, piece], self.train_edges[1, piece],
                                        self.num_nodes, self.fanouts, link_rank_key(self.seed, epoch, rank, b, key),
                                        negatives_per_positive=self.negatives, disjoint=self.disjoint)
            yield self._link_batch(sampled, len(piece), total, whole)

    def _empty_link_batch(self, global_positives: int | None, stream_batches: int) -> LinkBatch:
        hops = len(self.fanouts)
        no_edges = torch.zeros((2, 0), dtype=torch.long)
        graph = NodeBatch(torch.zeros((0, self.num_features), dtype=torch.float32), no_edges, [0] * (hops + 1),
                          [0] * hops, torch.zeros(0, dtype=torch.long))
        # a weighted buffer order's empty piece carries its (empty) weights, as the daemon's does
        weight = torch.zeros(0, dtype=torch.float32) if self.negative_weights else None
        return LinkBatch(graph, torch.zeros((2, 0), dtype=torch.long), torch.zeros(0, dtype=torch.float32), 0,
                         global_positives, stream_batches, weight)

    def _buffer_batches(self, epoch: int) -> Generator[LinkBatch, None, None]:
        """The states of the epoch's plan in order, each state's batches over the subgraph of its buffer: this
        rank's piece of each global batch, as the shuffled order deals them (``link_rank_key``)."""
        order = self.buffer_epoch(epoch)
        rank, several = self.rank, self.world_size > 1
        for state in order.states:
            if not state.num_batches:  # a state that trains nothing builds no subgraph
                continue
            graph, src, dst, pool = self._state_view(epoch, state)
            first = int(order.state_batches[state.index])
            for k in range(state.num_batches):
                begin, end = int(state.batch_ptr[k]), int(state.batch_ptr[k + 1])
                _, key = order.batches.batch(first + k)
                whole = end - begin if several else None
                lo, hi = (begin + offset for offset in even_piece(end - begin, self.world_size, rank))
                if lo == hi:
                    yield self._empty_link_batch(whole, order.num_batches)  # DDP's all-reduce needs this step too
                    continue
                sampled = sample_link_batch(graph, src[lo:hi], dst[lo:hi], graph.num_nodes, self.fanouts,
                                            link_rank_key(self.seed, epoch, rank, first + k, key),
                                            negatives_per_positive=self.negatives, negative_pool=pool,
                                            disjoint=self.disjoint)
                weight = link_batch_weights(sampled, self.partitions, graph.num_nodes) if self.negative_weights \
                    else None
                yield self._link_batch(sampled, hi - lo, order.num_batches, whole, weight)

    def _state_view(self, epoch: int, state: BufferState
                    ) -> tuple[CSCGraph, np.ndarray, np.ndarray, np.ndarray | None]:
        """What a state's batches are sampled from: (the graph, the state's positives' endpoints as its local ids,
        the negative pool as its local ids, None for every node of it): the subgraph its buffer induces and every
        node of the buffer (bench/link_variants.py overrides this to take COMET apart)."""
        graph = induced_by_ranges(self.data.graph, state.node_begin, state.node_end)
        # every node of the buffer, once: the negatives a state may draw (local ids are 0..M-1 by construction)
        pool = np.arange(graph.num_nodes, dtype=np.int64)
        src = local_in_ranges(self.train_edges[0, state.order], state.node_begin, state.node_end)
        dst = local_in_ranges(self.train_edges[1, state.order], state.node_begin, state.node_end)
        return graph, src, dst, pool

    def _link_batch(self, sampled: SampledLinkBatch, positives: int, stream_batches: int,
                    global_positives: int | None = None, weight: np.ndarray | None = None) -> LinkBatch:
        # rows by dataset id (``nodes``): in a buffer's subgraph the sampler's local ids are not the dataset's
        graph = NodeBatch(self._rows(sampled.nodes), torch.from_numpy(sampled.edge_index),
                          [int(v) for v in sampled.num_sampled_nodes], [int(v) for v in sampled.num_sampled_edges],
                          torch.from_numpy(sampled.nodes))
        return LinkBatch(graph, torch.from_numpy(sampled.edge_label_index), torch.from_numpy(sampled.edge_label),
                         positives, global_positives, stream_batches,
                         None if weight is None else torch.from_numpy(weight))

    def eval_batches(self, split: str) -> Iterator[NodeBatch]:
        """Node batches over ``held_out[split].nodes`` in order: batch b's seeds are its nodes
        ``[b * eval_batch_size, (b + 1) * eval_batch_size)``."""
        nodes = self.held_out[split].nodes
        plan = eval_split_batches(nodes, self.eval_batch_size, self.seed, _EVAL_STREAMS[split])
        total = len(plan.keys)
        size = self.eval_batch_size
        for first in range(0, total, EVAL_CHUNK_BATCHES):
            keys = plan.keys[first:first + EVAL_CHUNK_BATCHES]
            seeds = plan.seeds[first * size:(first + len(keys)) * size]
            # keys are per batch: sampling in chunks gives the batches of one whole-split call
            sampled = sample_pass(self.data.graph, seeds, size, self.eval_fanouts, keys)
            for b in range(sampled.num_batches):
                batch = sampled.batch(b)
                yield NodeBatch(self._rows(batch.nodes), torch.from_numpy(batch.edge_index),
                                [int(v) for v in batch.num_sampled_nodes], [int(v) for v in batch.num_sampled_edges],
                                torch.from_numpy(self.data.graph.global_ids[batch.nodes]))

    def _rows(self, nodes: np.ndarray) -> torch.Tensor:
        return batch_rows(self.data, self.sparse, nodes)
