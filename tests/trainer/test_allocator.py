"""trainer.allocator: after ``keep_freed_memory`` a batch-sized block comes from malloc's heap and its pages are
reused, where glibc's default maps (and the kernel zero-fills) a fresh one every time."""

import ctypes
import subprocess
import sys

import pytest

# In a child: the thresholds are process-wide, and the test process keeps glibc's defaults.
PROBE = """
import ctypes, sys
from trainer.allocator import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
taken = keep_freed_memory() if sys.argv[1] == "keep" else None
size = 256 << 20  # a wide batch's gathered rows
block = libc.malloc(size)
mapped = libc.mallinfo2().hblkhd >= size
libc.free(block)
again = libc.malloc(size)
print(taken, mapped, block == again)
libc.free(again)
"""


def probe(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_glibc_maps_a_batch_sized_block_by_default_and_the_heap_serves_it_after_keep_freed_memory():
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc >= 2.33: no mallinfo2 to see where a block came from")
    assert probe("default")[:2] == ["None", "True"]  # its own mapping, unmapped when freed
    taken, mapped, reused = probe("keep")
    assert taken == "True" and mapped == "False" and reused == "True"  # from the heap, and the same block again
