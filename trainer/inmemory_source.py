"""The in-memory reference source: the whole dataset in RAM, neighbour sampling per epoch ("NS").

The baseline the loader daemon is measured against (HierBatching's "NS"): every epoch visits
all training nodes in a fresh random order, each batch sampled from the full graph. Batches
come from the same sampler, keys and evaluation plans as the daemon's, so the two modes differ
only in which neighbours are visible to a batch (all of them here).

Under DDP each rank holds its own source (``rank`` of ``world_size``), which yields that rank's share
only: its piece of every global batch (``loader.sampling.ranks.deal_epoch``; an empty batch where the
last global batch left it no seed) and every ``world_size``-th evaluation batch.
"""

from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from loader.format.aggregates import read_aggregates
from loader.format.dataset import Dataset, open_dataset
from loader.sampling.inmemory import (
    EpochBatches,
    InMemoryGraph,
    checked_feature_ranges,
    eval_split_batches,
    load_in_memory,
    num_batches,
    read_features,
    split_stream,
)
from loader.sampling.ranks import check_rank, deal_epoch, deal_eval
from loader.sampling.sampling import SampledBatch, sample_pass
from proto.errors import UserError
from trainer.batch import Batch
from trainer.source import BatchSource, SourceInfo
from trainer.sparse_features import MAX_DENSITY, SparseFeatures, sparse_feature_ranges

__all__ = ["InMemorySource", "DEFAULT_CHUNK_BATCHES", "batch_rows", "load_held", "checked_fanouts", "float32_rows"]

DEFAULT_CHUNK_BATCHES = 256
"""Batches sampled per ``sample_pass`` call: bounds the sampled-but-unconsumed memory."""


def checked_fanouts(name: str, values: Sequence[int]) -> tuple[int, ...]:
    """``values`` as fanouts (positive, or -1 for every neighbour); a one-line UserError naming ``name`` otherwise."""
    out = tuple(int(v) for v in values)
    if not out or any(v == 0 or v < -1 for v in out):
        raise UserError(f"{name} must be a non-empty list of positive integers or -1 (all neighbours), "
                        f"got {list(out)}")
    return out


def float32_rows(rows: np.ndarray) -> torch.Tensor:
    """``rows`` as a float32 tensor (float16 rows widened; the model's weights are float32)."""
    return torch.from_numpy(rows if rows.dtype == np.float32 else rows.astype(np.float32))


def batch_rows(data: InMemoryGraph, held: SparseFeatures | None, nodes: np.ndarray) -> torch.Tensor:
    """The feature rows of ``nodes``: a sparse CSR tensor from ``held`` (features held sparse), else dense
    float32 from ``data``."""
    return float32_rows(data.feature_rows(nodes)) if held is None else held.rows(nodes)


def load_held(dataset: Dataset, hold_sparse: bool = True,
              max_density: float = MAX_DENSITY) -> tuple[InMemoryGraph, SparseFeatures | None]:
    """``dataset`` in memory, with its features held sparse where ``hold_sparse`` and they are float32 values at most
    ``max_density`` non-zero: read partition by partition into the CSR (the graph's ``features`` are then None),
    never as the dense matrix. Otherwise, or where the scan finds them too dense, the dense matrix (read again from
    the start in that case: the scan stops at the first partition past the share)."""
    manifest = dataset.manifest
    if not hold_sparse or manifest.feat_dtype.value != "float32" or dataset.feature_codec() is not None:
        return load_in_memory(dataset), None
    data = load_in_memory(dataset, features=False)
    with closing(checked_feature_ranges(dataset)) as ranges:
        held = sparse_feature_ranges(ranges, (data.num_nodes, data.feat_dim), max_density)
    if held is None:
        return replace(data, features=read_features(dataset)), None
    return data, held


