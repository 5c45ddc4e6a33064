"""The daemon's slot segment pinned for the GPU (``cudaHostRegister``), once per session.

A copy from pageable memory is not asynchronous: the driver stages it through a pinned bounce
buffer of its own, chunk by chunk, with the calling thread blocked, so batch i+1's copy cannot run
under batch i's step. Registering the read-only mapping of the slots makes every batch's arrays
page-locked where they already are, and ``Tensor.to(device, non_blocking=True)`` on the side stream
becomes a DMA the step overlaps (``trainer.prefetch``). No extra host copy is made.

The mapping is ``PROT_READ`` (the trainer must never write into the daemon's memory), so the
registration asks for ``cudaHostRegisterReadOnly``: the GPU only reads it. Where the device or its
runtime refuses (no read-only registration support, a sandboxed driver), the error is cleared and the
session keeps pageable copies, with one warning line: slower, never wrong. ``PinnedRegion.release``
unregisters; it must run before the mapping is unmapped (``DaemonSource.close`` orders the two).
"""

import ctypes
import logging
import mmap
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["CudaHostRuntime", "PinnedRegion", "PinOutcome", "pin_region", "HOST_REGISTER_PORTABLE",
           "HOST_REGISTER_READ_ONLY"]

HOST_REGISTER_PORTABLE = 0x01
"""``cudaHostRegisterPortable``: pinned for every CUDA context, not only the current device's."""
HOST_REGISTER_READ_ONLY = 0x08
"""``cudaHostRegisterReadOnly``: the device only reads the range (required for a ``PROT_READ`` mapping)."""

log = logging.getLogger("megabatch.trainer")


class CudaHostRuntime(Protocol):
    """The two calls of the CUDA runtime used here (``torch.cuda.cudart()`` provides them; tests fake them)."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> Any: ...

    def cudaHostUnregister(self, ptr: int) -> Any: ...


@dataclass
class PinnedRegion:
    """``nbytes`` at ``address`` registered with ``runtime``; ``release`` unregisters (idempotent)."""

    address: int
    nbytes: int
    runtime: CudaHostRuntime
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        code = int(self.runtime.cudaHostUnregister(self.address))
        if code != 0:
            _clear_last_cuda_error()
            log.warning("could not unregister the pinned slot segment (CUDA error %d); it is unpinned when the "
                        "process exits", code)


@dataclass(frozen=True)
class PinOutcome:
    """What ``pin_region`` did: ``region`` when pinned, else None and ``reason`` (one line) why not."""

    region: PinnedRegion | None
    reason: str = ""


def buffer_address(buffer: mmap.mmap | bytearray | memoryview) -> int:
    """The address of ``buffer``'s first byte, read-only buffers included (ctypes' ``from_buffer`` wants a
    writable one). The numpy view is dropped at once: a live export would keep an ``mmap`` from closing."""
    view = np.frombuffer(buffer, dtype=np.uint8)
    address = int(view.ctypes.data)
    del view
    return address


def pin_region(buffer: mmap.mmap | bytearray | memoryview, runtime: CudaHostRuntime | None = None) -> PinOutcome:
    """Register all of ``buffer`` as pinned, read-only host memory (``runtime`` default: torch's CUDA runtime)."""
    nbytes = len(buffer)
    if nbytes == 0:
        return PinOutcome(None, "the slot segment is empty")
    if runtime is None:
        import torch

        runtime = torch.cuda.cudart()
    address = buffer_address(buffer)
    code = int(runtime.cudaHostRegister(address, nbytes, HOST_REGISTER_PORTABLE | HOST_REGISTER_READ_ONLY))
    if code != 0:
        # a failed runtime call leaves "last error" set, and torch's next kernel launch check would raise it
        _clear_last_cuda_error()
        return PinOutcome(None, f"cudaHostRegister of the read-only slot segment failed (CUDA error {code})")
    return PinOutcome(PinnedRegion(address, nbytes, runtime))


def _clear_last_cuda_error() -> None:
    """``cudaGetLastError()`` on the CUDA runtime this process loaded (torch's), found by its path in
    ``/proc/self/maps`` so that it is the same library instance; nothing where none is loaded."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return
    for path in sorted(paths):
        try:
            ctypes.CDLL(path).cudaGetLastError()
        except (OSError, AttributeError):
            continue
