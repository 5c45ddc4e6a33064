"""Training jobs of several ranks (torch.distributed) on one daemon: one stream dealt to every local rank.

The ranks of a job send the same ``Hello.job``; the daemon groups their sessions into a ``Job``. A job
trains through one training pipeline: its batches are the pieces of the job's local ranks
(``loader.sampling.ranks.deal_pieces``), step-major, so mega-batches and the exact mode's Belady plan
are made once per machine for all of them. One publisher task per epoch (``Job.train``) hands each
batch to its rank's session in that order: the exact mode's rows must be filled in plan order, and
DDP steps the ranks in lockstep anyway, so a rank ahead would only wait at the next all-reduce.

The epoch starts once every local rank has connected (``[server] job_timeout`` after the first
StartEpoch at most) and sends each rank's batches only after that rank's own StartEpoch. A rank that
disconnects or stops taking batches during a training epoch fails the job: every other rank gets an
``Error`` naming it and is disconnected, so none waits forever in its next all-reduce. Between epochs
a rank may leave and come back (a restart with ``--resume``). A job that holds the training pipeline
and starts no epoch for ``[server] idle_timeout`` while none of its ranks streams (an evaluation is
activity) fails too, so the pipeline goes to the next trainer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from loader.daemon.stages import EpochDone, TrainPipeline
from loader.sampling.ranks import LocalRanks
from proto.messages import EpochEnd, ErrorCode

if TYPE_CHECKING:
    from loader.daemon.session import Session

__all__ = ["Job", "JobPipelines", "JobFailed", "job_mismatch"]

log = logging.getLogger("megabatch.jobs")


class JobFailed(Exception):
    """The job this session belongs to failed; the message says why (one line)."""


class JobPipelines(Protocol):
    """The daemon side a job needs: the training pipeline, as a session gets it."""

    async def acquire_pipeline(self, owner: object, epoch: int, local: LocalRanks) -> TrainPipeline | str: ...

    def finish_pipeline(self, owner: object, pipeline: TrainPipeline, next_epoch: int | None) -> None: ...

    def release_pipeline(self, owner: object) -> None: ...

    def owns_pipeline(self, owner: object) -> bool: ...


def job_mismatch(name: str, world_size: int, local_world_size: int, rank: int) -> str | None:
    """Why a Hello's job fields are inconsistent in themselves, or None."""
    if rank >= world_size:
        return f"job {name!r}: rank {rank} is not below world_size {world_size}"
    if local_world_size > world_size:
        return f"job {name!r}: local_world_size {local_world_size} exceeds world_size {world_size}"
    return None


@dataclass
class _EpochStream:
    """One training epoch of a job being published."""

    epoch: int
    started: dict[int, asyncio.Event] = field(default_factory=dict)
    """rank -> set once that rank's StartEpoch for this epoch arrived."""
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task[None] | None = None

    def started_event(self, rank: int) -> asyncio.Event:
        return self.started.setdefault(rank, asyncio.Event())


