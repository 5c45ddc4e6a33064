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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from loader.sampling.inmemory import STREAM_TRAIN, STREAM_TRAIN_RANK, EpochBatches, num_batches, shuffle_key
from loader.sampling.sampling import (
    SampledBatches,
    SampledPass,
    as_int_array,
    batch_keys,
    concat_passes,
    empty_pass,
    shuffle,
)

__all__ = ["RankBatches", "LocalRanks", "SINGLE_RANK", "Pieces", "check_rank", "num_steps", "even_batch_size",
           "piece_bounds", "even_piece", "rank_keys",
           "deal_epoch", "deal_eval", "deal_pieces", "piece_keys", "gather_pieces",
           "sample_pieces", "sample_pieces_with"]

Passes = TypeVar("Passes", bound=SampledBatches)
"""What the ``sample`` of a ``sample_pieces_with`` call returns (a ``SampledPass``, or staged's ``SpilledPass``)."""


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


def even_batch_size(num_seeds: int, batch_size: int, world_size: int) -> int:
    """The per-rank batch size that cuts ``num_seeds`` seeds into as many steps as ``batch_size`` does
    (``num_steps``) but of nearly equal sizes: ceil(ceil(n / steps) / world_size), at most ``batch_size``.

    A mega-batch's seeds cut at ``batch_size`` end in a short batch (a 5,174-seed mega-batch at 1024: five
    full batches and one of 54), and a mega-batch is a fraction of the epoch, so an epoch of them takes
    several such steps where in-memory sampling takes one: each moves the model as far as a full batch
    (Adam's step does not shrink with the batch) on a noisier gradient. Evened, the same 5,174 seeds make
    six batches of 863 or 859."""
    steps = num_steps(num_seeds, batch_size, world_size)
    if steps == 0:
        return batch_size
    per_step = -(-num_seeds // steps)
    return -(-per_step // world_size)


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


def even_piece(count: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s piece of one global batch of ``count`` items, as (begin, end) offsets into it: contiguous
    pieces in rank order, sizes differing by at most one, the larger first (``piece_bounds``' rule; a global
    batch of W*b gives every rank b). The link task deals each of its global batches so: a buffer state's
    batches are evened (``buffer_order.balanced_cuts``), so most of them are short of W*b."""
    share, extra = divmod(count, world_size)
    begin = rank * share + min(rank, extra)
    return begin, begin + share + (rank < extra)


def rank_keys(seed: int, epoch: int, rank: int, steps: int, first_step: int = 0) -> np.ndarray:
    """uint64 [steps]: the sampling keys of rank ``rank``'s pieces of global batches ``first_step ..
    first_step + steps - 1`` (with ``first_step`` = 0 and rank 0, the single process's batch keys)."""
    if rank == 0:
        return batch_keys(seed, STREAM_TRAIN, epoch, 0, first_step, steps)
    return batch_keys(seed, STREAM_TRAIN_RANK, epoch, rank, first_step, steps)


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


def gather_pieces(values: np.ndarray, start: np.ndarray, size: np.ndarray) -> np.ndarray:
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
    return RankBatches(rank=rank, world_size=world_size, batch_size=batch_size, seeds=gather_pieces(order, start, size),
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
    return EpochBatches(gather_pieces(np.asarray(plan.seeds, dtype=np.int64), start, size), plan.keys[taken])


@dataclass(frozen=True)
class LocalRanks:
    """The ranks of one training job that one loader daemon serves: ``ranks`` (sorted, distinct) of
    ``world_size``. A job on one machine has all of them; on several machines each daemon has its
    machine's ranks and deals only their pieces (the schedule is the same function everywhere)."""

    world_size: int = 1
    ranks: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        ranks = tuple(int(r) for r in self.ranks)
        if not ranks:
            raise ValueError("ranks: a job has at least one rank here")
        for rank in ranks:
            check_rank(rank, self.world_size)
        if list(ranks) != sorted(set(ranks)):
            raise ValueError(f"ranks: {list(ranks)}, expected distinct and sorted")
        object.__setattr__(self, "ranks", ranks)

    @property
    def count(self) -> int:
        return len(self.ranks)

    @property
    def several(self) -> bool:
        """A job of several ranks (not ``SINGLE_RANK``): its batches carry their rank and loss scale."""
        return self.world_size > 1

    def describe(self) -> str:
        """"ranks 0, 1 of 2" (for logs and errors)."""
        return f"rank{'s' if self.count > 1 else ''} {', '.join(map(str, self.ranks))} of {self.world_size}"


SINGLE_RANK = LocalRanks()
"""A process training alone: rank 0 of 1 (every dealing function then gives the single process's plan)."""


@dataclass(frozen=True)
class Pieces:
    """A seed sequence of ``num_seeds`` dealt to ``local``'s ranks, in step-major order: the pieces of
    global batch 0 for each local rank in rank order, then those of global batch 1, and so on.

    Piece i is ``order[start[i]:start[i] + size[i]]`` (int64 arrays), goes to ``local.ranks[member[i]]``
    in step ``step[i]``, and its global batch holds ``global_size[i]`` seeds over all ranks, local or not.
    """

    local: LocalRanks
    start: np.ndarray
    size: np.ndarray
    member: np.ndarray
    step: np.ndarray
    global_size: np.ndarray

    @property
    def count(self) -> int:
        return len(self.start)

    @property
    def num_steps(self) -> int:
        return self.count // self.local.count

    def steps(self, first: int, last: int) -> "Pieces":
        """The pieces of steps ``first .. last - 1`` (views)."""
        cut = slice(first * self.local.count, last * self.local.count)
        return Pieces(local=self.local, start=self.start[cut], size=self.size[cut], member=self.member[cut],
                      step=self.step[cut], global_size=self.global_size[cut])


def deal_pieces(num_seeds: int, batch_size: int, local: LocalRanks) -> Pieces:
    """The pieces of ``local``'s ranks when ``num_seeds`` seeds in order are dealt to ``local.world_size``
    ranks in global batches of ``world_size * batch_size`` (``piece_bounds``; ``deal_epoch`` for one rank).

    With ``SINGLE_RANK`` the pieces are the single process's batches: ``batch_size`` seeds each, the last
    one short. Every local rank has the same number of pieces (empty ones where a short last global batch
    has fewer seeds than ranks)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    world = local.world_size
    bounds = [piece_bounds(num_seeds, batch_size, world, rank) for rank in local.ranks]
    steps = len(bounds[0][0])
    group = batch_size * world
    global_size = np.minimum(group, num_seeds - np.arange(steps, dtype=np.int64) * group)
    return Pieces(local=local, start=np.stack([b[0] for b in bounds], axis=1).reshape(-1),
                  size=np.stack([b[1] for b in bounds], axis=1).reshape(-1),
                  member=np.tile(np.arange(local.count, dtype=np.int64), steps),
                  step=np.repeat(np.arange(steps, dtype=np.int64), local.count),
                  global_size=np.repeat(global_size, local.count))


def piece_keys(seed: int, epoch: int, local: LocalRanks, first_step: int, steps: int) -> np.ndarray:
    """uint64 [steps * local.count]: the keys of ``local``'s pieces of global batches ``first_step ..
    first_step + steps - 1``, step-major like ``Pieces`` (``rank_keys`` of each rank, interleaved)."""
    keys = [rank_keys(seed, epoch, rank, steps, first_step) for rank in local.ranks]
    return np.stack(keys, axis=1).reshape(-1)


def sample_pieces(sample: Callable[[np.ndarray, int, np.ndarray], SampledPass], order: np.ndarray, pieces: Pieces,
                  batch_size: int, keys: np.ndarray, num_hops: int) -> SampledPass:
    """Piece i of ``pieces`` (seeds ``order[start[i]:start[i] + size[i]]``) sampled with ``keys[i]`` as batch i
    of one pass in RAM (``sample_pieces_with``, the parts joined by ``concat_passes``)."""
    return sample_pieces_with(sample, order, pieces, batch_size, keys, num_hops, concat_passes)


def sample_pieces_with(sample: Callable[[np.ndarray, int, np.ndarray], Passes], order: np.ndarray, pieces: Pieces,
                       batch_size: int, keys: np.ndarray, num_hops: int,
                       concat: Callable[[list[Passes | SampledPass]], Passes | SampledPass]) -> Passes | SampledPass:
    """Piece i of ``pieces`` (seeds ``order[start[i]:start[i] + size[i]]``) sampled with ``keys[i]`` as batch i
    of one pass. ``sample(seeds, batch_size, keys)`` samples consecutive batches (``sample_pass`` semantics);
    ``concat`` joins the parts, each of them ``sample``'s or an ``empty_pass`` (a rank's empty piece), into one.

    Every piece but those of the last global batch holds ``batch_size`` seeds: they are sampled in one call,
    with a short non-empty last piece when it is the only short one (``sample`` cuts a short last batch
    itself: a lone trainer's pass is then one call, as before ranks); otherwise the last step's pieces (at
    most one per local rank, possibly empty) one by one. A piece is sampled the same way whichever call
    samples it (its seeds and key decide), so the result does not depend on how the pieces are grouped."""
    if len(keys) != pieces.count:
        raise ValueError(f"keys: {len(keys)}, expected one per piece ({pieces.count})")
    full = pieces.count
    while full > 0 and pieces.size[full - 1] != batch_size:
        full -= 1
    if full == pieces.count - 1 and pieces.size[full] > 0:
        full = pieces.count
    parts: list[Passes | SampledPass] = []
    if full:
        seeds = gather_pieces(order, pieces.start[:full], pieces.size[:full])
        parts.append(sample(seeds, batch_size, keys[:full]))
    for i in range(full, pieces.count):  # the short last step: at most one piece per local rank
        size = int(pieces.size[i])
        start = int(pieces.start[i])
        parts.append(sample(order[start:start + size], size, keys[i:i + 1]) if size else empty_pass(1, num_hops))
    return concat(parts) if parts else empty_pass(0, num_hops)
