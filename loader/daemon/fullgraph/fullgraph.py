"""The full-graph training modes: every mini-batch sampled over the whole graph, as in ``--mode inmemory``.

The modes ("exact", "static", "staged", "hybrid", "mmap", "inmemory") share the batch plan of the in-memory
reference (``epoch_batches_inmemory``: every training node once per epoch, same seeds, same
keys) and its sampler semantics, so their batches are identical; they differ only in where
neighbour lists and feature rows come from. A ``FullGraphMode`` supplies exactly that:

* ``sample``: sample a superbatch (a run of consecutive batches of the epoch) over the full graph;
* ``start_stream``: a training stream's ``rows_for``, which turns each sampled superbatch into the
  ``RowSource`` the publisher fills its batches' rows from (for the exact mode, a Belady cache plan).

Stages, wired in ``start_fullgraph_pipeline`` and joined by bounded queues::

    sampler (superbatch k+1) -> planner (superbatch k) -> publisher (superbatch k-1, in the session)

so sampling, cache planning and gathering of consecutive superbatches overlap (Ginex's
superbatch-level pipeline). A link dataset's sampler stage makes link batches instead
(``loader.daemon.link_serving``); the planner and publisher are the same.
At most ``SUPERBATCHES_IN_FLIGHT`` superbatches exist at once: the
sampler takes a token per superbatch and the publisher hands it back after its last batch, so a
slow trainer stalls the sampler and memory stays what the plan charged.
"""

import asyncio
import dataclasses
import itertools
import threading
from abc import abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from loader.daemon.config import LoaderConfig
from loader.daemon.link_serving import sample_link_steps
from loader.daemon.mode import TrainingMode
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import RowSource, SlotSource
from loader.daemon.stages import EpochDone, SampledWork, TrainPipeline, run_timed
from loader.sampling.inmemory import shuffle_key
from loader.sampling.link_sampling import PassLinkLabels, link_batch_plan
from loader.sampling.ranks import LocalRanks, Pieces, deal_pieces, piece_keys, sample_pieces
from loader.sampling.sampling import SampledBatches, SampledPass, shuffle

__all__ = ["FullGraphMode", "RowsFor", "SampledSuperbatch", "start_fullgraph_pipeline",
           "SUPERBATCHES_IN_FLIGHT"]

SUPERBATCHES_IN_FLIGHT = 3
"""One being sampled, one planned, one being published: sampling k+1 overlaps planning k and gathering k-1."""


class FullGraphMode(TrainingMode):
    """A full-graph mode: where it samples neighbour lists and reads rows (both run on the CPU pool)."""

    superbatch: int
    """Batches sampled per ``sample`` call."""
    default_superbatch: ClassVar[int] = 64
    """``[fullgraph] superbatch`` where the config leaves it unset (a mode may choose its own)."""
    planner_pool: ThreadPoolExecutor | None = None
    """Where the planner stage runs (None: the CPU pool). A mode whose planner mostly waits on the disk
    gives it a thread of its own, so that the sampler and the publisher keep the CPU pool's two."""

    def __init__(self, serving: ServingContext) -> None:
        self.serving = serving

    @classmethod
    def superbatch_for(cls, config: LoaderConfig) -> int:
        """``[fullgraph] superbatch``, or this mode's default where the config leaves it unset."""
        configured = config.fullgraph.superbatch
        return cls.default_superbatch if configured is None else configured

    @abstractmethod
    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        """Sample consecutive batches (``loader.sampling.sampling.sample_pass`` semantics, dataset ids as local ids)."""

    @abstractmethod
    def start_stream(self, stopped: threading.Event) -> "RowsFor":
        """A new training stream starts (the previous one may have stopped mid-superbatch): reset what
        the publisher side holds and return the stream's own ``rows_for``, called in superbatch order
        by its planner stage. State between superbatches lives in what it returns, not in the mode,
        so a stopped stream's late planner cannot corrupt the next stream's. ``stopped`` is set when the
        stream stops: a ``rows_for`` that runs long (a staging pass) checks it and gives up."""

    def sample_superbatch(self, order: np.ndarray, pieces: Pieces, batch_size: int, keys: np.ndarray,
                          fanouts: tuple[int, ...]) -> SampledBatches:
        """Piece i of ``pieces`` (seeds of ``order``) sampled with ``keys[i]`` as batch i of one superbatch (the
        sampler stage's work; a mode that keeps superbatches elsewhere than in RAM overrides it)."""
        def sample(seeds: np.ndarray, size: int, piece_keys: np.ndarray) -> SampledPass:
            return self.sample(seeds, size, fanouts, piece_keys)

        return sample_pieces(sample, order, pieces, batch_size, keys, len(fanouts))

    def start_pipeline(self, start_epoch: int, local: LocalRanks) -> TrainPipeline:
        return start_fullgraph_pipeline(self.serving, self, start_epoch, local)

    def summary(self) -> str:
        return f"mode {self.name}"

    def slot_source(self, rows: RowSource) -> SlotSource:
        """A source over dataset ids (local id = dataset id in the full-graph modes)."""
        s = self.serving
        return s.slot_source(rows, s.labels, None)


RowsFor = Callable[[SampledBatches], RowSource]
"""A training stream's planner step: a sampled superbatch -> the rows its batches are filled from."""


@dataclass(frozen=True)
class SampledSuperbatch:
    """Sampler -> planner: steps ``first_batch ..`` of an epoch of ``epoch_batches`` (batches, for one rank)."""

    epoch: int
    first_batch: int
    epoch_batches: int
    sampled: SampledBatches
    member: np.ndarray | None
    global_size: np.ndarray | None
    link_labels: PassLinkLabels | None = None
    """A link dataset's superbatch: each batch's supervision pairs (``loader.daemon.link_serving``)."""


