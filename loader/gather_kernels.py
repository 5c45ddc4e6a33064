"""numba kernel of the publisher: copy feature rows, addressed by byte offset, into a slot."""

import numba
import numpy as np

__all__ = ["gather_rows", "row_offsets_for"]


@numba.njit(nogil=True, cache=False)
def _gather(src: np.ndarray, row_offsets: np.ndarray, row_bytes: int, nodes: np.ndarray, out: np.ndarray) -> None:
    for k in range(nodes.shape[0]):
        start = row_offsets[nodes[k]]
        dst = k * row_bytes
        out[dst:dst + row_bytes] = src[start:start + row_bytes]


def gather_rows(src: np.ndarray, row_offsets: np.ndarray, row_bytes: int, nodes: np.ndarray,
                out: np.ndarray) -> None:
    """``out[k*row_bytes:(k+1)*row_bytes] = src[row_offsets[nodes[k]]:][:row_bytes]`` for every k.

    ``src`` and ``out`` are uint8 1-D (``src`` may be a memory map); bounds are checked up front so
    a bad offset is an error, not a read outside the buffer.
    """
    if src.dtype != np.uint8 or out.dtype != np.uint8 or src.ndim != 1 or out.ndim != 1:
        raise ValueError("gather_rows: src and out must be 1-D uint8 arrays")
    if out.shape[0] < nodes.shape[0] * row_bytes:
        raise ValueError(f"gather_rows: out has {out.shape[0]} bytes, {nodes.shape[0]} rows need "
                         f"{nodes.shape[0] * row_bytes}")
    if nodes.shape[0]:
        offs = row_offsets[nodes]
        if offs.min() < 0 or offs.max() + row_bytes > src.shape[0]:
            raise ValueError("gather_rows: a row offset points outside src")
    _gather(src, row_offsets, row_bytes, np.ascontiguousarray(nodes, dtype=np.int64), out)


def row_offsets_for(global_ids: np.ndarray, part_node_begin: np.ndarray, part_feat_offset: np.ndarray,
                    row_bytes: int) -> np.ndarray:
    """Byte offset in ``features.bin`` of each node's row (partitions sorted by ``node_begin``)."""
    part = np.searchsorted(part_node_begin, global_ids, side="right") - 1
    return part_feat_offset[part] + (global_ids - part_node_begin[part]) * row_bytes
