"""Keep freed chunk buffers from lingering in the process's resident set.

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), so
later chunk-sized numpy arrays come from the heap, where fragmentation keeps freed pages
resident: peak RSS then creeps above the memory budget. Pinning the threshold at 1 MiB keeps
every chunk buffer in its own mapping, returned to the OS on free.
"""

import ctypes
import ctypes.util

__all__ = ["pin_malloc_thresholds"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_THRESHOLD_BYTES = 1 << 20


def pin_malloc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds at 1 MiB; False where the libc is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _THRESHOLD_BYTES))
