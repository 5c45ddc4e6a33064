"""Dealing an epoch to several training ranks (torch.distributed DDP): a pure function of the arguments.

Training: W ranks taking ``batch_size`` = b seeds each make a global batch of W*b seeds. The epoch's
seed order is exactly the single process's (``epoch_batches_inmemory``), cut into global batches of
W*b; global batch k is split into W contiguous pieces, rank r taking piece r. A short last global
batch of m seeds is split as evenly as possible (piece sizes differ by at most one, the larger pieces
first), so every rank takes the same number of steps, ceil(n / (W*b)): DDP all-reduces gradients at
every step, and a rank missing from one would leave the others waiting. With fewer than W seeds
left, the last ranks get an empty piece for that step and step anyway. Every piece but the last of a
rank has b seeds, so a rank's seeds cut into batches of b are its pieces, as for a single process.

Keys: piece r of global batch k is sampled with key k of ``batch_keys(seed, STREAM_TRAIN, epoch, 0,
...)`` when r = 0 and of ``batch_keys(seed, STREAM_TRAIN_RANK, epoch, r, ...)`` when r >= 1. A
piece's key depends on (seed, epoch, k, r) only, and with W = 1 the plan is the single process's,
seeds and keys alike.

Evaluation is dealt by whole batch: rank r takes batches r, r+W, r+2W, ... of the split's plan
(``eval_split_batches``), each with its own key, so the ranks together evaluate every batch once,
each sampled exactly as a single process samples it. Ranks may evaluate different numbers of
batches: evaluation has no collective per batch, only one reduction of the counts at the end.
"""

from dataclasses import dataclass

import numpy as np

from loader.sampling.inmemory import STREAM_TRAIN, STREAM_TRAIN_RANK, EpochBatches, num_batches, shuffle_key
from loader.sampling.sampling import as_int_array, batch_keys, shuffle

__all__ = ["RankBatches", "check_rank", "num_steps", "piece_bounds", "rank_keys", "deal_epoch", "deal_eval"]


def check_rank(rank: int, world_size: int) -> None:
    """ValueError unless ``world_size >= 1`` and ``0 <= rank < world_size``."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")


def num_steps(num_seeds: int, batch_size: int, world_size: int) -> int:
    """Steps every rank takes in an epoch of ``num_seeds`` seeds: ceil(num_seeds / (world_size * batch_size))."""
    check_rank(0, world_size)
    return num_batches(num_seeds, batch_size * world_size)


def piece_bounds(num_seeds: int, batch_size: int, world_size: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, size), int64 [steps] each: rank ``rank``'s piece of every global batch, as positions in
    the epoch's seed order (``deal_epoch``). Sizes are ``batch_size`` but in the last step."""
    check_rank(rank, world_size)
    steps = num_steps(num_seeds, batch_size, world_size)
    first = np.arange(steps, dtype=np.int64) * (batch_size * world_size)
    total = np.minimum(batch_size * world_size, num_seeds - first)
    share, extra = np.divmod(total, world_size)
    # the first `extra` ranks take one seed more; a full global batch has extra == 0 and share == batch_size
    size = share + (rank < extra)
    start = first + rank * share + np.minimum(rank, extra)
    return start, size


def rank_keys(seed: int, epoch: int, rank: int, steps: int) -> np.ndarray:
    """uint64 [steps]: the sampling keys of rank ``rank``'s pieces of global batches 0 .. steps - 1."""
    if rank == 0:
        return batch_keys(seed, STREAM_TRAIN, epoch, 0, 0, steps)
    return batch_keys(seed, STREAM_TRAIN_RANK, epoch, rank, 0, steps)