class InMemorySource(BatchSource):
    """Batches sampled from a prepared dataset held entirely in memory.

    dataset: directory from ``megabatch prepare``, or the opened ``Dataset``. batch_size: training
    seeds per batch (default 1024). fanouts: neighbours per hop, -1 = all (default (10, 5)).
    eval_fanouts: for val/test batches, one per hop (default: ``fanouts``). eval_batch_size:
    (default 1024). seed: sampler and shuffle seed (default 0). chunk_batches: batches per
    sampler call (default 256). rank, world_size: the share of the epoch this source yields
    (default 0 of 1: all of it); ``batch_size`` is then per rank.
    Features stored as float16 are widened to float32 per batch, 8-bit codes decoded to float32.
    aggregation (default False): read the dataset's aggregation cache (``megabatch aggregate``): training
    batches sample one hop fewer and carry ``x_agg``, every node's features aggregated over all its
    neighbours, for the model's first layer (BatchGNN); eval_aggregation (default True): evaluation batches
    too (False: they sample every hop, and the model's first layer aggregates the sampled neighbours).
    hold_sparse (default False): hold bag-of-words features (``trainer.sparse_features``) as CSR and give each
    batch its rows as a sparse CSR tensor, which the model's layer 0 takes on the CPU (the same result bit for
    bit); for consumers that index rows (micro-batches) leave it off.
    """

    def __init__(self, dataset: Path | str | Dataset, *, batch_size: int = 1024, fanouts: Sequence[int] = (10, 5),
                 eval_fanouts: Sequence[int] | None = None, eval_batch_size: int = 1024, seed: int = 0,
                 chunk_batches: int = DEFAULT_CHUNK_BATCHES, rank: int = 0, world_size: int = 1,
                 aggregation: bool = False, eval_aggregation: bool = True, hold_sparse: bool = False) -> None:
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size),
                            ("chunk_batches", chunk_batches)):
            if value <= 0:
                raise UserError(f"{name} must be positive, got {value}")
        if seed < 0:
            raise UserError(f"sampler seed must be non-negative, got {seed}")
        try:
            check_rank(rank, world_size)
        except ValueError as err:
            raise UserError(str(err)) from None
        self.rank, self.world_size = rank, world_size
        self.fanouts = checked_fanouts("fanouts", fanouts)
        self.eval_fanouts = checked_fanouts("eval_fanouts", self.fanouts if eval_fanouts is None else eval_fanouts)
        if len(self.eval_fanouts) != len(self.fanouts):
            raise UserError(f"eval_fanouts {list(self.eval_fanouts)} needs one entry per hop "
                            f"({len(self.fanouts)}, as fanouts {list(self.fanouts)})")
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.chunk_batches = chunk_batches
        opened = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
        self.data: InMemoryGraph
        self.data, self.sparse = load_held(opened, hold_sparse)
        self.aggregates: np.ndarray | None = None
        kind = ""
        if aggregation:
            cache, self.aggregates = read_aggregates(opened)
            kind = cache.kind
        self.eval_aggregation = aggregation and eval_aggregation
        train_labels = self.data.labels[self.data.splits["train"]]
        # every label is in memory already: the class balance costs one bincount, not an epoch of counting
        counts = np.bincount(train_labels[train_labels >= 0], minlength=self.data.num_classes)
        if counts.shape[0] > self.data.num_classes:
            raise UserError(f"{opened.path}: a training label is {counts.shape[0] - 1}, the manifest declares "
                            f"{self.data.num_classes} classes (megabatch verify checks the whole dataset)")
        self._info = SourceInfo(num_features=self.data.feat_dim, num_classes=self.data.num_classes,
                                num_hops=len(self.fanouts), batch_size=batch_size,
                                train_nodes=int(self.data.splits["train"].shape[0]),
                                description=f"inmemory {opened.path}" + (
                                    "" if self.sparse is None else f" ({self.sparse.summary})"),
                                train_class_counts=tuple(int(c) for c in counts), aggregation=kind)

    @property
    def info(self) -> SourceInfo:
        return self._info

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        # one rank of one is the single-process epoch exactly (seeds and keys; tests/test_ranks.py)
        mine = deal_epoch(self.data.splits["train"], self.batch_size, self.seed, epoch, self.rank, self.world_size)
        aggregated = self.aggregates is not None
        return self._batches(EpochBatches(mine.seeds, mine.keys), self.batch_size,
                             self.fanouts[:-1] if aggregated else self.fanouts, mine.global_sizes.tolist(),
                             aggregated=aggregated)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        if split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        plan = eval_split_batches(self.data.splits[split], self.eval_batch_size, self.seed, split_stream(split))
        if self.world_size > 1:
            plan = deal_eval(plan, self.eval_batch_size, self.rank, self.world_size)
        aggregated = self.eval_aggregation
        return self._batches(plan, self.eval_batch_size, self.eval_fanouts[:-1] if aggregated else self.eval_fanouts,
                             aggregated=aggregated)

    def _batches(self, plan: EpochBatches, batch_size: int, fanouts: tuple[int, ...],
                 global_sizes: list[int] | None = None, *, aggregated: bool = False) -> Iterator[Batch]:
        """The batches of ``plan``; a key beyond the batches its seeds fill is an empty batch (a rank's
        piece of a last global batch too short to give it a seed). ``global_sizes``: per batch, the
        seeds of the global batch it belongs to (DDP training)."""
        seq = 0
        total = len(plan.keys)  # one batch per key: the stream's length is known before its first batch
        filled = num_batches(len(plan.seeds), batch_size)
        for first in range(0, filled, self.chunk_batches):
            keys = plan.keys[first:min(first + self.chunk_batches, filled)]
            seeds = plan.seeds[first * batch_size:(first + len(keys)) * batch_size]
            # keys are per batch, so sampling in chunks gives exactly the batches of one whole-epoch call
            sampled = sample_pass(self.data.graph, seeds, batch_size, fanouts, keys)
            for b in range(sampled.num_batches):
                yield self._to_batch(sampled.batch(b), seq, None if global_sizes is None else global_sizes[seq], total,
                                     aggregated)
                seq += 1
        for step in range(filled, len(plan.keys)):
            yield self._empty_batch(len(fanouts), seq, None if global_sizes is None else global_sizes[step], total,
                                    aggregated)
            seq += 1

    def _empty_batch(self, hops: int, seq: int, global_seeds: int | None, total: int, aggregated: bool) -> Batch:
        # no seed, yet a batch: the training step still runs forward and backward so DDP's all-reduce matches
        empty = torch.zeros((0, self.data.feat_dim), dtype=torch.float32)
        return Batch(x=empty, y=torch.zeros(0, dtype=torch.int64),
                     edge_index=torch.zeros((2, 0), dtype=torch.int64), n_id=torch.zeros(0, dtype=torch.int64),
                     num_sampled_nodes=[0] * (hops + 1), num_sampled_edges=[0] * hops, seq=seq,
                     global_seeds=global_seeds, stream_batches=total, x_agg=empty if aggregated else None)

    def _to_batch(self, sampled: SampledBatch, seq: int, global_seeds: int | None, total: int,
                  aggregated: bool = False) -> Batch:
        nodes = sampled.nodes
        num_seeds = int(sampled.num_sampled_nodes[0])
        x_agg = float32_rows(self.aggregates[nodes]) if aggregated and self.aggregates is not None else None
        return Batch(x=batch_rows(self.data, self.sparse, nodes),
                     y=torch.from_numpy(self.data.labels[nodes[:num_seeds]]),
                     edge_index=torch.from_numpy(sampled.edge_index),
                     n_id=torch.from_numpy(self.data.graph.global_ids[nodes]),
                     num_sampled_nodes=[int(v) for v in sampled.num_sampled_nodes],
                     num_sampled_edges=[int(v) for v in sampled.num_sampled_edges], seq=seq,
                     global_seeds=global_seeds, stream_batches=total, x_agg=x_agg)
