"""The in-memory reference source: the whole dataset in RAM, neighbour sampling per epoch ("NS").

The baseline the loader daemon is measured against (HierBatching's "NS"): every epoch visits
all training nodes in a fresh random order, each batch sampled from the full graph. Batches
come from the same sampler, keys and evaluation plans as the daemon's, so the two modes differ
only in which neighbours are visible to a batch (all of them here).
"""

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from loader.format.dataset import Dataset, open_dataset
from loader.sampling.inmemory import (
    EpochBatches,
    InMemoryGraph,
    epoch_batches_inmemory,
    eval_split_batches,
    load_in_memory,
    split_stream,
)
from loader.sampling.sampling import SampledBatch, sample_pass
from proto.errors import UserError
from trainer.batch import Batch
from trainer.source import BatchSource, SourceInfo

__all__ = ["InMemorySource", "DEFAULT_CHUNK_BATCHES"]

DEFAULT_CHUNK_BATCHES = 256
"""Batches sampled per ``sample_pass`` call: bounds the sampled-but-unconsumed memory."""


def _fanouts(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(v) for v in values)
    if not out or any(v == 0 or v < -1 for v in out):
        raise UserError(f"{name} must be a non-empty list of positive integers or -1 (all neighbours), "
                        f"got {list(out)}")
    return out


class InMemorySource(BatchSource):
    """Batches sampled from a prepared dataset held entirely in memory.

    dataset: directory from ``megabatch prepare``, or the opened ``Dataset``. batch_size: training
    seeds per batch (default 1024). fanouts: neighbours per hop, -1 = all (default (10, 5)).
    eval_fanouts: for val/test batches, one per hop (default: ``fanouts``). eval_batch_size:
    (default 1024). seed: sampler and shuffle seed (default 0). chunk_batches: batches per
    sampler call (default 256).
    Features stored as float16 are widened to float32 per batch.
    """

    def __init__(self, dataset: Path | str | Dataset, *, batch_size: int = 1024, fanouts: Sequence[int] = (10, 5),
                 eval_fanouts: Sequence[int] | None = None, eval_batch_size: int = 1024, seed: int = 0,
                 chunk_batches: int = DEFAULT_CHUNK_BATCHES) -> None:
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size),
                            ("chunk_batches", chunk_batches)):
            if value <= 0:
                raise UserError(f"{name} must be positive, got {value}")
        if seed < 0:
            raise UserError(f"sampler seed must be non-negative, got {seed}")
        self.fanouts = _fanouts("fanouts", fanouts)
        self.eval_fanouts = _fanouts("eval_fanouts", self.fanouts if eval_fanouts is None else eval_fanouts)
        if len(self.eval_fanouts) != len(self.fanouts):
            raise UserError(f"eval_fanouts {list(self.eval_fanouts)} needs one entry per hop "
                            f"({len(self.fanouts)}, as fanouts {list(self.fanouts)})")
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.chunk_batches = chunk_batches
        opened = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
        self.data: InMemoryGraph = load_in_memory(opened)
        train_labels = self.data.labels[self.data.splits["train"]]
        # every label is in memory already: the class balance costs one bincount, not an epoch of counting
        counts = np.bincount(train_labels[train_labels >= 0], minlength=self.data.num_classes)
        if counts.shape[0] > self.data.num_classes:
            raise UserError(f"{opened.path}: a training label is {counts.shape[0] - 1}, the manifest declares "
                            f"{self.data.num_classes} classes (megabatch verify checks the whole dataset)")
        self._info = SourceInfo(num_features=self.data.feat_dim, num_classes=self.data.num_classes,
                                num_hops=len(self.fanouts), batch_size=batch_size,
                                train_nodes=int(self.data.splits["train"].shape[0]),
                                description=f"inmemory {opened.path}",
                                train_class_counts=tuple(int(c) for c in counts))

    @property
    def info(self) -> SourceInfo:
        return self._info

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        plan = epoch_batches_inmemory(self.data.splits["train"], self.batch_size, self.seed, epoch)
        return self._batches(plan, self.batch_size, self.fanouts)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        if split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        plan = eval_split_batches(self.data.splits[split], self.eval_batch_size, self.seed, split_stream(split))
        return self._batches(plan, self.eval_batch_size, self.eval_fanouts)

    def _batches(self, plan: EpochBatches, batch_size: int, fanouts: tuple[int, ...]) -> Iterator[Batch]:
        seq = 0
        for first in range(0, len(plan.keys), self.chunk_batches):
            keys = plan.keys[first:first + self.chunk_batches]
            seeds = plan.seeds[first * batch_size:(first + len(keys)) * batch_size]
            # keys are per batch, so sampling in chunks gives exactly the batches of one whole-epoch call
            sampled = sample_pass(self.data.graph, seeds, batch_size, fanouts, keys)
            for b in range(sampled.num_batches):
                yield self._to_batch(sampled.batch(b), seq)
                seq += 1

    def _to_batch(self, sampled: SampledBatch, seq: int) -> Batch:
        nodes = sampled.nodes
        num_seeds = int(sampled.num_sampled_nodes[0])
        features = self.data.features[nodes]
        if features.dtype != np.float32:
            features = features.astype(np.float32)
        return Batch(x=torch.from_numpy(features), y=torch.from_numpy(self.data.labels[nodes[:num_seeds]]),
                     edge_index=torch.from_numpy(sampled.edge_index),
                     n_id=torch.from_numpy(self.data.graph.global_ids[nodes]),
                     num_sampled_nodes=[int(v) for v in sampled.num_sampled_nodes],
                     num_sampled_edges=[int(v) for v in sampled.num_sampled_edges], seq=seq)
