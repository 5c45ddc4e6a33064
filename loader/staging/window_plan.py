"""Where each feature row a window of sampled batches needs is put, from the rows' byte offsets alone.

A window is H consecutive batches of the exact schedule (the byte offsets of each batch's nodes'
rows; negative for a row held elsewhere, in a RAM cache). Staging them (``loader.staging.stager``)
reads the chunks of ``features.bin`` they lie in once, in order, and writes every batch's rows into
that batch's own region of a staging file. This module computes that layout:

* each batch's *staged rows*: its distinct rows in file order, so that a pass over the file appends
  to every batch's region in order, and a batch's region is one sequential read at publish;
* each batch region's byte offset, 4 KiB aligned (O_DIRECT reads it back);
* which chunks are worth their pass (the cost model, ``chunk_costs``): rows in the others are left to
  random reads at publish.

The plan is one sorted uint64 key per staged row, ``chunk | batch | offset in chunk`` packed high to
low, so the pass walks it in order (chunk by chunk, batch by batch inside a chunk, file order inside
a batch) and the planner holds 8 B per staged row, not the dozens a table of per-node arrays costs:
long windows are the point, and their rows number in the millions. The gather from a batch's staged
rows back to its sampled order is not kept either: ``batch_gather`` recomputes it at publish from
the batch's own offsets (a sort of one batch), so nothing per node outlives the pass.

Vectorized: sorts and bincounts over the keys in slices, no loop over batches or nodes.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from loader.staging.staging_kernels import keep_chunks, keep_distinct

__all__ = ["WindowPlan", "plan_window", "plan_window_bytes", "batch_gather", "chunk_costs", "STAGING_ALIGN",
           "PLAN_BYTES_PER_ROW", "PLAN_SLICE_BYTES_PER_ROW", "PLAN_SLICE_ROWS"]

STAGING_ALIGN = 4096
"""Alignment of every batch's region in the staging file (O_DIRECT's page), and the page of the cost model."""
PLAN_SLICE_ROWS = _SLICE = 1 << 16
"""Keys handled at once where a temporary per key is needed (bounds the planner's peak), and the rows whose
offsets the planner asks for at once."""
PLAN_BYTES_PER_ROW = 8
"""Bytes per row given that planning holds at its peak with ``offsets`` given as a function: the keys,
sorted and filtered in place (an array of offsets adds its own 8 B); ``plan_window_bytes`` adds the
slices' temporaries."""
PLAN_SLICE_BYTES_PER_ROW = 64
"""Temporaries per key of a slice (masks, batch numbers, shifted copies)."""


def plan_window_bytes(rows: int) -> int:
    """Most bytes planning a window of ``rows`` rows holds at once, the caller's offsets included (tested)."""
    return PLAN_BYTES_PER_ROW * rows + PLAN_SLICE_BYTES_PER_ROW * min(rows, _SLICE)

_U = np.uint64

OffsetsOf = Callable[[int, int], np.ndarray]
"""``(begin, end)`` -> the byte offsets (int64; negative: not staged) of nodes ``begin:end`` of a window."""


@dataclass(frozen=True)
class WindowPlan:
    """The staging layout of one window of ``num_batches`` batches."""

    row_bytes: int
    chunk_bytes: int
    num_batches: int
    keys: np.ndarray
    """uint64, ascending, one per staged row: ``chunk << chunk_shift | batch << off_bits | offset in chunk``
    (empty once the window is staged: ``without_keys``)."""
    off_bits: int
    batch_bits: int
    staged_counts: np.ndarray
    """int64 [B]: staged rows of each batch."""
    batch_base: np.ndarray
    """int64 [B]: byte offset of batch b's region in the staging file (a multiple of ``STAGING_ALIGN``)."""
    chunk_staged: np.ndarray
    """bool [C]: chunk c of the file is read by the pass (rows of other chunks are read at random)."""
    staging_bytes: int
    """Size of the staging file: the last region's end, aligned."""

    @property
    def chunk_shift(self) -> int:
        return self.off_bits + self.batch_bits

    def region(self, b: int) -> tuple[int, int]:
        """(byte offset, length) of batch ``b``'s rows in the staging file."""
        return int(self.batch_base[b]), int(self.staged_counts[b]) * self.row_bytes

    @property
    def staged_rows(self) -> int:
        return int(self.staged_counts.sum())

    def chunk_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first byte, first key, end key) of every chunk the pass reads, in file order."""
        chunks = np.flatnonzero(self.chunk_staged).astype(np.uint64)
        shift = _U(self.chunk_shift)
        lo = np.searchsorted(self.keys, chunks << shift)
        hi = np.searchsorted(self.keys, (chunks + _U(1)) << shift)
        keep = hi > lo
        return chunks[keep].astype(np.int64) * self.chunk_bytes, lo[keep], hi[keep]

    def fields(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(batch, byte offset in its chunk) of keys ``lo:hi`` (int64 each)."""
        run = self.keys[lo:hi]
        batch = (run >> _U(self.off_bits)) & _U((1 << self.batch_bits) - 1)
        return batch.astype(np.int64), (run & _U((1 << self.off_bits) - 1)).astype(np.int64)

    def staged_offsets(self, b: int) -> np.ndarray:
        """File offsets of batch ``b``'s staged rows, ascending (a scan of the keys: for checks, not the pass)."""
        batch = (self.keys >> _U(self.off_bits)) & _U((1 << self.batch_bits) - 1)
        mine = self.keys[batch == _U(b)]
        chunk = (mine >> _U(self.chunk_shift)).astype(np.int64)
        return np.sort(chunk * self.chunk_bytes + (mine & _U((1 << self.off_bits) - 1)).astype(np.int64))

    def is_staged(self, offsets: np.ndarray) -> np.ndarray:
        """Per row offset (non-negative): whether its chunk is staged, so the row is in its batch's region."""
        chunk = np.asarray(offsets, dtype=np.int64) // self.chunk_bytes
        inside = chunk < len(self.chunk_staged)
        out = np.zeros(len(chunk), dtype=bool)
        out[inside] = self.chunk_staged[chunk[inside]]
        return out

    def without_keys(self) -> "WindowPlan":
        """The plan as read-back needs it: the regions and the chunk choice, the keys dropped."""
        return replace(self, keys=np.zeros(0, dtype=np.uint64))


