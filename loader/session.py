"""One client connection: its control protocol, its slot ring, and the stream it consumes.

``ControlProtocol`` is the asyncio.Protocol around the sans-IO ``proto.codec`` decoder;
``Session`` holds the per-client state and runs at most one stream (a training epoch or an
evaluation split) at a time. A malformed or unknown message gets an ``Error`` reply and a
disconnect; nothing a client sends can stop the daemon or the other sessions.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from loader.changeset import CachePlan
from loader.eval_stream import EvalAccess
from loader.inmemory import eval_batches_plan, split_stream
from loader.pipeline import EpochDone, TrainPipeline, run_in_pool, run_timed
from loader.publisher import BatchSource, SlotFlow, fill_slot, overflow_message
from loader.sampling import SampledPass
from loader.serving import ServingContext
from loader.trainer_cache import TrainerCache
from proto.codec import FrameDecoder, encode
from proto.errors import ProtocolError, SlotOverflow
from proto.messages import (
    BatchReady,
    Bye,
    Credit,
    EpochEnd,
    Error,
    ErrorCode,
    EvalEnd,
    EvalRequest,
    Message,
    Release,
    StartEpoch,
    Stats,
    StatsRequest,
)
from proto.shm import Segment
from proto.slots import SlotHeader, SlotRing

__all__ = ["Session", "ControlProtocol", "TrainCoordinator", "EVAL_CHUNK_BATCHES"]

log = logging.getLogger("megabatch.session")

EVAL_CHUNK_BATCHES = 32
"""Evaluation batches sampled per kernel call (bounds the sampled-but-unpublished memory)."""


class TrainCoordinator(Protocol):
    """The daemon side a session needs for training streams (one trainer at a time)."""

    async def acquire_pipeline(self, session: "Session", epoch: int) -> TrainPipeline | str: ...

    def finish_pipeline(self, session: "Session", pipeline: TrainPipeline, next_epoch: int | None) -> None: ...


class Session:
    """State of one connected client (lives on the event loop)."""

    def __init__(self, session_id: int, peer: str, ctx: ServingContext, coordinator: TrainCoordinator,
                 segment: Segment, ring: SlotRing, eval_access: Callable[[], EvalAccess],
                 trainer_cache: TrainerCache | None = None) -> None:
        self.id = session_id
        self.peer = peer
        self._ctx = ctx
        self._coordinator = coordinator
        self.segment = segment
        self.ring = ring
        self.flow = SlotFlow(ring.count)
        self._eval_access = eval_access
        self.trainer_cache = trainer_cache
        """The client's feature cache as this session plans it (None: the client has none); it lives as
        long as the session, across epochs, so a reconnecting client starts with an empty cache."""
        self._send: Callable[[Message], None] = lambda msg: None
        self._close: Callable[[], None] = lambda: None
        self._stream: asyncio.Task[None] | None = None
        self._seq = 0
        self._last_epoch = 0
        self.closed = False

    def attach(self, send: Callable[[Message], None], close: Callable[[], None]) -> None:
        self._send, self._close = send, close

    # -- incoming ------------------------------------------------------------------------------
    def handle(self, msg: Message) -> None:
        if isinstance(msg, Credit):
            self.flow.grant(msg.count)
        elif isinstance(msg, Release):
            problem = self.flow.release(msg.slot, msg.seq)
            if problem:
                self.fail(ErrorCode.BAD_MESSAGE, problem)
        elif isinstance(msg, StartEpoch):
            self._start(self._train_stream(msg.epoch), f"epoch {msg.epoch}")
        elif isinstance(msg, EvalRequest):
            self._start(self._eval_stream(msg.split), f"eval {msg.split}")
        elif isinstance(msg, StatsRequest):
            self._send(Stats(self.stats()))
        elif isinstance(msg, Bye):
            self.close()
        elif isinstance(msg, Error):
            log.warning("session %d (%s) reported: %s %s", self.id, self.peer, msg.code, msg.message)
            if msg.fatal:
                self.close()
        else:
            self.fail(ErrorCode.BAD_MESSAGE, f"{msg.TAG} is not a message a client sends")

    def stats(self) -> dict[str, float]:
        return {"session": float(self.id), "slots_in_use": float(self.flow.in_use), "slots": float(self.flow.count),
                "batches_sent": float(self._seq),
                "trainer_cache_rows": float(self.trainer_cache.rows if self.trainer_cache is not None else 0)}

    def _start(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        if self._stream is not None and not self._stream.done():
            coro.close()
            self._send(Error(ErrorCode.BAD_REQUEST, f"cannot start {what}: a stream is still running"))
            return
        stream = asyncio.ensure_future(coro)
        stream.set_name(f"megabatch-session{self.id}-{what}")
        stream.add_done_callback(self._stream_done)
        self._stream = stream

    def _stream_done(self, task: "asyncio.Task[None]") -> None:
        if task.cancelled() or self.closed:
            return
        err = task.exception()
        if err is not None:
            log.error("session %d: stream failed: %s", self.id, err, exc_info=err)
            self.fail(ErrorCode.INTERNAL, f"stream failed: {err}")

    def fail(self, code: str, message: str) -> None:
        """Send a fatal error and disconnect."""
        if code != ErrorCode.INTERNAL:
            self._ctx.metrics.protocol_errors.labels(str(code)).inc()
        log.warning("session %d (%s): %s: %s; disconnecting", self.id, self.peer, code, message)
        self._send(Error(str(code), message))
        self.close()

    # -- outgoing streams ------------------------------------------------------------------------
    async def _publish(self, kind: str, epoch: int, pass_index: int, index: int, num_batches: int,
                       sampled: SampledPass, b: int, source: BatchSource, cache_plan: CachePlan | None = None
                       ) -> bool:
        """Publish batch ``b`` of ``sampled``; with ``cache_plan`` (training batches of a client with a
        feature cache) only the rows the client's cache does not hold are shipped."""
        seq = self._seq
        slot = await self.flow.acquire(seq)
        header = SlotHeader(kind=kind, seq=seq, epoch=epoch, pass_index=pass_index, batch_index=index,
                            num_batches=num_batches)
        t0 = time.perf_counter()
        try:
            if cache_plan is None:
                nbytes = await run_in_pool(self._ctx.cpu_pool, fill_slot, self.ring, slot, header, sampled, b,
                                           source)
            else:
                assert self.trainer_cache is not None
                cached = await run_in_pool(self._ctx.cpu_pool, self.trainer_cache.fill_slot, self.ring, slot,
                                           header, sampled, b, source, cache_plan)
                nbytes = cached.nbytes
                rows = self._ctx.metrics.trainer_cache_rows
                rows.labels("hit").inc(cached.hits)
                rows.labels("shipped").inc(cached.shipped)
        except SlotOverflow as err:
            self.flow.abandon(slot)
            self.fail(ErrorCode.INTERNAL, overflow_message(err))
            return False
        finally:
            self._ctx.metrics.stage_busy.labels("publisher" if kind == "train" else "eval").inc(
                time.perf_counter() - t0)
        self._seq += 1
        self._ctx.metrics.published.labels(kind).inc()
        self._ctx.metrics.published_bytes.inc(nbytes)
        self._send(BatchReady(slot=slot, seq=seq, kind=kind, epoch=epoch, pass_index=pass_index, batch_index=index,
                              num_batches=num_batches))
        return True

    async def _train_stream(self, epoch: int) -> None:
        acquired = await self._coordinator.acquire_pipeline(self, epoch)
        if isinstance(acquired, str):
            self._send(Error(ErrorCode.BAD_REQUEST, acquired))
            return
        pipeline = acquired
        self._last_epoch = epoch
        self._ctx.metrics.epoch.set(epoch)
        finished = False
        try:
            while True:
                item = await pipeline.output.get()
                if pipeline.failure is not None:
                    raise RuntimeError(f"loader pipeline failed: {pipeline.failure}") from pipeline.failure
                if isinstance(item, EpochDone):
                    self._send(EpochEnd(epoch=epoch, batches=item.batches, passes=item.passes))
                    finished = True
                    return
                cache_plan = None
                if self.trainer_cache is not None:
                    # Planned here, not in the pipeline: the pipeline outlives sessions, the plan's
                    # state is this session's. Serial with publishing, and O(superbatch) work.
                    cache_plan = await run_timed(self._ctx.cpu_pool, self._ctx.metrics, "planner",
                                                 self.trainer_cache.plan, item.sampled, item.source)
                for b in range(item.sampled.num_batches):
                    if not await self._publish("train", epoch, item.pass_index, item.first_batch + b,
                                               item.epoch_batches, item.sampled, b, item.source, cache_plan):
                        return
                if item.last_pass and item.release is not None:
                    item.release()
        finally:
            self._coordinator.finish_pipeline(self, pipeline, epoch + 1 if finished else None)

    async def _eval_stream(self, split: str) -> None:
        cfg = self._ctx.config.sampler
        access = self._eval_access()
        try:
            plan = eval_batches_plan(self._ctx.split_ids[split], cfg.eval_batch_size, cfg.seed,
                                     split_stream(split))
            total = len(plan.keys)
            source = access.source
            for first in range(0, total, EVAL_CHUNK_BATCHES):
                last = min(total, first + EVAL_CHUNK_BATCHES)
                seeds = plan.seeds[first * cfg.eval_batch_size:last * cfg.eval_batch_size]
                t0 = time.perf_counter()
                sampled = await run_in_pool(self._ctx.cpu_pool, access.sample, seeds, cfg.eval_batch_size,
                                                     cfg.eval_fanouts, plan.keys[first:last])
                self._ctx.metrics.stage_busy.labels("eval").inc(time.perf_counter() - t0)
                for b in range(sampled.num_batches):
                    if not await self._publish(split, self._last_epoch, 0, first + b, total, sampled, b, source):
                        return
            self._send(EvalEnd(split=split, batches=total))
        finally:
            access.close()

    # -- teardown ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the stream, wake the publisher, close the connection; the segment goes in ``dispose``."""
        if self.closed:
            return
        self.closed = True
        self.flow.close()
        if self._stream is not None:
            self._stream.cancel()
        self._close()

    async def dispose(self) -> None:
        """Wait for the stream to stop, then unmap the slots (the memfd is freed with the last mapping)."""
        if self._stream is not None:
            await asyncio.gather(self._stream, return_exceptions=True)
            # a cancelled or failed task keeps its traceback, whose frames hold views of a slot
            self._stream = None
        # the ring's views are exports of the mapping: while they live, close() cannot unmap and the
        # memfd's pages stay charged to the daemon however long this Session object lingers
        self.ring.close()
        self.segment.close()


class ControlProtocol(asyncio.Protocol):
    """Bytes in -> messages -> ``Session.handle``; messages out -> ``transport.write``."""

    def __init__(self, session: Session, decoder: FrameDecoder, on_lost: Callable[[Session], None]) -> None:
        self.session = session
        self._decoder = decoder
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self.session.attach(self._write, self._close)

    def _write(self, msg: Message) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode(msg))

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self.session.closed:
            return
        try:
            messages = self._decoder.feed(data)
        except ProtocolError as err:
            self.session.fail(err.code, err.message)
            return
        for msg in messages:
            if self.session.closed:
                break
            self.session.handle(msg)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.session.close()
        self._on_lost(self.session)
