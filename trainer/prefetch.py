"""One batch ahead: the next batch is taken from the source and its device copy started (on a side CUDA
stream) while the current one trains; every batch's seq is checked to follow the last one's."""

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
    copied: "torch.cuda.Event | None"


class Stager:
    """Starts device copies on a side stream and hands batches over once their copy has landed.

    With a feature cache, ``finish`` also assembles each batch's full ``x`` on the device, on the
    compute stream, after its copy: only the shipped rows cross PCIe, and batches are assembled
    in the order they are finished, which is the order the source yields them. ``rows_shipped``
    and ``rows_cached`` count the rows of finished batches by origin (``take_rows`` resets them).
    """

    def __init__(self, device: torch.device, cache: DeviceFeatureCache | None = None) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.cache = cache
        self.rows_shipped = 0
        self.rows_cached = 0

    def take_rows(self) -> tuple[int, int]:
        """(shipped, cached) rows of the batches finished since the last call."""
        rows = self.rows_shipped, self.rows_cached
        self.rows_shipped = self.rows_cached = 0
        return rows

    def start(self, batch: Batch) -> _Staged:
        if self.stream is None:
            return _Staged(batch, batch.to(self.device), None)
        with torch.cuda.stream(self.stream):
            moved = batch.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return _Staged(batch, moved, event)

    def finish(self, staged: _Staged) -> Batch:
        if staged.copied is not None:
            # the slot is shared memory the producer overwrites once released: the copy must be complete
            staged.copied.synchronize()
            staged.host.release()
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(staged.copied)
            plan = staged.device.cache_plan
            for tensor in (staged.device.x, staged.device.y, staged.device.edge_index,
                           *(plan.tensors() if plan is not None else ())):
                tensor.record_stream(compute)  # memory allocated on the copy stream is used on this one
        batch = staged.device
        shipped = batch.x.shape[0]
        self.rows_shipped += shipped
        if batch.cache_plan is not None:
            if self.cache is None:
                raise RuntimeError("a batch carries a feature cache plan but the source has no feature cache")
            self.rows_cached += batch.cache_plan.hit_slot.shape[0] - shipped
            batch = self.cache.assemble_batch(batch)
        return batch

    def abandon(self, staged: _Staged) -> None:
        if staged.copied is not None:
            staged.copied.synchronize()
        staged.host.release()


def prefetched(batches: Iterator[Batch], stager: Stager, check: SequenceCheck
                ) -> Generator[tuple[Batch, float], None, None]:
    """(batch ready on the device, seconds waited for it), fetching and copying one batch ahead.

    On the way out (end, error, or the consumer closing it) every batch taken from ``batches``
    has been released, the one being consumed included: release is idempotent.
    """
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