async def _sampler(ctx: ServingContext, mode: FullGraphMode, start_epoch: int, local: LocalRanks,
                   tokens: asyncio.Semaphore, out: "asyncio.Queue[SampledSuperbatch | EpochDone]") -> None:
    cfg = ctx.config.sampler
    train = ctx.split_ids["train"]
    # a superbatch holds whole steps (every local rank's piece of each), about `superbatch` batches: the
    # Belady plan of the exact mode then covers all local ranks' batches in the order they are published
    steps_per_superbatch = max(1, mode.superbatch // local.count)

    for epoch in itertools.count(start_epoch):
        # the single process's seed order (epoch_batches_inmemory), dealt to the job's ranks
        order = shuffle(np.ascontiguousarray(train, dtype=np.int64), shuffle_key(cfg.seed, epoch))
        pieces = deal_pieces(len(order), cfg.batch_size, local)
        total = pieces.num_steps
        for first in range(0, total, steps_per_superbatch):
            last = min(total, first + steps_per_superbatch)
            part = pieces.steps(first, last)
            keys = piece_keys(cfg.seed, epoch, local, first, last - first)
            await tokens.acquire()  # given back by the publisher once the superbatch's last batch is out
            sampled = await run_timed(ctx.cpu_pool, ctx.metrics, "sampler", mode.sample_superbatch, order, part,
                                      cfg.batch_size, keys, cfg.sampled_fanouts)
            await out.put(SampledSuperbatch(epoch, first, total, sampled,
                                            part.member if local.several else None,
                                            part.global_size if local.several else None))
        await out.put(EpochDone(epoch, total, 1))


async def _link_sampler(ctx: ServingContext, mode: FullGraphMode, start_epoch: int, local: LocalRanks,
                        tokens: asyncio.Semaphore, out: "asyncio.Queue[SampledSuperbatch | EpochDone]") -> None:
    """A link dataset's training stream: epoch e's ``link_batch_plan`` over the training positives in global
    batches of ``batch_size`` x W, ``superbatch`` of them at a time, each rank's piece sampled through the mode
    (``link_serving.sample_link_steps``)."""
    link = ctx.link
    assert link is not None
    cfg = ctx.config.sampler
    num_nodes = len(ctx.labels)
    for epoch in itertools.count(start_epoch):
        plan = link_batch_plan(link.train_positives, cfg.batch_size * local.world_size, cfg.seed, epoch)
        total = plan.num_batches
        # a superbatch's batches, all ranks' pieces together, stay within what the memory plan charges
        steps = max(1, mode.superbatch // local.count)
        for first in range(0, total, steps):
            last = min(total, first + steps)
            await tokens.acquire()  # given back by the publisher once the superbatch's last batch is out
            done = await run_timed(ctx.cpu_pool, ctx.metrics, "sampler", sample_link_steps, mode.sample, link, plan,
                                   first, last, num_nodes, cfg.sampled_fanouts, local, cfg.seed, epoch)
            await out.put(SampledSuperbatch(epoch, first, total, done.sampled, done.member, done.global_size,
                                            done.labels))
        await out.put(EpochDone(epoch, total, 1))


async def _planner(ctx: ServingContext, mode: FullGraphMode, rows_for: RowsFor, tokens: asyncio.Semaphore,
                   inp: "asyncio.Queue[SampledSuperbatch | EpochDone]", out: "asyncio.Queue[SampledWork | EpochDone]"
                   ) -> None:
    while True:
        item = await inp.get()
        if isinstance(item, EpochDone):
            await out.put(item)
            continue
        rows = await run_timed(mode.planner_pool or ctx.cpu_pool, ctx.metrics, "planner", rows_for, item.sampled)
        source = mode.slot_source(rows)
        if item.link_labels is not None:
            source = dataclasses.replace(source, link_labels=item.link_labels)
        # a superbatch is one pass; its token goes back once its last batch is published
        await out.put(SampledWork(source=source, release=tokens.release, pass_index=0,
                                  sampled=item.sampled, first_batch=item.first_batch,
                                  epoch_batches=item.epoch_batches, last_pass=True, member=item.member,
                                  global_size=item.global_size))


def start_fullgraph_pipeline(ctx: ServingContext, mode: FullGraphMode, start_epoch: int, local: LocalRanks
                             ) -> TrainPipeline:
    """Create the queues and stage tasks of a full-graph training stream starting at ``start_epoch`` for
    ``local``'s ranks."""
    # Superbatches alive at once (sampled, planned, being published), whatever the queues hold:
    # the memory plan charges exactly this many.
    tokens = asyncio.Semaphore(SUPERBATCHES_IN_FLIGHT)
    sampled: asyncio.Queue[SampledSuperbatch | EpochDone] = asyncio.Queue(maxsize=1)
    output: asyncio.Queue[SampledWork | EpochDone] = asyncio.Queue(maxsize=1)
    for name, queue in (("sampled", sampled), ("planned", output)):
        ctx.metrics.watch_queue(name, queue)  # type: ignore[arg-type]
    pipeline = TrainPipeline(start_epoch, output)
    # the planner's job, on a thread, learns of the stream's stop from ``stopping`` (a cancel cannot reach it)
    rows_for = mode.start_stream(pipeline.stopping)
    if ctx.link is None:
        pipeline.add_stage("sampler", _sampler(ctx, mode, start_epoch, local, tokens, sampled))
    else:
        pipeline.add_stage("sampler", _link_sampler(ctx, mode, start_epoch, local, tokens, sampled))
    pipeline.add_stage("planner", _planner(ctx, mode, rows_for, tokens, sampled, output))
    return pipeline

