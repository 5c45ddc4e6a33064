"""Batches from the loader daemon: the control socket and zero-copy views of its shared-memory slots.

Everything goes through ``proto``: ``ControlClient`` for the socket, ``SlotRing`` views for the data.
The tensors of a yielded ``Batch`` alias the slot, so the training loop calls ``Batch.release()``
as soon as it no longer reads them; the Release message returns the slot and one credit.
"""

import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from proto.batch_arrays import BatchArrays
from proto.client import ControlClient, JobMember
from proto.errors import ConnectFailed, ConnectionClosed, RemoteError, SlotError
from proto.messages import (
    BatchReady,
    Bye,
    Credit,
    EpochEnd,
    EvalEnd,
    EvalRequest,
    Message,
    Queued,
    Release,
    SlotLayout,
    StartEpoch,
)
from proto.sizes import counted, format_size
from trainer.batch import Batch, DeviceCachePlan
from trainer.host_pinning import CudaHostRuntime, PinnedRegion, pin_region
from trainer.ranks import SINGLE, Ranks
from trainer.source import BatchSource, SourceInfo

__all__ = ["DaemonSource", "DaemonError", "CONNECT_RETRY_SECONDS", "describe_slots"]

CONNECT_RETRY_SECONDS = 0.2

T = TypeVar("T")

log = logging.getLogger("megabatch.trainer")

# Slots are mapped read-only on purpose (the trainer must never write into the daemon's memory);
# torch warns about every non-writable array it wraps, so silence exactly that warning.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def describe_slots(slots: SlotLayout) -> str:
    """"4 slots of 788 KiB": slots are often under a MiB, which whole MiB rounded to 0."""
    return f"{counted(slots.count, 'slot')} of {format_size(slots.slot_bytes)}"


class DaemonError(RuntimeError):
    """The daemon refused a request, broke the protocol, or went away; the message says which (one line)."""


