"""What the link-prediction loop consumes, whichever source made it (in memory or the daemon): the batches and a
buffer order's settings (a held-out split's pairs are ``proto.held_pairs.HeldPairs``). Torch only: the
daemon's source imports no loader (it talks to the daemon through ``proto``)."""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["NodeBatch", "LinkBatch", "BufferSettings"]


def _no_release() -> None:
    """A batch that owns its tensors has no slot to hand back."""


@dataclass
class NodeBatch:
    """A sampled subgraph in PyG's layout (seeds first; ``trainer.batch.Batch`` without labels).

    x: float32 (n, D) feature rows; edge_index: int64 (2, E) local; the sampled counts per hop; n_id: int64
    (n,) the nodes' dataset ids (on the CPU: nothing on the device reads them).

    The tensors may be read-only views of a daemon's shared-memory slot: call ``release()`` once nothing reads
    them (after the embedding or the step; a copy made by ``to`` shares the hook). Idempotent.
    """

    x: torch.Tensor
    edge_index: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    n_id: torch.Tensor
    _release: Callable[[], None] = field(default=_no_release, repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def num_seeds(self) -> int:
        return self.num_sampled_nodes[0]

    def to(self, device: torch.device) -> "NodeBatch":
        if self.x.device == device:
            return self
        return NodeBatch(self.x.to(device), self.edge_index.to(device), self.num_sampled_nodes, self.num_sampled_edges,
                         self.n_id, _release=self.release)

    def release(self) -> None:
        """Hand the batch's slot back to the daemon (no-op for a batch that owns its tensors)."""
        if not self._released:
            self._released = True
            self._release()


@dataclass
class LinkBatch:
    """A training batch: the subgraph around its seeds (every endpoint of a supervision pair, ``NodeBatch``)
    and the pairs: edge_label_index int64 (2, B(1+k)) positions among the seeds, the B positives first;
    edge_label float32 (B(1+k),), 1 for a positive, 0 for a negative; positives: B. global_positives: under
    several ranks, the positives of the global batch this is one rank's piece of (the loss is scaled by it;
    None for a single process). stream_batches: the epoch's batch count as the batch's source knows it (the
    progress bar's total: a buffer order's states cut batches of their own; a daemon's ``BatchReady.num_batches``,
    None where it does not say). edge_weight: float32 (B(1+k),), each pair's weight in the loss (None: all 1).
    ``release()`` hands back the slot its tensors may view (``NodeBatch``'s)."""

    graph: NodeBatch
    edge_label_index: torch.Tensor
    edge_label: torch.Tensor
    positives: int
    global_positives: int | None = None
    stream_batches: int | None = None
    edge_weight: torch.Tensor | None = None

    def to(self, device: torch.device) -> "LinkBatch":
        if self.graph.x.device == device:
            return self
        weight = None if self.edge_weight is None else self.edge_weight.to(device)
        return LinkBatch(self.graph.to(device), self.edge_label_index.to(device), self.edge_label.to(device),
                         self.positives, self.global_positives, self.stream_batches, weight)

    def release(self) -> None:
        self.graph.release()


@dataclass(frozen=True)
class BufferSettings:
    """A buffer order as a run resolved it: order ("comet" or "beta"), capacity C and the dataset's P (physical
    partitions), logical_partitions l (COMET: the given or MariusGNN's default; BETA: P, each its own) and
    logical_capacity c_l (logical partitions resident at once; BETA: C)."""

    order: str
    capacity: int
    physical_partitions: int
    logical_partitions: int
    logical_capacity: int

    def to_json(self) -> dict[str, object]:
        return {"order": self.order, "capacity": self.capacity, "physical_partitions": self.physical_partitions,
                "logical_partitions": self.logical_partitions, "logical_capacity": self.logical_capacity}
