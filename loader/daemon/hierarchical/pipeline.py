"""The training pipeline: scheduler -> disk reader -> assembler -> superbatch sampler -> (publisher).

``start_train_pipeline`` wires every stage, queue and bound in one place; nothing rewires it
later. Bounded queues give backpressure; the two mega-batch buffers circulate through
``free_buffers`` (double buffering: the reader fills one while the other is sampled and
published) and come back only when the publisher has gathered the last batch of their last pass.
The publisher lives with the client session (``loader.daemon.publisher``) and reads ``output``.
"""

import asyncio
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from loader.daemon.config import LoaderConfig
from loader.daemon.hierarchical.arena import FeatureArena, MegaBatchBuffer
from loader.daemon.hierarchical.assemble import MegaBatch, assemble
from loader.daemon.hierarchical.coverage import (
    EVERYTHING_SET,
    WARN_EVERY,
    EpochQuality,
    NeighbourSlots,
    QualityKnobs,
    WarningStreaks,
    neighbour_slots,
)
from loader.daemon.hierarchical.reader import LoadedMegaBatch, PartitionReader
from loader.daemon.hierarchical.schedule import LabelMix, ScheduledMegaBatch, schedule_epoch
from loader.daemon.hierarchical.swap_schedule import swap_schedule
from loader.daemon.link_serving import LINK_PASS_BATCHES, LinkServing, link_states, sample_link_state
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.resident import ResidentData
from loader.daemon.slot_source import OffsetRows, SlotSource, coded_rows
from loader.daemon.stages import EpochDone, SampledWork, TrainPipeline, run_timed
from loader.format.feature_codec import FeatureCodec
from loader.sampling.ranks import LocalRanks, deal_pieces, even_batch_size, num_steps, piece_keys, sample_pieces
from loader.sampling.sampling import CSCGraph, SampledPass, batch_keys, sample_pass, shuffle
from proto.sizes import counted

__all__ = ["PipelineContext", "start_train_pipeline", "epoch_batch_count", "STREAM_MEGABATCH_SHUFFLE"]

log = logging.getLogger("megabatch.pipeline")

STREAM_MEGABATCH_SHUFFLE = 16
"""batch_keys stream of the per-pass seed shuffle inside a mega-batch (train/val/test use 0-2)."""

@dataclass(frozen=True)
class PipelineContext:
    """What the stages share: resolved once at startup, read-only afterwards (but ``warning_streaks``)."""

    config: LoaderConfig
    resident: ResidentData
    arena: FeatureArena
    reader: PartitionReader
    metrics: DaemonMetrics
    cpu_pool: ThreadPoolExecutor
    partitions_per_megabatch: int
    label_counts: np.ndarray
    """float64 (P, C): training labels per partition; the balanced schedule and the label skew read it."""
    knobs: QualityKnobs = EVERYTHING_SET
    """Where the settings a quality warning could name stand (it names only those not set)."""
    link: LinkServing | None = None
    """A link dataset: mega-batches are the states of its buffer order (``link_serving.link_states``)."""
    codec: FeatureCodec | None = None
    """8-bit feature codes: the arena holds codes, decoded as a slot is written (``ServingContext.codec``)."""
    warning_streaks: WarningStreaks = field(default_factory=WarningStreaks)
    """The one mutable member: which quality warnings are logged, across the pipelines of the daemon's life."""

    @functools.cached_property
    def label_mix(self) -> LabelMix:
        """``label_counts`` with the epoch's totals summed once, not per mega-batch."""
        return LabelMix(self.label_counts)

    @functools.cached_property
    def train_partition(self) -> np.ndarray:
        """int64: the partition of each training node (``resident.split_ids["train"]``'s order)."""
        return self.resident.partitions.partition_of(self.resident.split_ids["train"]).astype(np.int64, copy=False)

    def schedule(self, epoch: int) -> list[ScheduledMegaBatch]:
        """A node task's mega-batches of ``epoch``, by ``[hierarchy] formation`` and ``schedule``."""
        cfg = self.config
        balanced = self.label_counts if cfg.hierarchy.schedule == "balanced" else None
        num_partitions = len(self.resident.partitions)
        if cfg.hierarchy.formation == "comet":
            return swap_schedule(num_partitions, self.partitions_per_megabatch, cfg.sampler.seed, epoch,
                                 self.resident.split_ids["train"], self.train_partition, balanced)
        return schedule_epoch(num_partitions, self.partitions_per_megabatch, cfg.sampler.seed, epoch, balanced)


