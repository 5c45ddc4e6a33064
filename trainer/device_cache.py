"""The trainer's feature cache: rows kept on the training device, managed by the loader daemon's plans.

With ``--feature-cache SIZE`` the trainer asks the daemon (``Hello.feature_cache_bytes``) to plan a
cache of that many bytes of feature rows; the daemon runs Belady's plan for it over each
superbatch (``loader.daemon.trainer_cache``) and ships per training batch only the rows the cache does
not hold, plus the plan: ``hit_slot`` (the cache slot of each node's row, -1 = the next shipped
row) and the update ``cache[upd_slot] = x[upd_pos]``. ``DeviceFeatureCache.assemble`` rebuilds
the full ``x`` on the device, so a CUDA run copies only the shipped rows over PCIe.

The cache holds no ids: it is only correct if every plan is applied, once, in the order the
daemon made them. ``assemble_batch`` checks the plans' step numbers and refuses a gap (a batch
dropped unassembled) instead of handing out wrong rows.
"""

import torch

from trainer.batch import Batch, DeviceCachePlan

__all__ = ["DeviceFeatureCache", "CacheOutOfStep"]


class CacheOutOfStep(RuntimeError):
    """A cache plan arrived out of order (a batch before it was never assembled): the cache's rows are unknown."""


class DeviceFeatureCache:
    """``rows`` feature rows of ``dim`` items of ``dtype`` on ``device`` (uninitialised until the plans fill them)."""

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device) -> None:
        if rows <= 0 or dim < 0:
            raise ValueError(f"rows, dim: {rows}, {dim}; expected rows >= 1 and dim >= 0")
        self.device = device
        self.rows = torch.empty((rows, dim), dtype=dtype, device=device)
        self.next_step = 0
        """Step of the next plan to apply."""

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def assemble(self, x_shipped: torch.Tensor, hit_slot: torch.Tensor, upd_slot: torch.Tensor,
                 upd_pos: torch.Tensor) -> torch.Tensor:
        """The full (n, dim) ``x``: ``cache[hit_slot[i]]`` where ``hit_slot[i] >= 0``, else the next row of
        ``x_shipped``; then ``cache[upd_slot] = x[upd_pos]``. Every tensor on the cache's device.

        No host synchronisation: the number of shipped rows is known from ``x_shipped``'s shape,
        so the miss positions are placed by a scatter instead of a ``nonzero``.
        """
        n = hit_slot.shape[0]
        shipped = x_shipped.shape[0]
        hit_slot = hit_slot.long()
        # Gather every node's cache slot (misses read slot 0, overwritten below): one pass, no mask.
        x = self.rows.index_select(0, hit_slot.clamp(min=0))
        if shipped:
            miss = hit_slot < 0
            # rank of each miss among the misses; hits all go to a spare entry that is dropped
            rank = torch.where(miss, torch.cumsum(miss, 0) - 1, shipped)
            miss_pos = torch.empty(shipped + 1, dtype=torch.long, device=hit_slot.device)
            miss_pos.scatter_(0, rank, torch.arange(n, device=hit_slot.device))
            x.index_copy_(0, miss_pos[:shipped], x_shipped)
        if upd_slot.shape[0]:
            self.rows.index_copy_(0, upd_slot.long(), x.index_select(0, upd_pos.long()))
        return x

    def assemble_batch(self, batch: Batch) -> Batch:
        """``batch`` with its full ``x`` (a plain batch sharing the release hook); a batch without a plan as is.

        Raises ``CacheOutOfStep`` when the plan is not the next one.
        """
        plan: DeviceCachePlan | None = batch.cache_plan
        if plan is None:
            return batch
        if plan.step != self.next_step:
            raise CacheOutOfStep(f"feature cache plan {plan.step} arrived, expected {self.next_step}: a batch was "
                                 f"dropped unassembled, so the trainer's feature cache no longer matches the "
                                 f"daemon's plan; reconnect to start with an empty cache")
        x = self.assemble(batch.x, *plan.tensors())
        self.next_step += 1
        return Batch(x, batch.y, batch.edge_index, batch.n_id, batch.num_sampled_nodes, batch.num_sampled_edges,
                     batch.seq, None, batch.global_seeds, batch.stream_batches, batch.x_agg, batch.class_weight,
                     batch.seed_group, _release=batch.release)
