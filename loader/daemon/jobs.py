"""Training jobs: every trainer is one, a lone trainer a job of one rank; one consumer loop publishes their epochs.

The ranks of a job of several (torch.distributed) send the same ``Hello.job``; the daemon groups their
sessions into a ``Job``. A lone trainer's session gets a job of its own, so there is one path from the
training pipeline to a client: ``Job._publish_epoch``. A job trains through the daemon's one training
pipeline (``loader.daemon.ownership`` decides when): its batches are the pieces of the job's local ranks
(``loader.sampling.ranks.deal_pieces``), step-major, so mega-batches and the exact mode's Belady plan are
made once per machine for all of them. The publisher hands each batch to its rank's session in that order:
the exact mode's rows must be filled in plan order, and DDP steps the ranks in lockstep anyway, so a rank
ahead would only wait at the next all-reduce. A lone trainer with a feature cache of its own
(``Hello.feature_cache_bytes``) has each pass planned against that cache here too.

The epoch starts once every local rank has connected (``[server] job_timeout`` after the first
StartEpoch at most) and sends each rank's batches only after that rank's own StartEpoch. A rank of
several that disconnects or stops taking batches during a training epoch fails the job: every other
rank gets an ``Error`` naming it and is disconnected, so none waits forever in its next all-reduce.
Between epochs a rank may leave and come back (a restart with ``--resume``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from loader.caches.changeset import CachePlan
from loader.daemon.ownership import PipelineOwnership
from loader.daemon.serving import ServingContext
from loader.daemon.stages import EpochDone, SampledWork, TrainPipeline, run_timed, user_cause
from loader.daemon.trainer_cache import TrainerCache
from loader.format.read_checks import CorruptData
from loader.sampling.ranks import LocalRanks
from proto.messages import EpochEnd, Error, ErrorCode

__all__ = ["Job", "JobMember", "JobRank", "JobFailed", "job_mismatch"]

log = logging.getLogger("megabatch.jobs")


class JobFailed(Exception):
    """The job this session belongs to failed; the message says why (one line)."""


class JobMember(Protocol):
    """What a job needs of one rank's session (``loader.daemon.session.Session``)."""

    id: int
    queues: bool
    closed: bool
    trainer_cache: TrainerCache | None

    def tell_queued(self, position: int, holder: str) -> None: ...

    def hung_up(self) -> bool: ...

    async def publish_train(self, epoch: int, item: SampledWork, b: int, step: int, global_seeds: int,
                            pipeline: TrainPipeline, cache_plan: CachePlan | None) -> bool: ...

    def fail(self, code: str, message: str) -> None: ...


@dataclass(frozen=True)
class JobRank:
    """A session as one rank of its job."""

    job: Job
    rank: int


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
    ends: dict[int, EpochEnd] = field(default_factory=dict)
    """rank -> its EpochEnd, once every batch is published (its session sends it, as its stream's last act: a
    client that answers with the next StartEpoch must find that stream over)."""
    refusal: str | None = None
    """Why a lone trainer's StartEpoch was refused (the pipeline is busy), sent by its session as that stream's
    last act for the same reason as an EpochEnd: sent from here, it reached a client that asked again at once
    while the session's stream was still finishing, and was refused a second time as "a stream is still
    running"."""
    task: asyncio.Task[None] | None = None

    def started_event(self, rank: int) -> asyncio.Event:
        return self.started.setdefault(rank, asyncio.Event())

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def forget_task(self) -> None:
        """Drop the finished publisher: a cancelled or failed task keeps its traceback, whose frames hold the
        sessions and views of their slots, and the job outlives the epoch (a session's memfd would stay
        mapped, its pages charged to the daemon, until the job went)."""
        self.task = None


