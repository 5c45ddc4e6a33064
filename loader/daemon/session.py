"""One client connection: its control protocol, its slot ring, and the stream it consumes.

``ControlProtocol`` is the asyncio.Protocol around the sans-IO ``proto.codec`` decoder;
``Session`` holds the per-client state and runs at most one stream (a training epoch or an
evaluation split) at a time. A malformed or unknown message gets an ``Error`` reply and a
disconnect; nothing a client sends can stop the daemon or the other sessions. A client that stops
consuming is bounded too: a stream that waits ``[server] stall_timeout`` for a slot and a client that
leaves the replies unread (the write buffer is capped and reading pauses meanwhile) are evicted with
``Error("timeout")``. Training epochs come from the session's job (``loader.daemon.jobs``; a lone
trainer is a job of one rank), which publishes them through ``publish_train``.
When the daemon stops, ``begin_shutdown`` ends the stream and sends ``Shutdown``; the batches already
announced stay valid until the client releases them (``drained`` tells the daemon when none is held).
"""

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from loader.caches.changeset import CachePlan
from loader.daemon.eval_stream import EvalAccess
from loader.daemon.jobs import JobFailed, JobRank
from loader.daemon.peers import peer_hung_up
from loader.daemon.publisher import SlotFlow, fill_slot, overflow_message
from loader.daemon.read_metrics import ClientInfo
from loader.daemon.serving import ServingContext
from loader.daemon.slot_source import SlotSource
from loader.daemon.stages import SampledWork, TrainPipeline, run_in_pool, user_cause
from loader.daemon.trainer_cache import TrainerCache
from loader.format.read_checks import CorruptData
from loader.sampling.inmemory import eval_split_batches, split_stream
from loader.sampling.link_sampling import STREAM_LINK_TEST, STREAM_LINK_VAL, HeldOutShares
from loader.sampling.ranks import deal_eval
from loader.sampling.sampling import SampledBatches
from proto.codec import FrameDecoder, encode
from proto.errors import ProtocolError, SlotOverflow
from proto.messages import (
    BatchId,
    BatchReady,
    Bye,
    Credit,
    Error,
    ErrorCode,
    EvalEnd,
    EvalRequest,
    Message,
    Queued,
    Release,
    Shutdown,
    StartEpoch,
    Stats,
    StatsRequest,
)
from proto.shm import Segment
from proto.slots import SlotRing

__all__ = ["Session", "ControlProtocol", "EVAL_CHUNK_BATCHES", "WRITE_BUFFER_HIGH",
           "WRITE_BUFFER_LOW", "CLOSE_GRACE", "LOGGABLE_CHARS", "loggable"]

log = logging.getLogger("megabatch.session")

_LINK_EVAL_STREAMS = {"val": STREAM_LINK_VAL, "test": STREAM_LINK_TEST}

EVAL_CHUNK_BATCHES = 32
"""Evaluation batches sampled per kernel call (bounds the sampled-but-unpublished memory)."""

WRITE_BUFFER_HIGH = 64 * 1024
"""Unsent bytes of one session at which the daemon stops reading that client (asyncio's default high-water
mark). A client that reads its messages never gets near it: the daemon sends at most one BatchReady per
slot plus the replies to its requests."""
WRITE_BUFFER_LOW = 16 * 1024
"""Unsent bytes below which reading resumes."""

CLOSE_GRACE = 5.0
"""Seconds a closing connection may take to flush its last messages before it is aborted."""

LOGGABLE_CHARS = 120
"""Characters of a client-provided string (its name, an error text) kept in a log line."""


def loggable(text: str, limit: int = LOGGABLE_CHARS) -> str:
    """``text`` from a client made safe for one log line: backslashes and every non-printable character
    (control, format, line and paragraph separators) escaped, so a newline or a terminal escape in a
    client's name cannot forge or repaint log lines, and cut after ``limit`` characters of output."""
    out: list[str] = []
    size = 0
    for i, ch in enumerate(text):
        if ch == "\\":
            piece = "\\\\"
        elif ch.isprintable():
            piece = ch
        else:
            code = ord(ch)
            piece = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        if size + len(piece) > limit:
            out.append(f"... ({len(text) - i} more characters)")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


