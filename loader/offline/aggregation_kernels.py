"""The aggregation cache's kernel: every node's input features aggregated over all its in-neighbours."""

import math

import numpy as np

from proto.jit import kernel

__all__ = ["KIND_CODES", "aggregate_chunk", "half_to_float", "kernel_features"]

KIND_CODES = {"sum": 0, "mean": 1, "gcn": 2}
"""The aggregators, as the kernel's ``kind`` argument."""


@kernel
def half_to_float(bits: np.uint16) -> np.float32:
    """An IEEE half (its 16 bits) as float32: numba's CPU target has no float16 arrays, so float16 features are
    read as uint16 and widened here."""
    h = np.int64(bits)
    sign = -1.0 if (h >> 15) & 1 else 1.0
    exponent = (h >> 10) & 0x1F
    fraction = h & 0x3FF
    value: float
    if exponent == 0:
        value = fraction * 2.0 ** -24  # subnormal (and zero)
    elif exponent == 31:
        value = math.inf if fraction == 0 else math.nan
    else:
        value = (1.0 + fraction / 1024.0) * 2.0 ** (exponent - 15)
    return np.float32(sign * value)


@kernel
def _load(features: np.ndarray, i: int, half: bool) -> np.float32:
    if half:
        return half_to_float(np.uint16(features[i]))
    return np.float32(features[i])


@kernel
def aggregate_chunk(indptr: np.ndarray, indices: np.ndarray, edge_base: int, begin: int, end: int,
                    features: np.ndarray, row_start: np.ndarray, dim: int, in_degree: np.ndarray, kind: int,
                    out: np.ndarray, half: bool = False) -> None:
    """``out[v - begin]`` for the nodes ``begin .. end-1``: the sum (kind 0), the mean (1) or GCN's
    ``sum_u x_u / sqrt((d_u + 1)(d_v + 1)) + x_v / (d_v + 1)`` (2, d the global in-degree) of the rows of
    their in-neighbours ``indices[indptr[v] - edge_base : indptr[v + 1] - edge_base]``. A node's row is
    ``features[row_start[node] : row_start[node] + dim]`` (features.bin as a flat float32 array, or with
    ``half`` its float16 rows as uint16); accumulated in float32, ``out`` (end - begin, dim) float32 zeroed by
    the caller."""
    for v in range(begin, end):
        row = out[v - begin]
        dv = in_degree[v]
        for e in range(indptr[v] - edge_base, indptr[v + 1] - edge_base):
            u = indices[e]
            if kind == 2:
                w = np.float32(1.0 / np.sqrt((in_degree[u] + 1.0) * (dv + 1.0)))
            else:
                w = np.float32(1.0)
            start = row_start[u]
            for k in range(dim):
                row[k] += w * _load(features, start + k, half)
        if kind == 1 and dv > 0:
            scale = np.float32(1.0 / dv)
            for k in range(dim):
                row[k] *= scale
        elif kind == 2:
            w = np.float32(1.0 / (dv + 1.0))
            start = row_start[v]
            for k in range(dim):
                row[k] += w * _load(features, start + k, half)


def kernel_features(flat: np.ndarray) -> tuple[np.ndarray, bool]:
    """(``flat`` as the kernel reads it, its ``half`` flag): float16 rows reinterpreted as uint16."""
    if flat.dtype == np.float16:
        return flat.view(np.uint16), True
    return flat, False