class Job:
    """The sessions of one trainer on this daemon (lives on the event loop). ``name`` None: a lone trainer."""

    def __init__(self, name: str | None, world_size: int, local_world_size: int, ownership: PipelineOwnership,
                 serving: ServingContext, job_timeout: float, on_empty: Callable[[Job], None]) -> None:
        self.name = name
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.members: dict[int, JobMember] = {}
        """rank -> its session."""
        self.failure: str | None = None
        self._label = f"job {name!r}"
        self._ownership = ownership
        self._serving = serving
        self._job_timeout = job_timeout
        self._on_empty = on_empty
        self._complete = asyncio.Event()
        self._stream: _EpochStream | None = None

    @property
    def label(self) -> str:
        """"session N" for a lone trainer (its one session), "job 'name'" for a job of several ranks."""
        return self._label

    # -- membership ---------------------------------------------------------------------------------
    def admit(self, session: JobMember, rank: int, world_size: int, local_world_size: int) -> str | None:
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
        if self.name is None:
            self._label = f"session {session.id}"
        if len(self.members) == self.local_world_size:
            self._complete.set()
            if self.name is not None:
                log.info("job %s: %s connected (sessions %s)", self.name, self.local.describe(),
                         ", ".join(str(s.id) for _, s in sorted(self.members.items())))
        return None

    def _who(self, rank: int, session: JobMember) -> str:
        return f"session {session.id}" if self.name is None else f"rank {rank} (session {session.id})"

    @property
    def local(self) -> LocalRanks:
        """The ranks connected to this daemon, of ``world_size``."""
        return LocalRanks(self.world_size, tuple(sorted(self.members)))

    @property
    def queues(self) -> bool:
        """Whether the job waits for a busy pipeline (every rank's Hello asked to) rather than being refused."""
        return bool(self.members) and all(member.queues for member in self.members.values())

    def tell_queued(self, position: int, holder: str) -> None:
        """The job's StartEpoch waits for the training pipeline: every rank hears its place."""
        for member in self.members.values():
            member.tell_queued(position, holder)

    def member_left(self, session: JobMember) -> None:
        """``session`` closed. During a training epoch that fails the job; between epochs its rank may
        come back."""
        rank = next((r for r, s in self.members.items() if s is session), None)
        if rank is None:
            return
        del self.members[rank]
        self._complete.clear()
        stream = self._stream
        if stream is not None and stream.running:
            if self.name is None:
                # a lone trainer that leaves mid-epoch fails nobody else: its epoch just stops
                assert stream.task is not None
                stream.task.cancel()
            else:
                self.fail(f"{self._who(rank, session)} disconnected during epoch {stream.epoch}")
        if not self.members:
            self._hand_back()
            self._on_empty(self)

    def fail(self, reason: str, code: str = ErrorCode.JOB_FAILED) -> None:
        """Fail the job: every rank still connected gets an ``Error`` with ``reason`` and is disconnected."""
        if self.failure is not None:
            return
        self.failure = reason
        log.warning("%s failed: %s", self.label, reason)
        stream = self._stream
        if stream is not None and stream.running:
            assert stream.task is not None
            stream.task.cancel()
        if stream is not None and not stream.done.done():
            stream.done.set_exception(JobFailed(reason))
            stream.done.exception()  # retrieved: a rank that never waits on it must not log "never retrieved"
        message = reason if self.name is None else f"job {self.name!r} failed: {reason}"
        for session in list(self.members.values()):
            if not session.closed:
                session.fail(code, message)
        self._hand_back()

    def halt(self) -> None:
        """The daemon drains: publish no further batch, failing nobody (every rank is sent ``Shutdown``)."""
        stream = self._stream
        if stream is not None and stream.running:
            assert stream.task is not None
            stream.task.cancel()  # it hands the pipeline back once out of the thread pool
            stream.done.cancel()

    def _hand_back(self) -> None:
        """Give the pipeline up, unless the epoch's publisher still runs: it may be in a thread reading the
        pipeline's buffers, and hands the pipeline back itself once that is over."""
        stream = self._stream
        if stream is None or not stream.running:
            self._ownership.release(self)

    @property
    def closed(self) -> bool:
        return self.failure is not None or not self.members

    @property
    def leaving(self) -> bool:
        """Closed, or every rank's trainer gone (its connection hung up, the daemon has yet to read that)."""
        return self.closed or all(member.hung_up() for member in self.members.values())

    # -- training ---------------------------------------------------------------------------------
    async def train(self, session: JobMember, rank: int, epoch: int) -> EpochEnd | Error | None:
        """Rank ``rank``'s StartEpoch(``epoch``): the first one starts the job's epoch; returns what the session
        sends as its stream's last act: the rank's EpochEnd once the epoch is over for every rank, or the
        refusal's Error (a lone trainer, the pipeline busy); None when there is nothing to send (a drain);
        JobFailed if the job failed."""
        if self.failure is not None:
            raise JobFailed(self.failure)
        stream = self._stream
        if stream is None or not stream.running:
            stream = self._stream = _EpochStream(epoch)
            stream.task = asyncio.ensure_future(self._publish_epoch(stream))
            stream.task.set_name(f"megabatch-{self.label.replace(' ', '-')}-epoch{epoch}")
            stream.task.add_done_callback(lambda _: stream.forget_task())
        elif stream.epoch != epoch:
            self.fail(f"rank {rank} asked for epoch {epoch} while the job trains epoch {stream.epoch}")
            raise JobFailed(self.failure or "")
        stream.started_event(rank).set()
        await asyncio.shield(stream.done)
        if stream.refusal is not None:
            return Error(ErrorCode.BAD_REQUEST, stream.refusal)
        return stream.ends.get(rank)

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
        acquired = await self._ownership.acquire(self, epoch, local)
        if isinstance(acquired, str):
            self._refuse(stream, acquired)
            return
        pipeline = acquired
        finished = False
        try:
            finished = await self._publish(stream, pipeline, local)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a stage or a publish failed: the ranks must hear it, not wait
            self._stream_failed(epoch, err)
        finally:
            self._ownership.finish(self, pipeline, epoch + 1 if finished else None)

    async def _publish(self, stream: _EpochStream, pipeline: TrainPipeline, local: LocalRanks) -> bool:
        """Every batch of the epoch to its rank, then the EpochEnds; False if a rank stopped taking batches."""
        epoch = stream.epoch
        members = [self.members[r] for r in local.ranks]
        sent = [0] * local.count
        # only a lone trainer has a cache of its own: a job's ranks share one stream
        client_cache = members[0].trainer_cache if local.count == 1 else None
        while True:
            item = await pipeline.next_work()
            if isinstance(item, EpochDone):
                for index, rank in enumerate(local.ranks):
                    stream.ends[rank] = EpochEnd(epoch=epoch, batches=sent[index], passes=item.passes)
                if not stream.done.done():  # cancelled by a drain meanwhile
                    stream.done.set_result(None)
                return True
            cache_plan = None
            if client_cache is not None:
                # planned here, not in the pipeline: the pipeline outlives sessions, the plan's state is
                # this client's (serial with publishing, and O(superbatch) work)
                cache_plan = await run_timed(self._serving.cpu_pool, self._serving.metrics, "planner",
                                             client_cache.plan, item.sampled, item.source)
            for b in range(item.sampled.num_batches):
                index = 0 if item.member is None else int(item.member[b])
                rank = local.ranks[index]
                await self._wait_started(stream, rank)
                step = item.first_batch + b // local.count
                global_seeds = 0 if item.global_size is None else int(item.global_size[b])
                if not await members[index].publish_train(epoch, item, b, step, global_seeds, pipeline, cache_plan):
                    # the session was evicted or failed, and told why; a job of several must tell the others
                    self.fail(f"{self._who(rank, members[index])} stopped taking batches in epoch {epoch}")
                    return False
                sent[index] += 1
            if item.last_pass and item.release is not None:
                item.release()

    def _refuse(self, stream: _EpochStream, reason: str) -> None:
        """The pipeline is busy and the job does not queue: a lone trainer hears why and may ask again; the
        ranks of a job of several are failed, so none waits in an all-reduce for the others."""
        if self.name is not None:
            self.fail(reason)
            return
        stream.refusal = reason
        if not stream.done.done():
            stream.done.set_result(None)

    def _stream_failed(self, epoch: int, err: Exception) -> None:
        """A stage or a publish raised: a damaged dataset or a failing disk (a ``UserError``) is one line
        naming file and offset; anything else is a bug, with its traceback at debug level."""
        cause = user_cause(err)
        if isinstance(cause, CorruptData):
            self._serving.metrics.read_check_failures.labels(cause.path.name).inc()
        log.error("%s: epoch %d failed: %s", self.label, epoch, cause or err)
        log.debug("%s: epoch %d failed", self.label, epoch, exc_info=err)
        code = ErrorCode.DATA_CORRUPT if isinstance(cause, CorruptData) else ErrorCode.INTERNAL
        self.fail(f"stream failed: {cause or err}", code)

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