class DaemonSource(BatchSource):
    """A session with ``megabatch serve`` at ``socket_path``; ``credits`` = batches in flight (default: all slots).

    feature_cache_bytes (default 0: none): ask the daemon to plan a feature cache of this many
    bytes on the trainer; ``info.feature_cache_rows`` is what it accepted. Training batches then
    carry a ``cache_plan`` and only the rows the cache lacks (``trainer.device_cache``).

    ranks (default: a process training alone): this process's place in a job of several ranks; the
    session joins the job on the daemon, which deals each epoch to the job's ranks (every batch then
    says how many seeds its global batch holds) and gives each rank its share of an evaluation.

    pin_slots (default True): on a CUDA device, register the slot segment as pinned host memory for the
    session (``pin_for``), so that device copies are asynchronous DMA; False keeps pageable copies.

    micro_batches (default 0): the trainer cuts each training batch into this many micro-batches
    (``--micro-batches``); the daemon then sends each training batch's seed groups (``Batch.seed_group``), made
    by REG + METIS on its side.

    task (default "node"): "link" for a link-prediction session (``trainer.link.daemon_source``, which reads its
    slots through ``train_stream``/``eval_stream`` and ``read_slot``); a daemon serving the other task refuses it.

    on_queued (default None): called with True when the daemon queues an epoch's ``StartEpoch`` (another
    trainer holds its training pipeline) and with False when the wait ends; ``megabatch train`` stops at
    once on SIGTERM meanwhile, since no step is under way to finish. It may raise, and the stream then ends.
    """

    def __init__(self, socket_path: str, credits: int | None = None, timeout: float | None = 60.0,
                 connect_timeout: float = 0.0, feature_cache_bytes: int = 0, ranks: Ranks = SINGLE,
                 on_queued: Callable[[bool], None] | None = None, pin_slots: bool = True,
                 micro_batches: int = 0, task: str = "node") -> None:
        if feature_cache_bytes < 0:
            raise ValueError(f"feature_cache_bytes must be >= 0, got {feature_cache_bytes}")
        self._ranks = ranks
        self._on_queued = on_queued
        self._waiting = False
        job = JobMember(ranks.job, ranks.rank, ranks.world_size, ranks.local_world_size) if ranks.distributed \
            else None
        # connect_timeout > 0: wait for a daemon that is still starting (its socket appears when it is ready)
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._client = ControlClient.connect(socket_path, client=f"megabatch-trainer pid {os.getpid()}",
                                                     timeout=timeout, feature_cache_bytes=feature_cache_bytes,
                                                     job=job, queue=True, aggregation=True,
                                                     micro_batches=micro_batches, task=task)
                break
            except ConnectFailed as err:
                if time.monotonic() >= deadline:
                    raise DaemonError(str(err)) from None
                time.sleep(CONNECT_RETRY_SECONDS)
            except (RemoteError, ConnectionClosed, TimeoutError) as err:
                raise DaemonError(str(err)) from None
        w = self._client.welcome
        if job is not None and w.job != job.job:
            self._client.close("no job support")
            raise DaemonError(f"the loader daemon at {socket_path} does not deal batches to the ranks of a job "
                              f"(an older daemon); {ranks.label()} cannot train through it")
        d = w.dataset
        if d.task != task:  # a daemon that knows tasks refuses the Hello; an older one serves node batches
            self._client.close("task mismatch")
            raise DaemonError(f"the loader daemon at {socket_path} serves a {d.task} dataset ({d.name}), not "
                              f"{task} prediction batches")
        self.dataset = d
        """What the daemon said of its dataset (``Welcome.dataset``)."""
        self._info = SourceInfo(num_features=d.num_features, num_classes=d.num_classes, num_hops=d.num_hops,
                                batch_size=d.batch_size, train_nodes=d.train_nodes,
                                description=f"daemon {socket_path} (session {w.session}, dataset {d.name}, "
                                            f"{describe_slots(w.slots)})",
                                feature_dtype=d.feature_dtype, feature_cache_rows=w.feature_cache_rows,
                                dealing=w.dealing, aggregation=d.aggregation)
        self._pin_slots = pin_slots
        self._pinned: PinnedRegion | None = None
        self._next_seq = 0
        self._cache_step = 0  # plans received so far: the device cache checks they are applied in this order
        self._send(Credit(count=credits or w.slots.count))

    @property
    def info(self) -> SourceInfo:
        return self._info

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the slot segment registered as pinned host memory (0: copies from pageable memory)."""
        return self._pinned.nbytes if self._pinned is not None else 0

    def pin_for(self, device: torch.device, runtime: CudaHostRuntime | None = None) -> None:
        """On CUDA, register the slot segment as pinned once for the session (``trainer.host_pinning``); a
        refusal leaves pageable copies and says so in one warning. ``runtime``: tests pass a fake."""
        if device.type != "cuda" or not self._pin_slots or self._pinned is not None:
            return
        outcome = pin_region(self._client.segment.mapping, runtime)
        if outcome.region is None:
            log.warning("%s: host-to-device copies stay pageable (synchronous, slower)", outcome.reason)
            return
        self._pinned = outcome.region
        log.info("slot segment pinned for %s: %s registered read-only", device, format_size(outcome.region.nbytes))

    def _send(self, msg: Message) -> None:
        try:
            self._client.send(msg)
        except (RemoteError, ConnectionClosed) as err:
            raise DaemonError(str(err)) from None

    def _recv(self) -> Message:
        try:
            return self._client.recv()
        except (RemoteError, ConnectionClosed) as err:
            raise DaemonError(str(err)) from None

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        return self.train_stream(epoch, self._batch)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        return self.eval_stream(split, self._batch)

    def train_stream(self, epoch: int, convert: "Callable[[BatchReady], T]") -> Iterator[T]:
        """Epoch ``epoch``'s training batches, each announced slot turned into what ``convert`` makes of it (a
        ``Batch``; the link task's ``LinkBatch``, through ``read_slot``)."""
        self._send(StartEpoch(epoch=epoch))
        try:
            yield from self._stream("train", EpochEnd, convert)
        finally:
            self._queued(False)  # the stream ended, or failed, while queued: the wait is over either way

    def eval_stream(self, split: str, convert: "Callable[[BatchReady], T]") -> Iterator[T]:
        """Evaluation split ``split``'s batches, as ``train_stream``'s."""
        self._send(EvalRequest(split=split))
        yield from self._stream(split, EvalEnd, convert)

    def _stream(self, kind: str, end: type[EpochEnd] | type[EvalEnd], convert: "Callable[[BatchReady], T]"
                ) -> Iterator[T]:
        received = 0
        last_position = 0
        while True:
            msg = self._recv()
            if not isinstance(msg, Queued):
                self._queued(False)
            if isinstance(msg, BatchReady):
                if msg.seq != self._next_seq:
                    raise DaemonError(f"batch sequence gap: expected seq {self._next_seq}, got {msg.seq}")
                if msg.kind != kind:
                    raise DaemonError(f"expected a {kind} batch, got a {msg.kind} batch")
                self._next_seq += 1
                received += 1
                yield convert(msg)
            elif isinstance(msg, end):
                if msg.batches != received:
                    raise DaemonError(f"{kind} stream ended after {received} batches, daemon says {msg.batches}")
                return
            elif isinstance(msg, Queued) and kind == "train" and received == 0:
                # another trainer holds the daemon's training pipeline: wait for it (the daemon keeps telling)
                self._queued(True)  # before the line: a stop asked for on reading it finds the wait begun
                if msg.position != last_position:
                    log.info("waiting for the loader daemon's training pipeline: place %d in its queue, %s is "
                             "training", msg.position, msg.holder)
                    last_position = msg.position
            elif isinstance(msg, Bye):
                raise DaemonError(f"the loader daemon closed the session ({msg.reason or 'no reason given'})")
            else:
                raise DaemonError(f"unexpected {msg.TAG} message during a {kind} stream")

    def _queued(self, waiting: bool) -> None:
        if waiting != self._waiting:
            self._waiting = waiting
            if self._on_queued is not None:
                self._on_queued(waiting)

    def read_slot(self, ready: BatchReady) -> tuple[BatchArrays, Callable[[], None]]:
        """The announced batch's arrays (views of its slot, checked) and the call that hands the slot back."""
        views = self._client.read_batch(ready).arrays

        def release() -> None:
            if not self._client.closed:
                self._send(Release(slot=ready.slot, seq=ready.seq))

        try:
            arrays = BatchArrays.read(views, self._info.feature_cache_rows)
        except SlotError as err:
            release()
            raise DaemonError(f"{ready.kind} batch seq {ready.seq}: {err}") from None
        return arrays, release

    def _batch(self, ready: BatchReady) -> Batch:
        arrays, release = self.read_slot(ready)
        plan = None
        if arrays.hit_slot is not None and arrays.upd_slot is not None and arrays.upd_pos is not None:
            plan = DeviceCachePlan(torch.from_numpy(arrays.hit_slot), torch.from_numpy(arrays.upd_slot),
                                   torch.from_numpy(arrays.upd_pos), self._cache_step)
            self._cache_step += 1
        return Batch(x=torch.from_numpy(arrays.x), y=torch.from_numpy(arrays.y),
                     edge_index=torch.from_numpy(arrays.edge_index), n_id=torch.from_numpy(arrays.n_id),
                     num_sampled_nodes=[int(v) for v in arrays.nodes_per_hop],
                     num_sampled_edges=[int(v) for v in arrays.edges_per_hop],
                     seq=ready.seq, cache_plan=plan,
                     x_agg=None if arrays.x_agg is None else torch.from_numpy(arrays.x_agg),
                     class_weight=None if arrays.class_weight is None else torch.from_numpy(arrays.class_weight),
                     seed_group=None if arrays.seed_group is None else torch.from_numpy(arrays.seed_group),
                     global_seeds=ready.global_seeds if self._ranks.distributed else None,
                     stream_batches=ready.num_batches if ready.num_batches >= 0 else None, _release=release)

    def close(self) -> None:
        if self._pinned is not None:  # before the unmap: the registration names those pages
            self._pinned.release()
        self._client.close("trainer done")
