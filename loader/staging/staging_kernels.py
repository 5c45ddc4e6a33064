"""numba kernels of the window stager."""

import numpy as np

from loader.jit import kernel

__all__ = ["copy_rows_from", "keep_distinct", "keep_chunks"]


@kernel
def copy_rows_from(src: np.ndarray, offsets: np.ndarray, out: np.ndarray, row_bytes: int) -> None:
    """``out[k * row_bytes:(k + 1) * row_bytes] = src[offsets[k]:offsets[k] + row_bytes]`` for every k.

    src, out: uint8; the caller checks every range lies inside both (numba does not bounds-check).
    """
    for k in range(len(offsets)):
        at = offsets[k]
        out[k * row_bytes:(k + 1) * row_bytes] = src[at:at + row_bytes]


@kernel
def keep_distinct(keys: np.ndarray) -> int:
    """Drop repeats from ascending ``keys`` in place; returns how many distinct keys lead the array now."""
    kept = 0
    for i in range(len(keys)):
        if kept == 0 or keys[i] != keys[kept - 1]:
            keys[kept] = keys[i]
            kept += 1
    return kept


@kernel
def keep_chunks(keys: np.ndarray, shift: np.uint64, staged: np.ndarray) -> int:
    """Keep, in place and in order, the keys whose chunk (``key >> shift``) is ``staged``; returns how many."""
    kept = 0
    for i in range(len(keys)):
        if staged[np.int64(keys[i] >> shift)]:
            keys[kept] = keys[i]
            kept += 1
    return kept
