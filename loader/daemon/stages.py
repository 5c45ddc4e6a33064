"""What every training mode's stages share: the sampler -> publisher exchange types, the running
pipeline of one training stream, and how CPU work runs off the event loop.

The hierarchical pipeline (``daemon/hierarchical/pipeline.py``) and the full-graph one
(``daemon/fullgraph/fullgraph.py``) both feed a session's publisher (``daemon/session.py``) through
these types, so they live beside the publisher rather than inside either mode.
"""

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from loader.daemon.metrics import DaemonMetrics
from loader.daemon.publisher import SlotSource
from loader.sampling.sampling import SampledBatches
from proto.errors import UserError

__all__ = ["SampledWork", "EpochDone", "TrainPipeline", "run_in_pool", "run_timed", "user_cause"]

log = logging.getLogger("megabatch.pipeline")

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class SampledWork:
    """Superbatch sampler -> publisher: every batch of one pass (over one mega-batch, or a superbatch
    of the full graph in the other modes)."""

    source: SlotSource
    """Where the pass's rows, ids and labels come from."""
    release: Callable[[], None] | None
    """Called once the last batch of a ``last_pass`` item is published (hands its buffer back; the hierarchical
    pipeline also reports an epoch from its last pass's: the one point where the epoch is known delivered)."""
    pass_index: int
    sampled: SampledBatches
    first_batch: int
    """Index within the epoch of this pass's first step (its first batch, for a single rank)."""
    epoch_batches: int
    """Steps in the whole epoch (batches, for a single rank), or -1 when unknown (``passes = "auto"``)."""
    last_pass: bool
    """The publisher hands the buffer back after this one."""
    member: np.ndarray | None = None
    """Under several ranks (``loader.sampling.ranks.Pieces``): int64 per batch, the position in the job's
    ``LocalRanks.ranks`` of the rank it goes to; batches are step-major, so batch b is in step
    ``first_batch + b // local ranks``. None: every batch goes to the one trainer."""
    global_size: np.ndarray | None = None
    """Under several ranks: int64 per batch, the seeds of its global batch over all ranks (the loss scale)."""


@dataclass(frozen=True)
class EpochDone:
    """Sampler -> publisher: the epoch's last batch has been handed over."""

    epoch: int
    batches: int
    passes: int


@dataclass
class TrainPipeline:
    """The running stages of one training stream; ``output`` feeds a session's publisher."""

    start_epoch: int
    output: "asyncio.Queue[SampledWork | EpochDone]"
    tasks: list["asyncio.Task[None]"] = field(default_factory=list)
    failure: BaseException | None = None
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set with ``failure``: wakes a publisher that waits for a slot, not on ``output`` (its client may
    hold every slot, and would otherwise hear a stall timeout instead of the failure)."""
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set when ``stop`` begins: a stage's job already on a thread, which a cancel cannot reach, checks it to
    give up early (a staging pass, between two chunks) instead of running to its end."""

    def add_stage(self, name: str, coro: Awaitable[None]) -> None:
        """Run ``coro`` as stage ``name``; its failure is recorded and wakes the publisher."""
        task = asyncio.ensure_future(coro)
        task.set_name(f"megabatch-{name}")
        task.add_done_callback(lambda t: _record_failure(self, name, t))
        self.tasks.append(task)

    def raise_failure(self) -> None:
        """Raise (a RuntimeError from the stage's error) once a stage has failed."""
        if self.failure is not None:
            raise RuntimeError(f"loader pipeline failed: {self.failure}") from self.failure

    async def next_work(self) -> "SampledWork | EpochDone":
        """The next item of ``output``, or the failure of a stage (raised)."""
        item = await self.output.get()
        self.raise_failure()
        return item

    async def stop(self) -> None:
        """Cancel every stage and wait for them (reads in flight land first; jobs that check ``stopping`` end
        early)."""
        self.stopping.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def run_in_pool(pool: ThreadPoolExecutor, func: Callable[..., T], *args: object) -> T:
    """``func(*args)`` on ``pool``; when cancelled, still waits for the job to finish before raising.

    A thread cannot be interrupted: a job outliving its cancelled stage would keep its memory (a
    sampled superbatch, views of a slot) alive and could write into a buffer a new pipeline now
    owns. Waiting keeps "the stage is gone" meaning "its work is gone".
    """
    job = asyncio.get_running_loop().run_in_executor(pool, func, *args)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait([job])
        # the shield let go of ``job`` when cancelled: an error it ends with (the same corrupt block another
        # stage failed on, say) is retrieved here, or the collector logs it with a traceback later
        if not job.cancelled() and job.exception() is not None:
            log.debug("cancelled stage's job failed too", exc_info=job.exception())
        raise


async def run_timed(pool: ThreadPoolExecutor, metrics: DaemonMetrics, stage: str, func: Callable[..., T],
                    *args: object) -> T:
    """Run CPU work on ``pool`` (numba kernels drop the GIL) and charge its seconds to ``stage``."""
    t0 = time.perf_counter()
    try:
        return await run_in_pool(pool, func, *args)
    finally:
        metrics.stage_busy.labels(stage).inc(time.perf_counter() - t0)


def _record_failure(pipeline: TrainPipeline, name: str, task: "asyncio.Task[None]") -> None:
    if task.cancelled():
        return
    err = task.exception()
    if err is not None and pipeline.failure is None:
        pipeline.failure = err
        pipeline.failed.set()
        log.error("stage %s failed: %s", name, err)
        # wake the publisher: it waits on ``output`` and must see the failure, not hang
        with contextlib.suppress(asyncio.QueueFull):
            pipeline.output.put_nowait(EpochDone(-1, 0, 0))


def user_cause(err: BaseException | None) -> UserError | None:
    """The ``UserError`` (``CorruptData``, a failed or short read) behind a stream's failure, raised there
    or by a pipeline stage it waited on; None for anything else (a bug)."""
    while err is not None:
        if isinstance(err, UserError):
            return err
        err = err.__cause__
    return None
