"""One batch ahead on CUDA: the next batch is taken from the source and its device copy started (on a side
stream) while the current one trains; on the host, where nothing overlaps the step, the next batch is taken
only once the current one is handed back. Every batch's seq is checked to follow the last one's."""

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import torch

from trainer.batch import Batch
from trainer.device_cache import DeviceFeatureCache

__all__ = ["SequenceError", "SequenceCheck", "Stager", "prefetched"]


class SequenceError(RuntimeError):
    """A batch arrived out of sequence: lost, duplicated or reordered on the way."""


class SequenceCheck:
    """Checks that ``seq`` numbers of one stream are consecutive (no gap, duplicate or reordering)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.last: int | None = None

    def __call__(self, seq: int) -> None:
        if self.last is not None and seq != self.last + 1:
            what = "a duplicate or reordered batch" if seq <= self.last else f"{seq - self.last - 1} batch(es) lost"
            raise SequenceError(f"batch sequence broken in the {self.stream} stream: expected seq {self.last + 1} "
                                f"after {self.last}, got {seq} ({what})")
        self.last = seq


@dataclass
class _Staged:
    host: Batch
    device: Batch
    """On CUDA: the batch as it will be on the device once ``assembled`` fires (full ``x`` with a cache)."""
    copied: "torch.cuda.Event | None"
    """Recorded on the copy stream after the copy from the slot: then the slot may be released."""
    assembled: "torch.cuda.Event | None"
    """Recorded after the feature cache's assembly (= ``copied`` without a cache plan): the step waits for it."""
    began: "torch.cuda.Event | None"
    copy_bytes: int
    rows_shipped: int
    rows_cached: int


def _host_bytes(batch: Batch) -> int:
    plan = batch.cache_plan
    tensors = (*batch.moved_tensors(), *(plan.tensors() if plan is not None else ()))
    return sum(t.numel() * t.element_size() for t in tensors)


class Stager:
    """Starts device copies on a side stream and hands batches over once their copy has landed.

    On CUDA the copy of batch i+1 runs on the side stream while batch i trains on the compute stream;
    from pinned slots (``trainer.host_pinning``) it is a DMA that overlaps the step, from pageable
    memory the driver stages it synchronously. With a feature cache, ``start`` also assembles each
    batch's full ``x`` on the device, on the side stream right after the batch's copy, so the cache's
    gathers and updates overlap the previous step too: only the shipped rows cross PCIe, and plans are
    applied in the order batches are started, which is the order the source yields them.

    ``rows_shipped`` and ``rows_cached`` count the rows of finished batches by origin (``take_rows``
    resets them); ``copy_bytes`` and ``copy_s`` the bytes copied to the device and the copies' time on
    the side stream (CUDA event time, 0 on CPU; ``take_copies`` resets them).
    """

    def __init__(self, device: torch.device, cache: DeviceFeatureCache | None = None) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.cache = cache
        self.rows_shipped = 0
        self.rows_cached = 0
        self.copy_bytes = 0
        self.copy_s = 0.0

    def take_rows(self) -> tuple[int, int]:
        """(shipped, cached) rows of the batches finished since the last call."""
        rows = self.rows_shipped, self.rows_cached
        self.rows_shipped = self.rows_cached = 0
        return rows

    def take_copies(self) -> tuple[int, float]:
        """(bytes, seconds) of the host-to-device copies of the batches finished since the last call."""
        copies = self.copy_bytes, self.copy_s
        self.copy_bytes, self.copy_s = 0, 0.0
        return copies

    def _assembled(self, batch: Batch) -> Batch:
        if batch.cache_plan is None:
            return batch
        if self.cache is None:
            raise RuntimeError("a batch carries a feature cache plan but the source has no feature cache")
        return self.cache.assemble_batch(batch)

    def start(self, batch: Batch) -> _Staged:
        shipped = batch.x.shape[0]
        cached = batch.cache_plan.hit_slot.shape[0] - shipped if batch.cache_plan is not None else 0
        if self.stream is None:
            return _Staged(batch, self._assembled(batch.to(self.device)), None, None, None, 0, shipped, cached)
        with torch.cuda.stream(self.stream):
            began = torch.cuda.Event(enable_timing=True)
            began.record(self.stream)
            moved = batch.to(self.device, non_blocking=True)
            copied = torch.cuda.Event(enable_timing=True)
            copied.record(self.stream)
            ready = self._assembled(moved)
            assembled = copied
            if ready is not moved:
                assembled = torch.cuda.Event()
                assembled.record(self.stream)
        return _Staged(batch, ready, copied, assembled, began, _host_bytes(batch), shipped, cached)

    def finish(self, staged: _Staged) -> Batch:
        if staged.copied is not None and staged.assembled is not None:
            # the slot is shared memory the producer overwrites once released: the copy must be complete
            staged.copied.synchronize()
            staged.host.release()
            if staged.began is not None:
                self.copy_s += staged.began.elapsed_time(staged.copied) / 1000
            self.copy_bytes += staged.copy_bytes
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(staged.assembled)
            device = staged.device
            for tensor in device.moved_tensors():
                tensor.record_stream(compute)  # memory allocated on the copy stream is used on this one
        self.rows_shipped += staged.rows_shipped
        self.rows_cached += staged.rows_cached
        return staged.device

    def abandon(self, staged: _Staged) -> None:
        if staged.copied is not None:
            staged.copied.synchronize()
        staged.host.release()