def epoch_batch_count(resident: ResidentData, schedule: list[ScheduledMegaBatch], batch_size: int, passes: int,
                      world_size: int = 1) -> int:
    """Steps of an epoch with a fixed number of passes: each pass deals a mega-batch's n seeds to
    ``world_size`` ranks in ceil(n / (world_size * B)) steps (batches, for a single rank)."""
    parts = resident.partitions
    total = 0
    train_sorted = resident.split_ids["train"]
    for scheduled in schedule:
        if scheduled.train_nodes is not None:
            seeds = len(scheduled.train_nodes)
        else:
            seeds = int(parts.take(scheduled.partitions).count_in(train_sorted).sum())
        total += num_steps(seeds, batch_size, world_size)
    return total * passes


T = TypeVar("T")


async def _timed(ctx: PipelineContext, stage: str, func: Callable[..., T], *args: object) -> T:
    return await run_timed(ctx.cpu_pool, ctx.metrics, stage, func, *args)


async def _scheduler(ctx: PipelineContext, start_epoch: int, local: LocalRanks,
                     schedule_queue: "asyncio.Queue[ScheduledMegaBatch]") -> None:
    cfg = ctx.config
    for epoch in itertools.count(start_epoch):
        t0 = time.perf_counter()
        if ctx.link is not None:
            # off the event loop: an epoch's plan splits every training edge among its states (seconds on millions)
            states, total = await _timed(ctx, "scheduler", link_states, ctx.link, ctx.resident.partitions,
                                         ctx.partitions_per_megabatch, cfg.sampler.batch_size, cfg.sampler.seed,
                                         epoch, local.world_size)
            for index, (partitions, work) in enumerate(states):
                await schedule_queue.put(ScheduledMegaBatch(epoch, index, len(states), partitions, total, work))
            continue
        schedule = ctx.schedule(epoch)
        if cfg.hierarchy.passes is not None:
            total = epoch_batch_count(ctx.resident, schedule, cfg.sampler.batch_size, cfg.hierarchy.passes,
                                      local.world_size)
            schedule = [dataclasses.replace(scheduled, epoch_batches=total) for scheduled in schedule]
        ctx.metrics.stage_busy.labels("scheduler").inc(time.perf_counter() - t0)
        for scheduled in schedule:
            await schedule_queue.put(scheduled)


async def _reader(ctx: PipelineContext, schedule_queue: "asyncio.Queue[ScheduledMegaBatch]",
                  free: "asyncio.Queue[MegaBatchBuffer]", loaded: "asyncio.Queue[LoadedMegaBatch]") -> None:
    while True:
        scheduled = await schedule_queue.get()
        buffer = await free.get()
        t0 = time.perf_counter()
        result = await ctx.reader.load(scheduled, buffer)
        ctx.metrics.stage_busy.labels("reader").inc(time.perf_counter() - t0)
        await loaded.put(result)


async def _assembler(ctx: PipelineContext, loaded: "asyncio.Queue[LoadedMegaBatch]",
                     ready: "asyncio.Queue[MegaBatch]") -> None:
    while True:
        item = await loaded.get()
        mb = await _timed(ctx, "assembler", assemble, item, ctx.resident, ctx.arena)
        m = ctx.metrics
        m.mb_loaded.inc()
        m.mb_load_seconds.observe(mb.load_seconds)
        m.mb_bytes.set(mb.bytes_read)
        at = mb.scheduled
        log.debug("mega-batch %d/%d of epoch %d: %d partitions, %d nodes (%d static joined), %d edges, %d seeds, "
                  "%.3f s", at.index + 1, at.count, at.epoch, len(at.partitions), mb.num_nodes, mb.static_extra,
                  mb.num_edges, len(mb.train_seeds), mb.load_seconds)
        await ready.put(mb)


def seed_labels(ctx: PipelineContext, mb: MegaBatch) -> np.ndarray:
    """float64 (C,): the training labels a mega-batch trains, per class: its partitions' (counted once per
    run), or, for a buffer state that trains a subset of them (``formation = "comet"``), its seeds'."""
    if mb.scheduled.train_nodes is None:
        return ctx.label_mix.group_counts(mb.scheduled.partitions)
    return ctx.label_mix.seed_counts(mb.labels[mb.train_seeds])


def megabatch_source(ctx: PipelineContext, mb: MegaBatch) -> SlotSource:
    """Rows of a mega-batch's batches: gathered from the arena (its buffer and the static region, and its
    partitions' x_agg rows where it holds them); with ``[hierarchy] label_prior_loss``, the class weights of its
    partitions' label mix."""
    arena = ctx.arena
    static = ctx.resident.static.features
    weight = ctx.label_mix.class_weight(seed_labels(ctx, mb)) if ctx.config.hierarchy.label_prior_loss else None
    held = None if mb.aggregate_offsets is None else OffsetRows(arena.data, arena.row_bytes, mb.aggregate_offsets)
    rows = coded_rows(OffsetRows(arena.data, arena.row_bytes, mb.row_offsets), ctx.codec, int(static.shape[1]))
    return SlotSource(rows, mb.labels, mb.graph.global_ids, int(static.shape[1]),
                      static.dtype if ctx.codec is None else np.dtype(np.float32), class_weight=weight,
                      aggregates=held)


