"""Link-prediction batches from a prepared link dataset held in memory: the in-memory reference path.

Training: epoch e's batches are ``link_batch_plan(E_train, batch_size, seed, e)`` over the positions
of ``train_edges.npy``, each sampled by ``sample_link_batch`` over the whole graph (the loader's
in-memory ``CSCGraph``, as ``--mode inmemory`` builds it for node tasks), negatives drawn uniformly
over every node. Features come from ``features.bin`` as the node task's in-memory source reads them
(``load_in_memory``: one checked sequential read per partition).

Evaluation of a split embeds the nodes its scores need, the union of the held-out sources, targets
and negative tails, in sorted order, with node batches of ``eval_batch_size`` sampled with
``eval_fanouts`` and the keys of ``eval_split_batches`` on the split's link stream
(``STREAM_LINK_VAL``/``STREAM_LINK_TEST``): the node task's evaluation plan over those nodes, so every
evaluation of a split samples the same neighbourhoods. Message passing uses the prepared graph, which
holds the training edges only (the held-out positives were removed from it by ``import``), for val
and test alike.
"""

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from loader.format.dataset import Dataset
from loader.sampling.inmemory import InMemoryGraph, eval_split_batches, load_in_memory, num_batches
from loader.sampling.link_sampling import STREAM_LINK_TEST, STREAM_LINK_VAL, link_batch_plan, sample_link_batch
from loader.sampling.sampling import sample_pass
from proto.errors import UserError
from trainer.inmemory_source import checked_fanouts

__all__ = ["NodeBatch", "LinkBatch", "HeldOut", "LinkInMemorySource", "EVAL_CHUNK_BATCHES"]

EVAL_CHUNK_BATCHES = 64
"""Evaluation batches sampled per ``sample_pass`` call: bounds the sampled-but-unconsumed memory."""

_EVAL_STREAMS = {"val": STREAM_LINK_VAL, "test": STREAM_LINK_TEST}


@dataclass
class NodeBatch:
    """A sampled subgraph in PyG's layout (seeds first; ``trainer.batch.Batch`` without labels).

    x: float32 (n, D) feature rows; edge_index: int64 (2, E) local; the sampled counts per hop; n_id: int64
    (n,) the nodes' dataset ids (on the CPU: nothing on the device reads them).
    """

    x: torch.Tensor
    edge_index: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    n_id: torch.Tensor

    @property
    def num_seeds(self) -> int:
        return self.num_sampled_nodes[0]

    def to(self, device: torch.device) -> "NodeBatch":
        if self.x.device == device:
            return self
        return NodeBatch(self.x.to(device), self.edge_index.to(device), self.num_sampled_nodes, self.num_sampled_edges,
                         self.n_id)


@dataclass
class LinkBatch:
    """A training batch: the subgraph around its seeds (every endpoint of a supervision pair, ``NodeBatch``)
    and the pairs: edge_label_index int64 (2, B(1+k)) positions among the seeds, the B positives first;
    edge_label float32 (B(1+k),), 1 for a positive, 0 for a negative; positives: B."""

    graph: NodeBatch
    edge_label_index: torch.Tensor
    edge_label: torch.Tensor
    positives: int

    def to(self, device: torch.device) -> "LinkBatch":
        if self.graph.x.device == device:
            return self
        return LinkBatch(self.graph.to(device), self.edge_label_index.to(device), self.edge_label.to(device),
                         self.positives)


@dataclass(frozen=True)
class HeldOut:
    """One held-out split as positions into ``nodes`` (its embedded nodes, sorted dataset ids).

    src, dst: int64 (E,) the positives' endpoints; tails: int64 (E, K) each positive's negative tails.
    """

    nodes: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    tails: np.ndarray

    @property
    def num_positives(self) -> int:
        return int(self.src.shape[0])


class LinkInMemorySource:
    """The batches of a link-prediction run over ``dataset`` (a prepared dataset whose task is ``link``).

    batch_size: training positives per batch; negatives: training negatives per positive (k >= 1);
    disjoint: drop each batch's positive edges from its own message passing (``sample_link_batch``);
    fanouts, eval_fanouts (default: ``fanouts``), eval_batch_size (nodes per evaluation batch), seed:
    as the node task's in-memory source. A dataset that is not a link dataset, or whose link files do
    not fit its manifest, is a UserError.
    """

    def __init__(self, dataset: Dataset, *, batch_size: int = 1024, negatives: int = 1, disjoint: bool = False,
                 fanouts: Sequence[int] = (10, 5), eval_fanouts: Sequence[int] | None = None,
                 eval_batch_size: int = 1024, seed: int = 0) -> None:
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
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.negatives, self.disjoint = negatives, disjoint
        self.data: InMemoryGraph = load_in_memory(dataset)
        n = self.data.num_nodes
        self.train_edges = self._read(dataset, "train_edges", (2, link.train))
        self.held_out: dict[str, HeldOut] = {}
        for split in ("val", "test"):
            edges = self._read(dataset, f"{split}_edges", (2, link.of(split)))
            tails = self._read(dataset, f"{split}_neg_tails", (link.of(split), link.eval_negatives))
            nodes = np.unique(np.concatenate((edges.reshape(-1), tails.reshape(-1))))
            self.held_out[split] = HeldOut(nodes, np.searchsorted(nodes, edges[0]), np.searchsorted(nodes, edges[1]),
                                           np.searchsorted(nodes, tails))
        self.num_nodes = n
        self.num_features = self.data.feat_dim
        self.num_hops = len(self.fanouts)
        self.eval_negatives = link.eval_negatives
        self.description = f"inmemory {dataset.path} (link)"

    def _read(self, dataset: Dataset, name: str, shape: tuple[int, int]) -> np.ndarray:
        array = dataset.read(name, np.int64, 2)
        if array.shape != shape:
            raise UserError(f"{dataset.file(name)}: shape {array.shape}, the manifest's link table says {shape}")
        if array.size and (array.min() < 0 or array.max() >= self.data.num_nodes):
            raise UserError(f"{dataset.file(name)}: node ids outside [0, {self.data.num_nodes})")
        return array

    @property
    def train_positives(self) -> int:
        return int(self.train_edges.shape[1])

    def batches_per_epoch(self) -> int:
        return num_batches(self.train_positives, self.batch_size)

    def train_batches(self, epoch: int) -> Generator[LinkBatch, None, None]:
        """Epoch ``epoch``'s training batches (the same epoch gives the same batches)."""
        plan = link_batch_plan(self.train_positives, self.batch_size, self.seed, epoch)
        for b in range(plan.num_batches):
            positions, key = plan.batch(b)
            sampled = sample_link_batch(self.data.graph, self.train_edges[0, positions],
                                        self.train_edges[1, positions], self.num_nodes, self.fanouts, key,
                                        negatives_per_positive=self.negatives, disjoint=self.disjoint)
            graph = NodeBatch(self._rows(sampled.local_nodes), torch.from_numpy(sampled.edge_index),
                              [int(v) for v in sampled.num_sampled_nodes], [int(v) for v in sampled.num_sampled_edges],
                              torch.from_numpy(sampled.nodes))
            yield LinkBatch(graph, torch.from_numpy(sampled.edge_label_index), torch.from_numpy(sampled.edge_label),
                            len(positions))

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
        features = self.data.features[nodes]
        if features.dtype != np.float32:
            features = features.astype(np.float32)
        return torch.from_numpy(features)