class Job:
    """The sessions of one training job on this daemon (lives on the event loop)."""

    def __init__(self, name: str, world_size: int, local_world_size: int, pipelines: JobPipelines,
                 job_timeout: float, idle_timeout: float, on_empty: Callable[[Job], None]) -> None:
        self.name = name
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.members: dict[int, Session] = {}
        """rank -> its session."""
        self.failure: str | None = None
        self._pipelines = pipelines
        self._job_timeout = job_timeout
        self._idle_timeout = idle_timeout
        self._idle_timer: asyncio.TimerHandle | None = None
        self._on_empty = on_empty
        self._complete = asyncio.Event()
        self._stream: _EpochStream | None = None

    # -- membership ---------------------------------------------------------------------------------
    def admit(self, session: Session, rank: int, world_size: int, local_world_size: int) -> str | None:
        """Add ``session`` as ``rank``; or say why it does not fit this job (the Hello is refused)."""
        if (world_size, local_world_size) != (self.world_size, self.local_world_size):
            return (f"job {self.name!r} has world_size {self.world_size} and local_world_size "
                    f"{self.local_world_size} here; this rank says {world_size} and {local_world_size}")
        if rank in self.members:
            return f"rank {rank} of job {self.name!r} is connected already (session {self.members[rank].id})"
        if len(self.members) >= self.local_world_size:
            return (f"job {self.name!r} has all its {self.local_world_size} local ranks "
                    f"({', '.join(map(str, sorted(self.members)))}) connected already")
        self.members[rank] = session
        if len(self.members) == self.local_world_size:
            self._complete.set()
            log.info("job %s: %s connected (sessions %s)", self.name, self.local.describe(),
                     ", ".join(str(s.id) for _, s in sorted(self.members.items())))
        return None

    @property
    def local(self) -> LocalRanks:
        """The ranks connected to this daemon, of ``world_size``."""
        return LocalRanks(self.world_size, tuple(sorted(self.members)))

    @property
    def queues(self) -> bool:
        """Whether the job waits for a busy pipeline (every rank's Hello asked to) rather than failing."""
        return bool(self.members) and all(member.queues for member in self.members.values())

    def tell_queued(self, position: int, holder: str) -> None:
        """The job's StartEpoch waits for the training pipeline: every rank hears its place."""
        for member in self.members.values():
            member.tell_queued(position, holder)

    def member_left(self, session: Session) -> None:
        """``session`` closed. During a training epoch that fails the job; between epochs its rank may
        come back."""
        rank = next((r for r, s in self.members.items() if s is session), None)
        if rank is None:
            return
        del self.members[rank]
        self._complete.clear()
        stream = self._stream
        if stream is not None and stream.task is not None and not stream.task.done():
            self.fail(f"rank {rank} (session {session.id}) disconnected during epoch {stream.epoch}")
        if not self.members:
            self._cancel_idle_timer()
            self._pipelines.release_pipeline(self)
            self._on_empty(self)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        self._idle_timer = asyncio.get_running_loop().call_later(self._idle_timeout, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self.failure is not None or not self._pipelines.owns_pipeline(self):
            return
        if any(member.streaming for member in self.members.values()):
            self._arm_idle_timer()  # a rank evaluates: activity
            return
        self.fail(f"no StartEpoch for {self._idle_timeout:g} s after the last epoch ended while the job held the "
                  f"training pipeline ([server] idle_timeout); it goes to the next trainer")

    def fail(self, reason: str) -> None:
        """Fail the job: every rank still connected gets an ``Error`` with ``reason`` and is disconnected."""
        if self.failure is not None:
            return
        self.failure = reason
        self._cancel_idle_timer()
        log.warning("job %s failed: %s", self.name, reason)
        stream = self._stream
        if stream is not None and stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream is not None and not stream.done.done():
            stream.done.set_exception(JobFailed(reason))
            stream.done.exception()  # retrieved: a rank that never waits on it must not log "never retrieved"
        for session in list(self.members.values()):
            session.fail(ErrorCode.JOB_FAILED, f"job {self.name!r} failed: {reason}")
        self._pipelines.release_pipeline(self)

    @property
    def closed(self) -> bool:
        return self.failure is not None or not self.members

    # -- training ---------------------------------------------------------------------------------
    async def train(self, session: Session, rank: int, epoch: int) -> None:
        """Rank ``rank``'s StartEpoch(``epoch``): the first one starts the job's epoch; returns once the
        epoch is over for every rank (its EpochEnd sent); JobFailed if the job failed."""
        if self.failure is not None:
            raise JobFailed(self.failure)
        self._cancel_idle_timer()
        stream = self._stream
        if stream is None or stream.task is None or stream.task.done():
            stream = self._stream = _EpochStream(epoch)
            stream.task = asyncio.ensure_future(self._publish_epoch(stream))
            stream.task.set_name(f"megabatch-job-{self.name}-epoch{epoch}")
        elif stream.epoch != epoch:
            self.fail(f"rank {rank} asked for epoch {epoch} while the job trains epoch {stream.epoch}")
            raise JobFailed(self.failure or "")
        stream.started_event(rank).set()
        await asyncio.shield(stream.done)

    async def _publish_epoch(self, stream: _EpochStream) -> None:
        epoch = stream.epoch
        try:
            async with asyncio.timeout(self._job_timeout):
                await self._complete.wait()
        except TimeoutError:
            self.fail(f"{len(self.members)} of {self.local_world_size} local ranks "
                      f"({', '.join(map(str, sorted(self.members))) or 'none'}) connected within "
                      f"{self._job_timeout:g} s of the first StartEpoch ([server] job_timeout)")
            return
        local = self.local
        acquired = await self._pipelines.acquire_pipeline(self, epoch, local)
        if isinstance(acquired, str):
            self.fail(acquired)
            return
        pipeline = acquired
        members = [self.members[r] for r in local.ranks]
        sent = [0] * local.count
        finished = False
        try:
            while True:
                item = await pipeline.next_work()
                if isinstance(item, EpochDone):
                    for index, member in enumerate(members):
                        member.end_epoch(EpochEnd(epoch=epoch, batches=sent[index], passes=item.passes))
                    finished = True
                    stream.done.set_result(None)
                    self._arm_idle_timer()  # the pipeline runs ahead for this job: bounded by idle_timeout
                    return
                assert item.member is not None and item.global_size is not None
                for b in range(item.sampled.num_batches):
                    index = int(item.member[b])
                    rank = local.ranks[index]
                    await self._wait_started(stream, rank)
                    step = item.first_batch + b // local.count
                    if not await members[index].publish_train(epoch, item, b, step, int(item.global_size[b]),
                                                              pipeline):
                        self.fail(f"rank {rank} (session {members[index].id}) stopped taking batches in epoch "
                                  f"{epoch}")
                        return
                    sent[index] += 1
                if item.last_pass and item.release is not None:
                    item.release()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a stage or a publish failed: the ranks must hear it, not wait
            log.error("job %s: epoch %d failed: %s", self.name, epoch, err, exc_info=err)
            self.fail(f"epoch {epoch} failed in the loader: {err}")
        finally:
            self._pipelines.finish_pipeline(self, pipeline, epoch + 1 if finished else None)

    async def _wait_started(self, stream: _EpochStream, rank: int) -> None:
        event = stream.started_event(rank)
        if event.is_set():
            return
        try:
            async with asyncio.timeout(self._job_timeout):
                await event.wait()
        except TimeoutError:
            self.fail(f"rank {rank} sent no StartEpoch for epoch {stream.epoch} within {self._job_timeout:g} s "
                      f"of the other ranks ([server] job_timeout)")
            raise asyncio.CancelledError from None
