"""Feature gather into a shared-memory slot: numba row copy plus the byte-offset lookup it reads.

Feature rows live in ``features.bin`` partition by partition, each partition starting at its
own aligned ``feat_offset``; ``row_offsets_for`` turns global ids into byte offsets once per
mega-batch, and ``gather_rows`` copies the rows of each batch's nodes into its slot.
"""

import numpy as np

from proto.jit import kernel

__all__ = ["gather_rows"]


@kernel
def _gather(src: np.ndarray, row_offsets: np.ndarray, row_bytes: int, nodes: np.ndarray, out: np.ndarray) -> None:
    """The copy of ``gather_rows``; checks every row before copying any, since numba does not bounds-check.

    Rows of whole 8-byte words at offsets that are multiples of 8 (float32 rows of an even width, float16 of a
    width divisible by 4: every feature file's partition starts aligned) are copied a word at a time, which is
    twice the byte-slice copy's rate on 1 KiB rows (numba's slice assignment does not become a memcpy); others
    by byte slices."""
    num_local = row_offsets.shape[0]
    words = row_bytes % 8 == 0
    for k in range(nodes.shape[0]):
        node = nodes[k]
        if node < 0 or node >= num_local:
            raise ValueError("nodes: a local id is outside [0, len(row_offsets))")
        offset = row_offsets[node]
        if offset < 0 or offset + row_bytes > src.shape[0]:
            raise ValueError("row_offsets: a row lies outside src")
        if offset % 8:
            words = False
    if words:
        # a row ending at offset + row_bytes <= len(src), a multiple of 8, lies inside the whole words of src
        src_words = src[:src.shape[0] - src.shape[0] % 8].view(np.uint64)
        out_words = out[:nodes.shape[0] * row_bytes].view(np.uint64)
        width = row_bytes // 8
        for k in range(nodes.shape[0]):
            first = row_offsets[nodes[k]] // 8
            at = k * width
            for j in range(width):
                out_words[at + j] = src_words[first + j]
        return
    for k in range(nodes.shape[0]):
        offset = row_offsets[nodes[k]]
        out[k * row_bytes:(k + 1) * row_bytes] = src[offset:offset + row_bytes]


def gather_rows(src: np.ndarray, row_offsets: np.ndarray, row_bytes: int, nodes: np.ndarray, out: np.ndarray
                ) -> None:
    """``out[k*row_bytes:(k+1)*row_bytes] = src[row_offsets[nodes[k]]:+row_bytes]`` for every k.

    src: uint8 1-D (an np.memmap or a view of an mmap is fine, never copied); row_offsets:
    int64 [M]; nodes: [K] local ids (any integer dtype); out: uint8 1-D with at least
    K*row_bytes bytes. Raises ValueError naming the field for a wrong dtype or shape, a local
    id outside [0, M) or a row outside ``src``; nothing is written then. Releases the GIL.
    """
    for name, array in (("src", src), ("out", out)):
        if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D uint8 array, got {getattr(array, 'dtype', type(array))} "
                             f"{getattr(array, 'shape', '')}")
    if not isinstance(row_offsets, np.ndarray) or row_offsets.dtype != np.int64 or row_offsets.ndim != 1:
        raise ValueError(f"row_offsets: expected a 1-D int64 array, got {getattr(row_offsets, 'dtype', None)}")
    if row_bytes < 0:
        raise ValueError(f"row_bytes: {row_bytes} is negative")
    node_array = np.asarray(nodes)
    if node_array.ndim != 1 or (node_array.size and node_array.dtype.kind not in "iu"):
        raise ValueError(f"nodes: expected a 1-D integer array, got {node_array.dtype} {node_array.shape}")
    if out.shape[0] < len(node_array) * row_bytes:
        raise ValueError(f"out: {out.shape[0]} bytes, {len(node_array)} rows of {row_bytes} need "
                         f"{len(node_array) * row_bytes}")
    _gather(src, row_offsets, row_bytes, np.ascontiguousarray(node_array, dtype=np.int64), out)