@dataclass(frozen=True)
class DealtPass:
    """A pass sampled for a job's local ranks: its batches (step-major), steps, and per batch the rank
    (position in ``LocalRanks.ranks``) and the global batch's seed count."""

    sampled: SampledPass
    steps: int
    member: np.ndarray
    global_size: np.ndarray


def _sample_measured(graph: CSCGraph, seeds: np.ndarray, local: LocalRanks, batch_size: int,
                     fanouts: tuple[int, ...], seed: int, epoch: int, first_step: int,
                     full_degree: np.ndarray | None) -> tuple[DealtPass, NeighbourSlots | None]:
    """The pass's pieces for ``local``'s ranks (``seeds`` dealt from step ``first_step`` of the epoch)
    sampled, plus the pass's neighbour slots when ``full_degree`` is given (the first pass)."""
    # a mega-batch's seeds in nearly equal batches: its plain cut ends in a short one (even_batch_size)
    batch_size = even_batch_size(len(seeds), batch_size, local.world_size)
    pieces = deal_pieces(len(seeds), batch_size, local)
    keys = piece_keys(seed, epoch, local, first_step, pieces.num_steps)

    def sample(piece_seeds: np.ndarray, size: int, piece_keys_: np.ndarray) -> SampledPass:
        return sample_pass(graph, piece_seeds, size, fanouts, piece_keys_)

    sampled = sample_pieces(sample, seeds, pieces, batch_size, keys, len(fanouts))
    slots = None if full_degree is None else neighbour_slots(sampled, full_degree, fanouts)
    return DealtPass(sampled, pieces.num_steps, pieces.member, pieces.global_size), slots


def _report_epoch(ctx: PipelineContext, epoch: int, quality: EpochQuality) -> None:
    m = ctx.metrics
    m.epoch_coverage.set(quality.coverage)
    m.epoch_label_skew.set(quality.skew)
    m.epoch_label_skew_excess.set(quality.excess)
    log.info("epoch %d: neighbour coverage %.3f, label skew %.3f (%.3f by chance) over %s of %s", epoch,
             quality.coverage, quality.skew, quality.chance, counted(quality.megabatches, "mega-batch"),
             counted(ctx.partitions_per_megabatch, "partition"))
    warnings = quality.warnings(ctx.knobs)
    logged = ctx.warning_streaks.to_log(set(warnings))
    for kind, warning in warnings.items():
        m.quality_warnings.labels(kind).inc()
        if kind in logged:
            log.warning("epoch %d: %s (logged again every %d epochs while it holds)", epoch, warning, WARN_EVERY)


def _epoch_published(ctx: PipelineContext, epoch: int, quality: EpochQuality, release: Callable[[], None]) -> None:
    """The release of an epoch's last pass: its mega-batch's buffer back, then the epoch's report."""
    release()
    _report_epoch(ctx, epoch, quality)


