"""The unit the training loop consumes: one sampled mini-batch as PyG-native torch tensors."""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["Batch", "DeviceCachePlan"]


def _no_release() -> None:
    return None


@dataclass(frozen=True)
class DeviceCachePlan:
    """How to assemble a batch's ``x`` from the rows shipped with it and a feature cache on the trainer.

    hit_slot: int32 (n,), per node of the batch the cache slot holding its row, -1 = the next
    shipped row; upd_slot, upd_pos: int32 (u,), after assembly ``cache[upd_slot[k]] =
    x[upd_pos[k]]``. step: the index of this plan among the session's cached batches (0, 1, ...):
    plans must be applied in exactly this order (``trainer.device_cache``).
    """

    hit_slot: torch.Tensor
    upd_slot: torch.Tensor
    upd_pos: torch.Tensor
    step: int

    def to(self, device: torch.device, non_blocking: bool = False) -> "DeviceCachePlan":
        return DeviceCachePlan(self.hit_slot.to(device, non_blocking=non_blocking),
                               self.upd_slot.to(device, non_blocking=non_blocking),
                               self.upd_pos.to(device, non_blocking=non_blocking), self.step)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.hit_slot, self.upd_slot, self.upd_pos


@dataclass
class Batch:
    """One mini-batch in PyG's sampled-subgraph layout.

    ``x`` rows follow ``n_id``: seeds first (``num_sampled_nodes[0]`` of them), then the nodes first
    reached at hop 1, hop 2, ... ``edge_index`` is local (row = sampled neighbour / source, col =
    target) with hop-1 edges first, so ``torch_geometric.utils.trim_to_layer`` applies as is.
    ``y`` holds the seeds' labels only.

    With ``cache_plan`` set, ``x`` holds only the rows the trainer's feature cache does not hold
    (``hit_slot < 0``, in batch order); ``trainer.device_cache.DeviceFeatureCache.assemble_batch``
    turns it into a plain batch on the training device.

    Tensors may be zero-copy views of a shared-memory slot owned by the loader daemon: call
    ``release()`` once nothing reads them any more (after the step on CPU, after the device copy
    on CUDA). ``release`` is idempotent.
    """

    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    n_id: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    seq: int = 0
    """Sequence number given by the producer (checked for gaps and duplicates)."""
    cache_plan: DeviceCachePlan | None = None
    """None: ``x`` holds every row. Else ``x`` holds the shipped rows only (see above)."""
    global_seeds: int | None = None
    """Under DDP, the seeds of the whole global batch this batch is one rank's piece of (every rank's piece
    of the step together); the loss is scaled by it. None: the batch stands alone (a single process)."""
    stream_batches: int | None = None
    """Batches the producer says this batch's stream (a training epoch, an evaluation) publishes, this one
    included; None where it does not know ahead (the daemon's hierarchical mode with ``passes = "auto"``).
    Progress counts against it, not an estimate from the seed count: a hierarchical epoch may publish more
    batches than ``train_nodes / batch_size`` (each mega-batch's last batch is short)."""
    x_agg: torch.Tensor | None = None
    """With an aggregation cache (``--aggregation-cache``): per node of the batch, its input features aggregated
    over all its neighbours, rows as ``x``'s; the batch then holds one hop fewer than the model's layers (the
    first layer reads these rows instead of a sampled last hop). None: no cache."""
    class_weight: torch.Tensor | None = None
    """float32 (C,): each class's weight in the loss (the daemon's ``[hierarchy] label_prior_loss``: the epoch's
    label mix over the mega-batch's); None: every seed weighs 1."""
    seed_group: torch.Tensor | None = None
    """int32 (seeds,): each seed's micro-batch group, made by the daemon (REG + METIS) for a trainer that asked for
    micro-batches (``Hello.micro_batches``); None: the trainer groups them itself. Stays on the host."""
    _release: Callable[[], None] = field(default=_no_release, repr=False)
    _released: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.num_sampled_nodes) != len(self.num_sampled_edges) + 1:
            raise ValueError(f"num_sampled_nodes has {len(self.num_sampled_nodes)} entries, "
                             f"expected num_sampled_edges + 1 = {len(self.num_sampled_edges) + 1}")
        nodes = sum(self.num_sampled_nodes)
        if self.cache_plan is None and self.x.shape[0] != nodes:
            raise ValueError(f"x has {self.x.shape[0]} rows, num_sampled_nodes sums to {nodes}")
        if self.cache_plan is not None and (self.cache_plan.hit_slot.shape != (nodes,) or self.x.shape[0] > nodes):
            raise ValueError(f"cache_plan.hit_slot has shape {tuple(self.cache_plan.hit_slot.shape)} and x "
                             f"{self.x.shape[0]} rows, expected ({nodes},) and at most {nodes} rows")
        if self.edge_index.shape != (2, sum(self.num_sampled_edges)):
            raise ValueError(f"edge_index has shape {tuple(self.edge_index.shape)}, "
                             f"expected (2, {sum(self.num_sampled_edges)})")
        if self.x_agg is not None and self.x_agg.shape != (nodes, self.x.shape[1]):
            raise ValueError(f"x_agg has shape {tuple(self.x_agg.shape)}, expected ({nodes}, {self.x.shape[1]})")
        if self.y.shape[0] != self.num_sampled_nodes[0]:
            raise ValueError(f"y has {self.y.shape[0]} entries, expected {self.num_sampled_nodes[0]} seeds")

    def moved_tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors ``to`` moves to a device (the cache plan's apart)."""
        optional = tuple(t for t in (self.x_agg, self.class_weight) if t is not None)
        return (self.x, self.y, self.edge_index, *optional)

    @property
    def batch_size(self) -> int:
        """Number of seed nodes (the nodes the loss is computed on)."""
        return self.num_sampled_nodes[0]

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        """A copy on ``device`` sharing this batch's release hook (no copy when already there)."""
        if self.x.device == device:
            return self
        plan = None if self.cache_plan is None else self.cache_plan.to(device, non_blocking)
        return Batch(self.x.to(device, non_blocking=non_blocking), self.y.to(device, non_blocking=non_blocking),
                     self.edge_index.to(device, non_blocking=non_blocking), self.n_id,
                     self.num_sampled_nodes, self.num_sampled_edges, self.seq, plan, self.global_seeds,
                     self.stream_batches,
                     None if self.x_agg is None else self.x_agg.to(device, non_blocking=non_blocking),
                     None if self.class_weight is None else self.class_weight.to(device, non_blocking=non_blocking),
                     self.seed_group, _release=self.release)

    def release(self) -> None:
        """Hand the underlying shared-memory slot back to its producer (idempotent)."""
        if not self._released:
            self._released = True
            self._release()
