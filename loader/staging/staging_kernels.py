"""numba kernels of the window stager."""

import numpy as np

from proto.jit import kernel

__all__ = ["copy_rows_from", "keep_distinct", "keep_chunks", "scatter_pieces"]


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


@kernel
def scatter_pieces(chunk: np.ndarray, source: np.ndarray, first: np.ndarray, end: np.ndarray, owner: np.ndarray,
                   at: np.ndarray, row: int, page: int, tails: np.ndarray, tail_len: np.ndarray, scatter: np.ndarray,
                   whole: np.ndarray) -> None:
    """Lay out pieces for page-sized writes, all in units of ``chunk``'s dtype (bytes, or 8-byte words).

    Piece k belongs to batch ``owner[k]`` and is rows ``source[first[k]:end[k]]`` of ``chunk`` (their offsets,
    ``row`` units each). At ``scatter[at[k]:]`` it puts the batch's held partial page (``tails[b,
    :tail_len[b]]``) and then the rows. ``whole[k]`` gets the length of its whole pages (``page`` units), which
    are ready to write. The rest becomes the batch's new held partial page, zero-padded, and ``tail_len[b]``
    its length.
    """
    for k in range(len(first)):
        b = owner[k]
        t = tail_len[b]
        d = at[k]
        scatter[d:d + t] = tails[b, :t]
        d += t
        for r in range(first[k], end[k]):
            s = source[r]
            scatter[d:d + row] = chunk[s:s + row]
            d += row
        total = d - at[k]
        w = total // page * page
        rest = total - w
        tails[b, :rest] = scatter[at[k] + w:at[k] + total]
        tails[b, rest:] = 0
        tail_len[b] = rest
        whole[k] = w