def prefetched(batches: Iterator[Batch], stager: Stager, check: SequenceCheck
                ) -> Generator[tuple[Batch, float], None, None]:
    """(batch ready on the device, seconds waited for it), fetching and copying one batch ahead on CUDA.

    On the host (no copy stream) it does not fetch ahead: there is no copy to overlap, and a batch taken
    early would hold a second of the daemon's slots (2 a client by default) through the whole step, so the
    daemon could publish the next batch only after the step, and the trainer would wait for every publish
    (7.5 ms of a 36 ms step on bench/compare's graph). The consumer releases each batch before asking for the
    next (``Batch.release``), so the daemon fills the other slot during the step.

    On the way out (end, error, or the consumer closing it) every batch taken from ``batches``
    has been released, the one being consumed included: release is idempotent.
    """
    if stager.stream is None:
        yield from _fetched_in_turn(batches, stager, check)
        return
    fetched: Batch | None = None
    staged: _Staged | None = None
    current: _Staged | None = None
    try:
        waited = 0.0
        while True:
            started = time.perf_counter()
            # finish first: on CUDA that hands the current slot back before blocking on the next one
            ready = stager.finish(current) if current is not None else None
            fetched = next(batches, None)
            if fetched is not None:
                check(fetched.seq)
                staged, fetched = stager.start(fetched), None
            waited += time.perf_counter() - started
            if ready is not None:
                yield ready, waited
                waited = 0.0
            if staged is None:
                return
            current, staged = staged, None
    finally:
        for pending in (current, staged):
            if pending is not None:
                stager.abandon(pending)
        if fetched is not None:
            fetched.release()
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _fetched_in_turn(batches: Iterator[Batch], stager: Stager, check: SequenceCheck
                     ) -> Generator[tuple[Batch, float], None, None]:
    """``prefetched`` on the host: each batch taken from ``batches`` when the consumer asks for it."""
    current: _Staged | None = None
    try:
        while True:
            started = time.perf_counter()
            fetched = next(batches, None)
            if fetched is None:
                return
            current = None
            try:
                check(fetched.seq)
            except BaseException:
                fetched.release()
                raise
            current = stager.start(fetched)
            ready = stager.finish(current)
            yield ready, time.perf_counter() - started
    finally:
        if current is not None:
            stager.abandon(current)
        close = getattr(batches, "close", None)
        if close is not None:
            close()
