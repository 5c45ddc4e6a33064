"""Batches from the loader daemon: the control socket and zero-copy views of its shared-memory slots.

Everything goes through ``proto``: ``ControlClient`` for the socket, ``SlotRing`` views for the data.
The tensors of a yielded ``Batch`` alias the slot, so the training loop calls ``Batch.release()``
as soon as it no longer reads them; the Release message returns the slot and one credit.
"""

import os
import time
import warnings
from collections.abc import Iterator

import numpy as np
import torch

from proto.client import ControlClient
from proto.errors import ConnectFailed, ConnectionClosed, RemoteError
from proto.messages import BatchReady, Bye, Credit, EpochEnd, EvalEnd, EvalRequest, Message, Release, StartEpoch
from trainer.batch import Batch, DeviceCachePlan
from trainer.source import BatchSource, SourceInfo

__all__ = ["DaemonSource", "DaemonError", "CONNECT_RETRY_SECONDS"]

CONNECT_RETRY_SECONDS = 0.2

# Slots are mapped read-only on purpose (the trainer must never write into the daemon's memory);
# torch warns about every non-writable array it wraps, so silence exactly that warning.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class DaemonError(RuntimeError):
    """The daemon refused a request, broke the protocol, or went away; the message says which (one line)."""


class DaemonSource(BatchSource):
    """A session with ``megabatch serve`` at ``socket_path``; ``credits`` = batches in flight (default: all slots).

    feature_cache_bytes (default 0: none): ask the daemon to plan a feature cache of this many
    bytes on the trainer; ``info.feature_cache_rows`` is what it accepted. Training batches then
    carry a ``cache_plan`` and only the rows the cache lacks (``trainer.device_cache``).
    """

    def __init__(self, socket_path: str, credits: int | None = None, timeout: float | None = 60.0,
                 connect_timeout: float = 0.0, feature_cache_bytes: int = 0) -> None:
        if feature_cache_bytes < 0:
            raise ValueError(f"feature_cache_bytes must be >= 0, got {feature_cache_bytes}")
        # connect_timeout > 0: wait for a daemon that is still starting (its socket appears when it is ready)
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._client = ControlClient.connect(socket_path, client=f"megabatch-trainer pid {os.getpid()}",
                                                     timeout=timeout, feature_cache_bytes=feature_cache_bytes)
                break
            except ConnectFailed as err:
                if time.monotonic() >= deadline:
                    raise DaemonError(str(err)) from None
                time.sleep(CONNECT_RETRY_SECONDS)
            except (RemoteError, ConnectionClosed, TimeoutError) as err:
                raise DaemonError(str(err)) from None
        w = self._client.welcome
        d = w.dataset
        self._info = SourceInfo(num_features=d.num_features, num_classes=d.num_classes, num_hops=d.num_hops,
                                batch_size=d.batch_size, train_nodes=d.train_nodes,
                                description=f"daemon {socket_path} (session {w.session}, dataset {d.name}, "
                                            f"{w.slots.count} slots of {w.slots.slot_bytes >> 20} MiB)",
                                feature_dtype=d.feature_dtype, feature_cache_rows=w.feature_cache_rows)
        self._next_seq = 0
        self._cache_step = 0  # plans received so far: the device cache checks they are applied in this order
        self._send(Credit(count=credits or w.slots.count))

    @property
    def info(self) -> SourceInfo:
        return self._info

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
        self._send(StartEpoch(epoch=epoch))
        yield from self._stream("train", EpochEnd)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        self._send(EvalRequest(split=split))
        yield from self._stream(split, EvalEnd)

    def _stream(self, kind: str, end: type[EpochEnd] | type[EvalEnd]) -> Iterator[Batch]:
        received = 0
        while True:
            msg = self._recv()
            if isinstance(msg, BatchReady):
                if msg.seq != self._next_seq:
                    raise DaemonError(f"batch sequence gap: expected seq {self._next_seq}, got {msg.seq}")
                if msg.kind != kind:
                    raise DaemonError(f"expected a {kind} batch, got a {msg.kind} batch")
                self._next_seq += 1
                received += 1
                yield self._batch(msg)
            elif isinstance(msg, end):
                if msg.batches != received:
                    raise DaemonError(f"{kind} stream ended after {received} batches, daemon says {msg.batches}")
                return
            elif isinstance(msg, Bye):
                raise DaemonError(f"the loader daemon closed the session ({msg.reason or 'no reason given'})")
            else:
                raise DaemonError(f"unexpected {msg.TAG} message during a {kind} stream")

    def _batch(self, ready: BatchReady) -> Batch:
        arrays = self._client.read_batch(ready).arrays

        def tensor(name: str) -> torch.Tensor:
            return torch.from_numpy(arrays[name])

        def release() -> None:
            if not self._client.closed:
                self._send(Release(slot=ready.slot, seq=ready.seq))

        plan = None
        if "hit_slot" in arrays:
            try:
                self._check_plan(arrays)
            except DaemonError:
                release()
                raise
            plan = DeviceCachePlan(tensor("hit_slot"), tensor("upd_slot"), tensor("upd_pos"), self._cache_step)
            self._cache_step += 1
        return Batch(x=tensor("x"), y=tensor("y"), edge_index=tensor("edge_index"), n_id=tensor("n_id"),
                     num_sampled_nodes=[int(v) for v in np.asarray(arrays["nodes_per_hop"])],
                     num_sampled_edges=[int(v) for v in np.asarray(arrays["edges_per_hop"])],
                     seq=ready.seq, cache_plan=plan, _release=release)

    def _check_plan(self, arrays: dict[str, np.ndarray]) -> None:
        """Refuse a cache plan that would index out of range or leave a row unwritten (vectorized, O(n)).

        Checked on the host, where the slot is: on a GPU a bad index is an asynchronous device
        assert, not an error naming the batch.
        """
        rows = self._info.feature_cache_rows
        hit, slots, pos = arrays["hit_slot"], arrays.get("upd_slot"), arrays.get("upd_pos")
        if rows == 0:
            raise DaemonError("the daemon sent a feature cache plan, but this session has no feature cache")
        if slots is None or pos is None or hit.dtype != np.int32 or slots.dtype != np.int32 or pos.dtype != np.int32:
            raise DaemonError("a feature cache plan needs int32 hit_slot, upd_slot and upd_pos arrays")
        n = len(hit)
        if hit.size and (hit.min() < -1 or hit.max() >= rows):
            raise DaemonError(f"hit_slot outside [-1, {rows})")
        if slots.shape != pos.shape or (slots.size and (slots.min() < 0 or slots.max() >= rows
                                                        or pos.min() < 0 or pos.max() >= n)):
            raise DaemonError(f"upd_slot/upd_pos: shapes {slots.shape}/{pos.shape}, or outside [0, {rows})/[0, {n})")
        shipped = int(np.count_nonzero(hit < 0))
        if arrays["x"].shape[0] != shipped:
            raise DaemonError(f"x has {arrays['x'].shape[0]} rows, the cache plan ships {shipped}")

    def close(self) -> None:
        self._client.close("trainer done")
