"""numba kernels of the window stager."""

import numpy as np

from loader.jit import kernel

__all__ = ["copy_rows_from"]


@kernel
def copy_rows_from(src: np.ndarray, offsets: np.ndarray, out: np.ndarray, row_bytes: int) -> None:
    """``out[k * row_bytes:(k + 1) * row_bytes] = src[offsets[k]:offsets[k] + row_bytes]`` for every k.

    src, out: uint8; the caller checks every range lies inside both (numba does not bounds-check).
    """
    for k in range(len(offsets)):
        at = offsets[k]
        out[k * row_bytes:(k + 1) * row_bytes] = src[at:at + row_bytes]
