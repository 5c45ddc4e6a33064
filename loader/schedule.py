"""Stage 1, the scheduler: which partitions form each mega-batch of an epoch.

A seeded shuffle of all partitions cut into groups of N_d (HierBatching Algorithm 1, line 12).
Every partition is in exactly one group per epoch, so every training node is in exactly one
mega-batch, which is what makes "each training node once per pass" hold across the epoch.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["MegaBatchPlan", "schedule_epoch"]

_SCHEDULE_STREAM = 0x5C4ED


@dataclass(frozen=True)
class MegaBatchPlan:
    """One mega-batch to load: scheduler -> disk reader."""

    epoch: int
    index: int
    """Position of this mega-batch within its epoch (0-based)."""
    count: int
    """Mega-batches in the epoch."""
    partitions: np.ndarray
    """int64 partition ids, ascending (so reads walk the files forward)."""
    epoch_batches: int = -1
    """Batches the whole epoch will publish, or -1 when not known ahead (``passes = "auto"``)."""

    def __post_init__(self) -> None:
        parts = np.ascontiguousarray(self.partitions, dtype=np.int64)
        if parts.ndim != 1 or len(parts) == 0:
            raise ValueError(f"MegaBatchPlan.partitions must be a non-empty 1-D array, got shape {parts.shape}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"MegaBatchPlan.index {self.index} outside [0, {self.count})")
        object.__setattr__(self, "partitions", parts)

    @property
    def is_last(self) -> bool:
        return self.index == self.count - 1


def schedule_epoch(num_partitions: int, per_megabatch: int, seed: int, epoch: int) -> list[MegaBatchPlan]:
    """The epoch's mega-batches; a pure function of its arguments (same seed, same schedule)."""
    if num_partitions <= 0 or per_megabatch <= 0:
        raise ValueError(f"need positive partition counts, got {num_partitions} and {per_megabatch}")
    rng = np.random.Generator(np.random.PCG64([seed, _SCHEDULE_STREAM, epoch]))
    order = rng.permutation(num_partitions).astype(np.int64)
    groups = [order[i:i + per_megabatch] for i in range(0, num_partitions, per_megabatch)]
    return [MegaBatchPlan(epoch, i, len(groups), np.sort(g)) for i, g in enumerate(groups)]