@dataclass(frozen=True)
class RankBatches:
    """Rank ``rank``'s share of one training epoch dealt to ``world_size`` ranks (``deal_epoch``).

    Step s (0 <= s < num_steps) trains ``seeds[s * batch_size:(s + 1) * batch_size]`` (int64 dataset
    ids; ``batch_size`` of them in every step but the last, which may hold fewer or none), sampled
    with ``keys[s]`` (uint64); it is this rank's piece of global batch s, which holds
    ``global_sizes[s]`` seeds over all ranks (int64): the loss of a piece is scaled by it.
    """

    rank: int
    world_size: int
    batch_size: int
    seeds: np.ndarray
    keys: np.ndarray
    global_sizes: np.ndarray

    def __post_init__(self) -> None:
        check_rank(self.rank, self.world_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        object.__setattr__(self, "seeds", as_int_array("seeds", self.seeds, (np.int64,)))
        object.__setattr__(self, "keys", as_int_array("keys", self.keys, (np.uint64,)))
        object.__setattr__(self, "global_sizes", as_int_array("global_sizes", self.global_sizes, (np.int64,)))
        steps, count = len(self.keys), len(self.seeds)
        if len(self.global_sizes) != steps:
            raise ValueError(f"global_sizes: {len(self.global_sizes)} entries, expected one per step ({steps})")
        if not (steps - 1) * self.batch_size <= count <= steps * self.batch_size:
            raise ValueError(f"seeds: {count} for {steps} steps of at most {self.batch_size}, all full but the last")

    @property
    def num_steps(self) -> int:
        return len(self.keys)

    def sizes(self) -> np.ndarray:
        """int64 [num_steps]: seeds of each step (0 for an empty last piece)."""
        offsets = np.arange(self.num_steps, dtype=np.int64) * self.batch_size
        return np.clip(len(self.seeds) - offsets, 0, self.batch_size)

    def step_seeds(self, step: int) -> np.ndarray:
        """The seeds of step ``step`` (a view; empty for an empty piece)."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} outside [0, {self.num_steps})")
        return self.seeds[step * self.batch_size:(step + 1) * self.batch_size]


def _gather(values: np.ndarray, start: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``concatenate([values[a:a + n] for a, n in zip(start, size)])`` without a Python loop."""
    offsets = np.cumsum(size) - size
    return values[np.repeat(start - offsets, size) + np.arange(int(size.sum()), dtype=np.int64)]


def deal_epoch(train_ids: np.ndarray, batch_size: int, seed: int, epoch: int, rank: int, world_size: int
               ) -> RankBatches:
    """Rank ``rank``'s pieces of training epoch ``epoch`` dealt to ``world_size`` ranks of ``batch_size`` seeds.

    The seed order is ``epoch_batches_inmemory(train_ids, batch_size, seed, epoch).seeds`` (it does
    not depend on the batch size); the dealing and the keys are in the module docstring.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    ids = np.ascontiguousarray(train_ids, dtype=np.int64)
    order = shuffle(ids, shuffle_key(seed, epoch))
    start, size = piece_bounds(len(order), batch_size, world_size, rank)
    group = batch_size * world_size
    global_sizes = np.minimum(group, len(order) - np.arange(len(start), dtype=np.int64) * group)
    return RankBatches(rank=rank, world_size=world_size, batch_size=batch_size, seeds=_gather(order, start, size),
                       keys=rank_keys(seed, epoch, rank, len(start)), global_sizes=global_sizes)


def deal_eval(plan: EpochBatches, batch_size: int, rank: int, world_size: int) -> EpochBatches:
    """Rank ``rank``'s evaluation batches: batches rank, rank + world_size, ... of ``plan`` (batches of
    ``batch_size``, as ``eval_split_batches`` makes them), in the same layout: batch i of the result is
    ``seeds[i * batch_size:(i + 1) * batch_size]`` with ``keys[i]`` (only the plan's last batch may be
    short, and if this rank takes it, it is this rank's last). May be empty."""
    check_rank(rank, world_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    count = len(plan.seeds)
    if len(plan.keys) != num_batches(count, batch_size):
        raise ValueError(f"plan: {len(plan.keys)} keys for {count} seeds in batches of {batch_size}")
    taken = np.arange(rank, len(plan.keys), world_size, dtype=np.int64)
    start = taken * batch_size
    size = np.minimum(batch_size, count - start)
    return EpochBatches(_gather(np.asarray(plan.seeds, dtype=np.int64), start, size), plan.keys[taken])