async def _sampler(ctx: PipelineContext, start_epoch: int, local: LocalRanks, ready: "asyncio.Queue[MegaBatch]",
                   output: "asyncio.Queue[SampledWork | EpochDone]",
                   release: Callable[[MegaBatchBuffer], None]) -> None:
    cfg = ctx.config
    fixed_passes = cfg.hierarchy.passes
    batch_size = cfg.sampler.batch_size
    epoch, batch_in_epoch, passes_in_epoch = start_epoch, 0, 0
    quality = EpochQuality()
    while True:
        mb = await ready.get()
        if mb.scheduled.epoch != epoch:
            raise RuntimeError(f"pipeline out of order: mega-batch of epoch {mb.scheduled.epoch} while in {epoch}")
        epoch_batches = mb.scheduled.epoch_batches
        ctx.metrics.mb_nodes.set(mb.num_nodes)
        ctx.metrics.mb_edges.set(mb.num_edges)
        source = megabatch_source(ctx, mb)
        work = mb.scheduled.link
        if work is not None:  # a buffer state: its edge buckets' batches (each edge once an epoch), in passes
            assert ctx.link is not None
            # a pass's batches, every local rank's pieces together, stay within what the memory plan charges
            steps = max(1, LINK_PASS_BATCHES // local.count)
            for pass_index, begin in enumerate(range(0, work.num_batches, steps)):
                chunk = work.chunk(begin, min(work.num_batches, begin + steps))
                last = begin + steps >= work.num_batches
                link_steps = await _timed(ctx, "sampler", sample_link_state, mb.graph, ctx.link, chunk,
                                          cfg.sampler.sampled_fanouts, local, cfg.sampler.seed, epoch,
                                          ctx.resident.partitions)
                await output.put(SampledWork(source=dataclasses.replace(source, link_labels=link_steps.labels),
                                             release=functools.partial(release, mb.buffer) if last else None,
                                             pass_index=pass_index, sampled=link_steps.sampled,
                                             first_batch=chunk.first_batch, epoch_batches=epoch_batches,
                                             last_pass=last, member=link_steps.member,
                                             global_size=link_steps.global_size))
            if mb.scheduled.is_last:
                await output.put(EpochDone(epoch, epoch_batches, mb.scheduled.count))
                epoch += 1
            continue
        for pass_index in itertools.count():
            key = int(batch_keys(cfg.sampler.seed, STREAM_MEGABATCH_SHUFFLE, epoch, pass_index, mb.scheduled.index,
                                 1)[0])
            seeds = shuffle(mb.train_seeds, key)
            # later passes over the same mega-batch lose what the first did: measure once per mega-batch
            dealt, slots = await _timed(ctx, "sampler", _sample_measured, mb.graph, seeds, local, batch_size,
                                        cfg.sampler.sampled_fanouts, cfg.sampler.seed, epoch, batch_in_epoch,
                                        mb.full_degree if pass_index == 0 else None)
            sampled, n_batches = dealt.sampled, dealt.steps
            if slots is not None:
                skew = ctx.label_mix.of(seed_labels(ctx, mb))
                quality.add(slots, skew, len(seeds))
                ctx.metrics.mb_coverage.set(slots.filled / slots.full if slots.full else 1.0)
                ctx.metrics.mb_label_skew.set(skew.skew)
                ctx.metrics.neighbour_slots.labels("filled").inc(slots.filled)
                ctx.metrics.neighbour_slots.labels("lost").inc(slots.full - slots.filled)
            if fixed_passes is not None:
                last = pass_index + 1 >= fixed_passes
            else:
                # Appendix B: reuse while the next mega-batch is still loading (p <= T_load / T_comp), capped
                last = (pass_index + 1 >= cfg.hierarchy.max_passes or not ready.empty() or mb.scheduled.is_last
                        or n_batches == 0)
            ctx.metrics.pass_index.set(pass_index)
            hand_back = functools.partial(release, mb.buffer)
            if last and mb.scheduled.is_last:
                # the sampler runs up to an epoch ahead of the trainer: an epoch is reported once its last batch
                # is published, or a run's log would end on an epoch nobody trained
                hand_back = functools.partial(_epoch_published, ctx, epoch, quality, hand_back)
            await output.put(SampledWork(source=source, release=hand_back,
                                         pass_index=pass_index, sampled=sampled,
                                         first_batch=batch_in_epoch, epoch_batches=epoch_batches, last_pass=last,
                                         member=dealt.member if local.several else None,
                                         global_size=dealt.global_size if local.several else None))
            batch_in_epoch += n_batches
            passes_in_epoch += 1
            if last:
                ctx.metrics.passes.set(pass_index + 1)
                break
        if mb.scheduled.is_last:
            await output.put(EpochDone(epoch, batch_in_epoch, passes_in_epoch))
            epoch, batch_in_epoch, passes_in_epoch = epoch + 1, 0, 0
            quality = EpochQuality()


def start_train_pipeline(ctx: PipelineContext, start_epoch: int, local: LocalRanks) -> TrainPipeline:
    """Create the queues and stage tasks of a training stream starting at ``start_epoch`` for ``local``'s ranks."""
    schedule_queue: asyncio.Queue[ScheduledMegaBatch] = asyncio.Queue(maxsize=2)
    loaded: asyncio.Queue[LoadedMegaBatch] = asyncio.Queue(maxsize=1)
    ready: asyncio.Queue[MegaBatch] = asyncio.Queue(maxsize=1)
    output: asyncio.Queue[SampledWork | EpochDone] = asyncio.Queue(maxsize=1)
    free: asyncio.Queue[MegaBatchBuffer] = asyncio.Queue(maxsize=len(ctx.arena.buffers))
    for buffer in ctx.arena.buffers:
        free.put_nowait(buffer)
    for name, queue in (("plans", schedule_queue), ("loaded", loaded), ("ready", ready), ("sampled", output),
                        ("free_buffers", free)):
        ctx.metrics.watch_queue(name, queue)  # type: ignore[arg-type]
    pipeline = TrainPipeline(start_epoch, output)
    pipeline.add_stage("scheduler", _scheduler(ctx, start_epoch, local, schedule_queue))
    pipeline.add_stage("reader", _reader(ctx, schedule_queue, free, loaded))
    pipeline.add_stage("assembler", _assembler(ctx, loaded, ready))
    pipeline.add_stage("sampler", _sampler(ctx, start_epoch, local, ready, output, free.put_nowait))
    return pipeline