def batch_gather(offsets: np.ndarray) -> np.ndarray:
    """For a batch's staged rows given by their file offsets (in the batch's order), each one's index among the
    batch's staged rows (its distinct offsets, ascending): the gather from its read-back region."""
    return np.unique(np.asarray(offsets, dtype=np.int64), return_inverse=True)[1].astype(np.int64, copy=False)


def plan_window(node_ptr: np.ndarray, offsets: np.ndarray | OffsetsOf, row_bytes: int, chunk_bytes: int, *,
                sequential_rate: float | None = None, random_reads: float | None = None,
                max_rows: int | None = None) -> WindowPlan:
    """The staging layout of the batches whose rows lie at ``offsets[node_ptr[b]:node_ptr[b + 1]]`` (byte offsets
    in a ``features.bin`` of ``row_bytes`` rows, ``row_offsets_for`` of the nodes; negative: not staged).
    ``offsets`` may be a function of ``(begin, end)`` giving those nodes' offsets: the planner then never holds
    them all (8 B per row less at its peak).

    With both rates, a chunk is staged only where the cost model finds it worth its pass (``chunk_costs``);
    without, every chunk holding a row is. ``max_rows``: at most that many offsets are non-negative (the caller
    counted them), so the keys take 8 B for each of those instead of each node; ValueError where more are."""
    if row_bytes <= 0:
        raise ValueError(f"row_bytes: {row_bytes} is not positive")
    if chunk_bytes < STAGING_ALIGN or chunk_bytes % STAGING_ALIGN:
        raise ValueError(f"chunk_bytes: {chunk_bytes} is not a positive multiple of {STAGING_ALIGN}")
    node_ptr = np.asarray(node_ptr, dtype=np.int64)
    if callable(offsets):
        offsets_of: OffsetsOf = offsets
        nodes = int(node_ptr[-1]) if len(node_ptr) else 0
    else:
        array = np.asarray(offsets, dtype=np.int64)
        offsets_of, nodes = (lambda begin, end: array[begin:end]), len(array)
    if node_ptr.ndim != 1 or len(node_ptr) < 1 or node_ptr[0] != 0 or node_ptr[-1] != nodes \
            or np.any(np.diff(node_ptr) < 0):
        raise ValueError(f"node_ptr: not the offsets of {nodes} nodes")
    count = len(node_ptr) - 1
    off_bits = (chunk_bytes - 1).bit_length()
    batch_bits = max(1, (count - 1).bit_length())
    keys, last = _keys(node_ptr, offsets_of, chunk_bytes, off_bits, off_bits + batch_bits,
                       nodes if max_rows is None else min(nodes, max_rows))
    chunks = last // chunk_bytes + 1
    if off_bits + batch_bits + max(1, chunks.bit_length()) > 64:
        raise ValueError(f"a window of {count} batches over {chunks} chunks of {chunk_bytes} bytes does not fit "
                         f"64-bit keys")
    shift = _U(off_bits + batch_bits)
    entries = _bincount(keys, lambda k: (k >> shift).astype(np.int64), chunks)
    touched = entries > 0
    if sequential_rate is not None and random_reads is not None:
        staged_cost, direct_cost = chunk_costs(keys, shift, chunks, entries, row_bytes, chunk_bytes, sequential_rate,
                                               random_reads)
        chunk_staged = touched & (staged_cost <= direct_cost)
        if not chunk_staged[touched].all():
            keys = keys[:keep_chunks(keys, shift, chunk_staged)]
    else:
        chunk_staged = touched
    batch_mask = _U((1 << batch_bits) - 1)
    staged_counts = _bincount(keys, lambda k: ((k >> _U(off_bits)) & batch_mask).astype(np.int64), count)
    region = -(-staged_counts * row_bytes // STAGING_ALIGN) * STAGING_ALIGN
    batch_base = np.zeros(count, dtype=np.int64)
    np.cumsum(region[:-1], out=batch_base[1:])
    return WindowPlan(row_bytes=row_bytes, chunk_bytes=chunk_bytes, num_batches=count, keys=keys, off_bits=off_bits,
                      batch_bits=batch_bits, staged_counts=staged_counts, batch_base=batch_base,
                      chunk_staged=chunk_staged, staging_bytes=int(region.sum()))


def chunk_costs(keys: np.ndarray, shift: np.uint64, chunks: int, entries: np.ndarray, row_bytes: int, chunk_bytes: int,
                sequential_rate: float, random_reads: float) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk: (seconds to stage it, seconds to read its rows directly).

    Staging a chunk costs its sequential read plus writing and reading back each staged row of it
    (``(chunk_bytes + 2 x entries x row_bytes) / sequential_rate``: writes are taken at the read rate);
    reading its rows directly costs one random read per page per batch that needs it (``pages /
    random_reads``; a row over several pages reads them all). Dense chunks, which a long window makes the
    rule, are staged; a chunk few rows of the window fall in is not worth its pass (AGNES reads every
    block whole; DiskGNN packs everything)."""
    pages = np.zeros(chunks, dtype=np.int64)
    page_shift = _U(STAGING_ALIGN.bit_length() - 1)
    previous = None
    for s in range(0, len(keys), _SLICE):
        # sorted keys: a (chunk, batch, page) is new where the key's page part changes
        page = keys[s:s + _SLICE] >> page_shift
        new = np.empty(len(page), dtype=bool)
        new[0] = previous is None or page[0] != previous
        np.not_equal(page[1:], page[:-1], out=new[1:])
        previous = page[-1]
        pages += np.bincount((keys[s:s + _SLICE][new] >> shift).astype(np.int64), minlength=chunks)
    pages *= max(1, -(-row_bytes // STAGING_ALIGN))
    return (chunk_bytes + 2.0 * entries * row_bytes) / sequential_rate, pages / random_reads


def _keys(node_ptr: np.ndarray, offsets_of: OffsetsOf, chunk_bytes: int, off_bits: int, chunk_shift: int,
          size: int) -> tuple[np.ndarray, int]:
    """(the sorted, distinct keys of every non-negative offset, at most ``size`` of them, the largest offset): built in
    slices, in place, 8 B per key and a slice's temporaries."""
    nodes = int(node_ptr[-1])
    keys = np.empty(size, dtype=np.uint64)
    at, last = 0, 0
    for s in range(0, nodes, _SLICE):
        off = np.asarray(offsets_of(s, min(nodes, s + _SLICE)), dtype=np.int64)
        keep = np.flatnonzero(off >= 0)
        if not len(keep):
            continue
        batch = np.searchsorted(node_ptr, keep + s, side="right") - 1
        if at + len(keep) > size:
            raise ValueError(f"offsets: more than max_rows ({size}) are non-negative")
        off = off[keep]
        last = max(last, int(off.max()))
        piece = keys[at:at + len(keep)]
        np.left_shift((off // chunk_bytes).astype(np.uint64), _U(chunk_shift), out=piece)
        piece |= batch.astype(np.uint64) << _U(off_bits)
        piece |= (off % chunk_bytes).astype(np.uint64)
        at += len(keep)
    keys = keys[:at]
    keys.sort()
    # a node given twice in one batch is staged once (the sampler does not repeat nodes; this is not a trust)
    return keys[:keep_distinct(keys)], last


def _bincount(keys: np.ndarray, field: Callable[[np.ndarray], np.ndarray], length: int) -> np.ndarray:
    counts = np.zeros(length, dtype=np.int64)
    for s in range(0, len(keys), _SLICE):
        counts += np.bincount(field(keys[s:s + _SLICE]), minlength=length)
    return counts