class Session:
    """State of one connected client (lives on the event loop)."""

    def __init__(self, session_id: int, peer: str, ctx: ServingContext, segment: Segment, ring: SlotRing,
                 eval_access: Callable[[], EvalAccess], trainer_cache: TrainerCache | None = None) -> None:
        self.job: JobRank | None = None
        """Set by the daemon at the handshake: the job the session is a rank of (a lone trainer's is its own)."""
        self.queues = False
        """The client waits in the training queue when the pipeline is busy (``Hello.queue``)."""
        self.micro_batches = 0
        """The client's micro-batches per training batch (``Hello.micro_batches``): above 1, its training batches
        carry their seeds' groups."""
        self.client_info: ClientInfo | None = None
        """Set by the daemon once the session has joined its job: who the client is (``megabatch_client_info``)."""
        self.id = session_id
        self.peer = peer
        self._ctx = ctx
        self.segment = segment
        self.ring = ring
        self.flow = SlotFlow(ring.count)
        self._eval_access = eval_access
        self.trainer_cache = trainer_cache
        """The client's feature cache as this session plans it (None: the client has none); it lives as
        long as the session, across epochs, so a reconnecting client starts with an empty cache."""
        self._send: Callable[[Message], None] = lambda msg: None
        self._close: Callable[[], None] = lambda: None
        self._peer_hung_up: Callable[[], bool] = lambda: False
        self._stream: asyncio.Task[None] | None = None
        self._seq = 0
        self._last_epoch = 0
        self.stall_timeout = ctx.config.server.stall_timeout
        self.output_paused = False
        """True while the daemon has more than ``WRITE_BUFFER_HIGH`` bytes unsent to this client and has
        stopped reading from it (``ControlProtocol.pause_writing``)."""
        self.output_pauses = 0
        """Times the session's output went over ``WRITE_BUFFER_HIGH``."""
        self.closed = False
        self.shutting_down = False
        """Set by ``begin_shutdown``: no new stream starts and no new batch is published."""
        self.drained = asyncio.Event()
        """Set once the daemon's drain need not wait for this session: it is closed, or it is shutting down,
        its stream is over and the client holds no slot."""

    @property
    def streaming(self) -> bool:
        """Whether a stream (training or evaluation) is running."""
        return self._stream is not None and not self._stream.done()

    def attach(self, send: Callable[[Message], None], close: Callable[[], None],
               peer_hung_up: Callable[[], bool] = lambda: False) -> None:
        self._send, self._close, self._peer_hung_up = send, close, peer_hung_up

    def hung_up(self) -> bool:
        """Whether the client is gone: the session closed, or its peer closed the socket (not yet read)."""
        return self.closed or self._peer_hung_up()

    # -- incoming ------------------------------------------------------------------------------
    def handle(self, msg: Message) -> None:
        if isinstance(msg, Credit):
            self.flow.grant(msg.count)
        elif isinstance(msg, Release):
            problem = self.flow.release(msg.slot, msg.seq)
            if problem:
                # PROTOCOL.md: well-formed but wrong now; the slots the client does hold are untouched
                log.debug("session %d: %s", self.id, problem)
                self._send(Error(ErrorCode.BAD_REQUEST, problem))
            self._check_drained()
        elif isinstance(msg, StartEpoch | EvalRequest) and self.shutting_down:
            self._send(Error(ErrorCode.BAD_REQUEST, f"cannot start a {msg.TAG} stream: the daemon is shutting down"))
        elif isinstance(msg, StartEpoch):
            self._start(self._train_stream(msg.epoch), f"epoch {msg.epoch}")
        elif isinstance(msg, EvalRequest):
            self._start(self._eval_stream(msg.split), f"eval {msg.split}")
        elif isinstance(msg, StatsRequest):
            self._send(Stats(self.stats()))
        elif isinstance(msg, Bye):
            self.close()
        elif isinstance(msg, Error):
            log.warning("session %d (%s) reported: %s %s", self.id, self.peer, loggable(msg.code),
                        loggable(msg.message))
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
        stream.add_done_callback(lambda _: self._check_drained())
        self._stream = stream

    def _stream_done(self, task: "asyncio.Task[None]") -> None:
        if task.cancelled() or self.closed:
            return
        err = task.exception()
        if err is None:
            return
        cause = user_cause(err)
        if isinstance(cause, CorruptData):
            self._ctx.metrics.read_check_failures.labels(cause.path.name).inc()
        # a damaged dataset or a failing disk is not a bug: one line naming file and offset; a bug's
        # traceback goes to the log at debug level, the client and the log get one line either way
        log.error("session %d: stream failed: %s", self.id, cause or err)
        log.debug("session %d: stream failed", self.id, exc_info=err)
        self.fail(ErrorCode.DATA_CORRUPT if isinstance(cause, CorruptData) else ErrorCode.INTERNAL,
                  f"stream failed: {cause or err}")

    def fail(self, code: str, message: str) -> None:
        """Send a fatal error and disconnect."""
        if code != ErrorCode.INTERNAL:
            self._ctx.metrics.protocol_errors.labels(str(code)).inc()
        log.warning("session %d (%s): %s: %s; disconnecting", self.id, self.peer, code, loggable(message))
        self._send(Error(str(code), message))
        self.close()

    def evict(self, reason: str, message: str) -> None:
        """Tell the client why (``Error("timeout")``), count it under ``reason`` and disconnect."""
        if self.closed:
            return
        self._ctx.metrics.evictions.labels(reason).inc()
        log.warning("session %d (%s): evicted (%s): %s", self.id, self.peer, reason, message)
        self._send(Error(ErrorCode.TIMEOUT, f"evicted: {message}"))
        self.close()

    # -- outgoing streams ------------------------------------------------------------------------
    async def _publish(self, kind: str, epoch: int, pass_index: int, index: int, num_batches: int,
                       sampled: SampledBatches, b: int, source: SlotSource, cache_plan: CachePlan | None = None,
                       global_seeds: int = 0, pipeline: TrainPipeline | None = None) -> bool:
        """Publish batch ``b`` of ``sampled``; with ``cache_plan`` (training batches of a client with a
        feature cache) only the rows the client's cache does not hold are shipped. False: the session
        was evicted or failed meanwhile (it is closed). ``pipeline`` (training batches): its failure ends the
        wait for a slot (``TrainPipeline.raise_failure``)."""
        seq = self._seq
        try:
            # only the client frees slots and grants credit: one that stops doing both would hold this
            # stream, and the training pipeline if it owns it, forever
            async with asyncio.timeout(self.stall_timeout):
                slot = await self._acquire(seq, pipeline)
        except TimeoutError:
            self.evict("stall", f"no slot released and no credit granted for {self.stall_timeout:g} s while "
                                f"{self.flow.in_use} of {self.flow.count} slots were held ([server] stall_timeout)")
            return False
        batch_id = BatchId(kind=kind, seq=seq, epoch=epoch, pass_index=pass_index, batch_index=index,
                           num_batches=num_batches)
        t0 = time.perf_counter()
        aggregates = self._ctx.aggregates_for(kind)
        groups = self.micro_batches if kind == "train" else 0
        try:
            if cache_plan is None:
                nbytes = await run_in_pool(self._ctx.cpu_pool, fill_slot, self.ring, slot, batch_id, sampled, b,
                                           source, aggregates, groups)
            else:
                assert self.trainer_cache is not None
                cached = await run_in_pool(self._ctx.cpu_pool, self.trainer_cache.fill_slot, self.ring, slot,
                                           batch_id, sampled, b, source, cache_plan, aggregates, groups)
                nbytes = cached.nbytes
                rows = self._ctx.metrics.trainer_cache_rows
                rows.labels("hit").inc(cached.hits)
                rows.labels("shipped").inc(cached.shipped)
        except SlotOverflow as err:
            self.flow.abandon(slot)
            self.fail(ErrorCode.INTERNAL, overflow_message(err))
            return False
        except asyncio.CancelledError:
            self.flow.abandon(slot)  # never announced: the client does not hold it (the drain waits for held ones)
            # the publisher is the job's task, which may land after this session's own stream ended and the
            # client released the rest: the drain must hear that the last slot is free
            self._check_drained()
            raise
        finally:
            self._ctx.metrics.stage_busy.labels("publisher" if kind == "train" else "eval").inc(
                time.perf_counter() - t0)
        self._seq += 1
        # the batch's every row counts as served, shipped or taken from a client's cache: amplification is the read
        # path's, whatever the client keeps
        served = int(sampled.node_ptr[b + 1] - sampled.node_ptr[b]) * source.feat_dim * source.feat_dtype.itemsize
        if aggregates is not None:
            served *= 2  # a row of x_agg beside each row of x
        self._ctx.metrics.count_published(kind, int(sampled.num_sampled_nodes[b, 0]), served, nbytes)
        self._send(BatchReady.announce(slot, batch_id, global_seeds))
        return True

    async def _acquire(self, seq: int, pipeline: TrainPipeline | None) -> int:
        """A slot for batch ``seq``; with ``pipeline``, its failure (raised) as soon as it fails meanwhile."""
        if pipeline is None:
            return await self.flow.acquire(seq)
        pipeline.raise_failure()
        acquire = asyncio.ensure_future(self.flow.acquire(seq))
        failed = asyncio.ensure_future(pipeline.failed.wait())
        try:
            await asyncio.wait({acquire, failed}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # cancelled (the session closes) or timed out (a stall): give back a slot taken meanwhile
            failed.cancel()
            if not acquire.done():
                acquire.cancel()  # it takes nothing until it returns: cancelling leaves the flow as it was
            elif not acquire.cancelled() and acquire.exception() is None:
                self.flow.abandon(acquire.result())
                self._check_drained()
            raise
        failed.cancel()
        if acquire.done():
            return acquire.result()  # a slot, or the flow's ConnectionError when the client left
        acquire.cancel()
        pipeline.raise_failure()
        raise AssertionError("woken by the pipeline's failure event without a failure")

    async def publish_train(self, epoch: int, item: SampledWork, b: int, step: int, global_seeds: int,
                            pipeline: TrainPipeline, cache_plan: CachePlan | None) -> bool:
        """Batch ``b`` of ``item`` as this rank's step ``step`` of its job's epoch (``loader.daemon.jobs``);
        with ``cache_plan``, only the rows this client's feature cache does not hold are shipped."""
        if self.closed:
            return False
        return await self._publish("train", epoch, item.pass_index, step, item.epoch_batches, item.sampled, b,
                                   item.source, cache_plan, global_seeds=global_seeds, pipeline=pipeline)

    def tell_queued(self, position: int, holder: str) -> None:
        """This session's StartEpoch waits for the training pipeline (only a client that asked to queue)."""
        if self.queues and not self.closed:
            self._send(Queued(position=position, holder=holder))

    async def _train_stream(self, epoch: int) -> None:
        assert self.job is not None
        self._last_epoch = epoch
        self._ctx.metrics.epoch.set(epoch)
        # JobFailed: the job has told every rank, this one included, and disconnected them
        with contextlib.suppress(JobFailed):
            last = await self.job.job.train(self, self.job.rank, epoch)
            if last is not None and not self.closed:
                self._send(last)

    async def _eval_stream(self, split: str) -> None:
        cfg = self._ctx.config.sampler
        access = self._eval_access()
        link = self._ctx.link
        try:
            if link is None:
                plan = eval_split_batches(self._ctx.split_ids[split], cfg.eval_batch_size, cfg.seed,
                                          split_stream(split))
            else:  # the nodes the split's scores need, on its link stream: the in-memory trainer's batches
                plan = eval_split_batches(link.held_out[split].nodes, cfg.eval_batch_size, cfg.seed,
                                          _LINK_EVAL_STREAMS[split])
            if link is None and self.job is not None and self.job.job.world_size > 1:
                # each rank evaluates its share (whole batches, round-robin); the trainer pools the counts. A link
                # rank embeds the whole split (its scores rank each positive among the split's nodes), as in memory
                plan = deal_eval(plan, cfg.eval_batch_size, self.job.rank, self.job.job.world_size)
            total = len(plan.keys)
            source = access.source
            for first in range(0, total, EVAL_CHUNK_BATCHES):
                last = min(total, first + EVAL_CHUNK_BATCHES)
                seeds = plan.seeds[first * cfg.eval_batch_size:last * cfg.eval_batch_size]
                t0 = time.perf_counter()
                sampled = await run_in_pool(self._ctx.cpu_pool, access.sample, seeds, cfg.eval_batch_size,
                                                     cfg.sampled_eval_fanouts, plan.keys[first:last])
                self._ctx.metrics.stage_busy.labels("eval").inc(time.perf_counter() - t0)
                chunk = source
                if link is not None:  # each batch carries its share of the split's pairs
                    chunk = dataclasses.replace(source, eval_pairs=HeldOutShares(link.held_out[split], total, first))
                for b in range(sampled.num_batches):
                    if not await self._publish(split, self._last_epoch, 0, first + b, total, sampled, b, chunk):
                        return
            self._send(EvalEnd(split=split, batches=total))
        finally:
            access.close()

    # -- teardown ----------------------------------------------------------------------------------
    def begin_shutdown(self, reason: str) -> None:
        """The daemon drains: end the stream (no new batch) and send ``Shutdown(reason)``. The connection
        stays open, so the client can still read and release the batches it was sent; ``drained`` is set
        once the stream is over and none is held (or the session closes)."""
        if self.closed or self.shutting_down:
            return
        self.shutting_down = True
        if self._stream is not None and not self._stream.done():
            self._stream.cancel()
        if self.job is not None:
            self.job.job.halt()  # the epoch's publisher runs in the job, not in this session's stream
        self._send(Shutdown(reason))
        self._check_drained()

    def _check_drained(self) -> None:
        if self.closed or (self.shutting_down and self.flow.in_use == 0
                           and (self._stream is None or self._stream.done())):
            self.drained.set()

    def close(self) -> None:
        """Stop the stream, wake the publisher, close the connection; the segment goes in ``dispose``."""
        if self.closed:
            return
        self.closed = True
        self.flow.close()
        if self._stream is not None and not self._stream.done():
            self._stream.cancel()
        if self.job is not None:
            # the job hands the training pipeline back (once its publisher is out of the thread pool)
            self.job.job.member_left(self)
        self._close()
        self.drained.set()

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
    """Bytes in -> messages -> ``Session.handle``; messages out -> ``transport.write``.

    Flow control, after uvicorn's ``FlowControl``: past ``WRITE_BUFFER_HIGH`` unsent bytes the transport
    calls ``pause_writing``; the protocol then stops reading the socket and keeps the messages already
    decoded in a backlog until ``resume_writing``. A client that sends requests and never reads the
    replies so fills its own socket, not the daemon's memory, and is evicted after ``stall_timeout``.
    """

    def __init__(self, session: Session, decoder: FrameDecoder, on_lost: Callable[[Session], None],
                 pending: Iterable[Message] = ()) -> None:
        self.session = session
        self._decoder = decoder
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._backlog: collections.deque[Message] = collections.deque(pending)
        """Decoded messages not handled yet; first those that came with the Hello (``pending``)."""
        self._unread_timer: asyncio.TimerHandle | None = None
        self._abort_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        assert self._transport is not None
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self.session.attach(self._write, self._close, self._peer_hung_up)
        # before the transport reads: what came with the Hello precedes any later byte (and the client's EOF)
        self._drain()

    def _peer_hung_up(self) -> bool:
        transport = self._transport
        if transport is None:
            return True
        sock = transport.get_extra_info("socket")
        return sock is not None and peer_hung_up(sock.fileno())

    def write_buffer_size(self) -> int:
        """Bytes written to the transport and not yet sent."""
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def _write(self, msg: Message) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode(msg))

    def _close(self) -> None:
        transport = self._transport
        if transport is None:
            return
        if self.session.output_paused:
            # close() would wait for a flush that a client which does not read never allows
            transport.abort()
            return
        transport.close()
        self._abort_timer = asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)

    def pause_writing(self) -> None:
        self.session.output_paused = True
        self.session.output_pauses += 1
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        self._unread_timer = asyncio.get_running_loop().call_later(self.session.stall_timeout, self._unread)

    def resume_writing(self) -> None:
        self.session.output_paused = False
        self._cancel(self._unread_timer)
        self._unread_timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        # this runs inside the transport's write callback: handle the backlog (which writes) after it
        asyncio.get_running_loop().call_soon(self._drain)

    def _unread(self) -> None:
        self._unread_timer = None
        self.session.evict("unread", f"{self.write_buffer_size()} bytes of messages to the client stayed unread "
                                     f"for {self.session.stall_timeout:g} s ([server] stall_timeout)")

    def data_received(self, data: bytes) -> None:
        if self.session.closed:
            return
        try:
            messages = self._decoder.feed(data)
        except ProtocolError as err:
            self.session.fail(err.code, err.message)
            return
        self.received(messages)

    def received(self, messages: list[Message]) -> None:
        """Handle ``messages`` in order, or queue them while the client's output is paused."""
        self._backlog.extend(messages)
        self._drain()

    def _drain(self) -> None:
        while self._backlog and not self.session.closed and not self.session.output_paused:
            self.session.handle(self._backlog.popleft())

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._backlog.clear()
        for timer in (self._unread_timer, self._abort_timer):
            self._cancel(timer)
        self._unread_timer = self._abort_timer = None
        self.session.close()
        self._on_lost(self.session)

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()
