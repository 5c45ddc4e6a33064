"""numba kernel of the 8-bit feature codes' decoding (``feature_codec.FeatureCodec.decode``): one pass over a
batch's codes, without the GIL, where the numpy expression makes three (a divide, a multiply and an add, each
over the whole batch)."""

import numba
import numpy as np

__all__ = ["decode_codes"]


@numba.njit(nogil=True, cache=True)
def decode_codes(codes: np.ndarray, low: np.ndarray, span: np.ndarray, levels: np.float32, out: np.ndarray) -> None:
    """out[i, j] = low[j] + span[j] * (codes[i, j] / levels), in float32, each operation rounded as numpy rounds it
    (codes uint8 (n, D); low, span float32 (D,); out float32 (n, D), C-contiguous)."""
    rows, dim = codes.shape
    for i in range(rows):
        for j in range(dim):
            share = np.float32(codes[i, j]) / levels
            out[i, j] = share * span[j] + low[j]
