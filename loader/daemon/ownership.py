"""Who holds the daemon's one training pipeline, and who waits for it: the one place that decides.

One daemon runs one training pipeline (its memory plan holds one), so trainers take turns. Every
trainer is a job (``loader.daemon.jobs``; a lone trainer is a job of one rank), and the rules are:

- the first job to start an epoch while the pipeline is free holds it; the pipeline then runs ahead
  into the job's next epoch between its epochs;
- the holder's next ``StartEpoch`` is never queued: a job waiting for the pipeline waits for the
  holder, so queueing the holder behind it would deadlock both;
- a job that asks while another holds the pipeline waits in one first-come, first-served line if
  every rank's Hello asked to queue (told its place by ``Queued``), and is refused at once otherwise;
- *using* the pipeline means running a training stream, and nothing else: an evaluation does not
  read the pipeline and does not count, so no client can keep the pipeline by evaluating. A holder
  that has run no training stream for ``[server] idle_timeout`` after its epoch ended loses the
  pipeline as soon as another trainer asks for it (at once if one is already waiting). It stays
  connected: its next ``StartEpoch`` takes the pipeline again if free, or waits its turn. Nobody
  waiting, a holder keeps the pipeline however long it evaluates, and its run-ahead with it.
- a holder on its way out (its job closed, or every rank's connection hung up by the peer although the
  daemon has not read that yet) is not a reason to refuse: a trainer restarted the moment its predecessor
  died would otherwise be refused by that predecessor's teardown (the publisher may be in a thread, and
  hands the pipeline back only once out of it). A trainer that does not queue waits up to
  ``LEAVING_GRACE`` seconds for such a holder to let go before it is refused.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from loader.daemon.metrics import DaemonMetrics
from loader.daemon.stages import TrainPipeline
from loader.daemon.training_queue import TrainingQueue
from loader.sampling.ranks import SINGLE_RANK, LocalRanks

__all__ = ["PipelineOwner", "PipelineOwnership", "LEAVING_GRACE"]

log = logging.getLogger("megabatch.ownership")

LEAVING_GRACE = 10.0
"""Seconds a trainer that does not queue waits for a holder on its way out to hand the pipeline back (its
publisher leaves the thread pool within one batch's work) before it is refused."""


class PipelineOwner(Protocol):
    """A trainer that can hold the training pipeline (a ``Job``)."""

    @property
    def label(self) -> str:
        """How logs, ``Queued`` and the queue metric name it ("session 3", "job 'name'")."""

    @property
    def queues(self) -> bool:
        """Whether it waits for a busy pipeline rather than being refused."""

    @property
    def closed(self) -> bool:
        """Whether it has failed or lost every rank."""

    @property
    def leaving(self) -> bool:
        """Whether it is on its way out: closed, or every rank's peer hung up (not yet read by the daemon)."""

    def tell_queued(self, position: int, holder: str) -> None:
        """It waits for the pipeline at ``position`` in line; ``holder`` holds it."""


class PipelineOwnership:
    """The training pipeline, its holder and the line of trainers waiting for it (lives on the event loop)."""

    def __init__(self, start: Callable[[int, LocalRanks], TrainPipeline], idle_timeout: float,
                 metrics: DaemonMetrics, leaving_grace: float = LEAVING_GRACE) -> None:
        self._start = start
        self.idle_timeout = idle_timeout
        self.leaving_grace = leaving_grace
        self._metrics = metrics
        self.owner: PipelineOwner | None = None
        self.pipeline: TrainPipeline | None = None
        """The running pipeline (its holder's stream, or run ahead into the holder's next epoch)."""
        self._next_epoch: int | None = None
        """The epoch the pipeline runs ahead into while its holder trains none (None while one trains)."""
        self._local: LocalRanks = SINGLE_RANK
        self.stopping: set[asyncio.Task[None]] = set()
        """Pipelines being stopped; a new one starts only once they are gone (their buffers are reused)."""
        self._queue = TrainingQueue(self._positions_changed)
        self._idle_since: float | None = None
        """Loop time the holder's last training stream ended; None while one runs or nobody holds."""
        self._idle_timer: asyncio.TimerHandle | None = None
        self._owner_changed = asyncio.Event()
        """Set (and replaced by a fresh one) whenever the holder changes."""

    @property
    def waiting(self) -> list[PipelineOwner]:
        """The trainers in line, next first."""
        return self._queue.waiting  # type: ignore[return-value]  # only owners are queued

    @property
    def quiet(self) -> bool:
        """No pipeline runs and none is being stopped."""
        return self.pipeline is None and not self.stopping

    def holder(self) -> str:
        return self.owner.label if self.owner is not None else "nobody"

    async def acquire(self, owner: PipelineOwner, epoch: int, local: LocalRanks) -> TrainPipeline | str:
        """The pipeline for ``owner``'s epoch ``epoch`` dealt to ``local``, once it is ``owner``'s turn; or why
        not (a refusal, for an owner that does not queue)."""
        if self.owner is not owner:
            self._revoke_if_idle(owner)
            if not owner.queues and not len(self._queue) and self.owner is not None and self.owner.leaving:
                await self._until_let_go(self.owner)
            if self.owner is not None or len(self._queue):
                if not owner.queues:
                    waiting = f"; {len(self._queue)} waiting" if len(self._queue) else ""
                    return f"{self.holder()} is training{waiting}; one training stream at a time"
                await self._queue.wait_turn(owner, lambda _: self.owner is None, self.holder, owner.tell_queued)
            self._set_owner(owner)
        self._stop_idle_clock()
        if self.pipeline is not None and (self._next_epoch != epoch or self._local != local):
            pipeline, self.pipeline = self.pipeline, None
            self._stop_later(pipeline)
        if self.pipeline is None:
            # a stopped pipeline's stages must be gone before a new one takes the buffers and memory
            while self.stopping:
                await asyncio.gather(*list(self.stopping), return_exceptions=True)
            if self.owner is not owner:  # it failed or left meanwhile: whoever is next takes over
                return f"{owner.label} gave the training pipeline up while it started"
            self.pipeline = self._start(epoch, local)
            self._local = local
        self._next_epoch = None
        return self.pipeline

    def finish(self, owner: PipelineOwner, pipeline: TrainPipeline, next_epoch: int | None) -> None:
        """``owner``'s training stream over ``pipeline`` ended: the pipeline runs ahead into ``next_epoch``
        for it (its idle clock starts), or, with None (the stream failed or was cut), is dropped."""
        if self.pipeline is not pipeline or self.owner is not owner:
            return
        if next_epoch is None or owner.closed:
            self.release(owner)
            return
        self._next_epoch = next_epoch
        loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        self._idle_timer = loop.call_later(self.idle_timeout, self._idle_expired)

    def release(self, owner: PipelineOwner) -> None:
        """``owner`` is done with the pipeline (it left or failed): stop it, the next in line takes over."""
        if self.owner is not owner:
            return
        pipeline, self.pipeline, self._next_epoch = self.pipeline, None, None
        if pipeline is not None:
            self._stop_later(pipeline)
        self._set_owner(None)

    async def stop(self) -> None:
        """Stop the pipeline whoever holds it, and wait for every stop (the daemon drains)."""
        if self.owner is not None:
            self.release(self.owner)
        elif self.pipeline is not None:
            pipeline, self.pipeline = self.pipeline, None
            self._stop_later(pipeline)
        while self.stopping:
            # wait, not gather: a cancelled caller (a drain cut short) must not cancel the stops themselves
            await asyncio.wait(list(self.stopping))

    async def _until_let_go(self, holder: PipelineOwner) -> None:
        """Wait, up to ``leaving_grace``, for ``holder`` (on its way out) to stop holding the pipeline."""
        log.info("%s is leaving; waiting up to %g s for it to hand the training pipeline back", holder.label,
                 self.leaving_grace)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.leaving_grace):
                while self.owner is holder:
                    await self._owner_changed.wait()

    # -- idle holders ---------------------------------------------------------------------------------
    def _stop_idle_clock(self) -> None:
        self._idle_since = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self._queue.waiting:
            self._revoke_if_idle(self._queue.waiting[0])  # type: ignore[arg-type]

    def _revoke_if_idle(self, wanted_by: PipelineOwner) -> None:
        """The holder loses the pipeline if it has trained nothing for ``idle_timeout``: ``wanted_by`` asks."""
        if self.owner is None or self._idle_since is None:
            return
        idle = asyncio.get_running_loop().time() - self._idle_since
        if idle < self.idle_timeout:
            return
        log.info("%s lost the training pipeline to %s: no training stream for %.0f s after its epoch ended "
                 "([server] idle_timeout = %g s; an evaluation does not count)", self.owner.label,
                 wanted_by.label, idle, self.idle_timeout)
        self._metrics.pipeline_revoked.inc()
        self.release(self.owner)

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _set_owner(self, owner: PipelineOwner | None) -> None:
        if self.owner is owner:
            return
        self._stop_idle_clock()
        self.owner = owner
        changed, self._owner_changed = self._owner_changed, asyncio.Event()
        changed.set()
        if owner is None:
            self._queue.wake()
        else:
            log.info("%s takes the training pipeline%s", owner.label,
                     f" ({len(self._queue)} waiting)" if len(self._queue) else "")
        self._positions_changed()

    def _stop_later(self, pipeline: TrainPipeline) -> None:
        task = asyncio.ensure_future(pipeline.stop())
        task.set_name("megabatch-stop-pipeline")
        self.stopping.add(task)
        task.add_done_callback(self.stopping.discard)

    def _positions_changed(self) -> None:
        """Who trains and who waits, as metrics (one label per trainer: ``megabatch status`` lists them)."""
        gauge = self._metrics.training_queue_position
        gauge.clear()
        if self.owner is not None:
            gauge.labels(self.owner.label).set(0)
        for position, owner in enumerate(self.waiting, start=1):
            gauge.labels(owner.label).set(position)
