"""Where each feature row a window of sampled batches needs is put, from the rows' byte offsets alone.

A window is H consecutive batches of the exact schedule (the row offsets of each batch's nodes whose rows are to be
staged: all of them, or those a RAM cache does not hold). Staging them (see
``loader.staging.stager``) reads ``features.bin`` once, in order, and writes every batch's rows into
that batch's own region of a staging file. This module computes the layout, as plain arrays:

* each batch's *staged rows*: its distinct nodes' rows in file order, so that a pass over the file
  appends to every batch's region in order, and a batch's region is one sequential read at publish;
* each batch region's byte offset, 4 KiB aligned (O_DIRECT reads it back);
* per node given (in the sampled order PyG wants: seeds first), the index of its row among its
  batch's staged rows, the gather that turns a read-back region into the batch's feature matrix.

Vectorized over the whole window: one lexsort, no loop over batches or nodes.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["WindowPlan", "plan_window", "choose_staged", "STAGING_ALIGN"]

STAGING_ALIGN = 4096
"""Alignment of every batch's region in the staging file (O_DIRECT's page)."""


@dataclass(frozen=True)
class WindowPlan:
    """The staging layout of one window of ``num_batches`` batches (arrays int64 unless said)."""

    row_bytes: int
    num_batches: int
    staged_ptr: np.ndarray
    """[B + 1]: batch b's staged rows are ``staged_offsets[staged_ptr[b]:staged_ptr[b + 1]]``."""
    staged_offsets: np.ndarray
    """File offset of each staged row; ascending within a batch."""
    batch_base: np.ndarray
    """[B]: byte offset of batch b's region in the staging file (a multiple of ``STAGING_ALIGN``)."""
    node_ptr: np.ndarray
    """[B + 1]: batch b's nodes given are ``node_ptr[b]:node_ptr[b + 1]`` (``gather``'s ranges)."""
    gather: np.ndarray
    """Per node given, in its batch's order: its row's index among its batch's staged rows."""
    staging_bytes: int
    """Size of the staging file: the last region's end, aligned."""

    def region(self, b: int) -> tuple[int, int]:
        """(byte offset, length) of batch ``b``'s rows in the staging file."""
        return int(self.batch_base[b]), int(self.staged_ptr[b + 1] - self.staged_ptr[b]) * self.row_bytes

    @property
    def staged_rows(self) -> int:
        return int(self.staged_ptr[-1])

    @property
    def delivered_rows(self) -> int:
        return int(self.node_ptr[-1])


def plan_window(node_ptr: np.ndarray, offsets: np.ndarray, row_bytes: int) -> WindowPlan:
    """The staging layout of the batches whose rows lie at ``offsets[node_ptr[b]:node_ptr[b + 1]]`` (byte
    offsets in a ``features.bin`` of ``row_bytes`` rows, ``row_offsets_for`` of the nodes; int64)."""
    if row_bytes <= 0:
        raise ValueError(f"row_bytes: {row_bytes} is not positive")
    node_ptr = np.asarray(node_ptr, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    if node_ptr.ndim != 1 or len(node_ptr) < 1 or node_ptr[0] != 0 or node_ptr[-1] != len(offsets) \
            or np.any(np.diff(node_ptr) < 0):
        raise ValueError(f"node_ptr: not the offsets of {len(offsets)} nodes")
    count = len(node_ptr) - 1
    sizes = np.diff(node_ptr)
    batch_of = np.repeat(np.arange(count, dtype=np.int64), sizes)
    order = np.lexsort((offsets, batch_of))  # batch-major, file order inside a batch
    sorted_batch, sorted_off = batch_of[order], offsets[order]
    # a node sampled twice in one batch is staged once (the sampler does not repeat nodes; this is not a trust)
    first = np.ones(len(order), dtype=bool)
    first[1:] = (sorted_batch[1:] != sorted_batch[:-1]) | (sorted_off[1:] != sorted_off[:-1])
    staged_index = np.cumsum(first) - 1  # global staged row of each sorted entry
    staged_offsets = sorted_off[first]
    staged_counts = np.bincount(sorted_batch[first], minlength=count).astype(np.int64)
    staged_ptr = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(staged_counts, out=staged_ptr[1:])
    gather = np.empty(len(order), dtype=np.int64)
    gather[order] = staged_index - staged_ptr[sorted_batch]
    region = -(-staged_counts * row_bytes // STAGING_ALIGN) * STAGING_ALIGN
    batch_base = np.zeros(count, dtype=np.int64)
    np.cumsum(region[:-1], out=batch_base[1:])
    return WindowPlan(row_bytes=row_bytes, num_batches=count, staged_ptr=staged_ptr, staged_offsets=staged_offsets,
                      batch_base=batch_base, node_ptr=node_ptr.copy(), gather=gather,
                      staging_bytes=int(region.sum()))


def choose_staged(node_ptr: np.ndarray, offsets: np.ndarray, row_bytes: int, chunk_bytes: int, sequential_rate: float,
                  random_reads: float) -> np.ndarray:
    """Per node of the batches ``node_ptr`` (its row at byte ``offsets``): stage it (True) or leave it to a
    random row read at publish (False), decided per ``chunk_bytes`` chunk of the file by a cost model.

    Staging a chunk costs its sequential read plus writing and reading back each staged row of it
    (``(chunk_bytes + 2 x entries x row_bytes) / sequential_rate`` seconds: writes are taken at the read
    rate); reading its rows directly costs one random read per page per batch that needs it (``pages /
    random_reads``). Dense chunks, which a long window makes the rule, are staged; a chunk few rows of the
    window fall in is not worth its pass (AGNES reads every block whole; DiskGNN packs everything).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    node_ptr = np.asarray(node_ptr, dtype=np.int64)
    if len(offsets) == 0:
        return np.zeros(0, dtype=bool)
    batch_of = np.repeat(np.arange(len(node_ptr) - 1, dtype=np.int64), np.diff(node_ptr))
    chunk = offsets // chunk_bytes
    chunks, chunk_index, entries = np.unique(chunk, return_inverse=True, return_counts=True)
    page = offsets // STAGING_ALIGN
    # a batch reads each page its rows start in once; rows over a page read their other pages too
    pairs = np.unique(batch_of * (int(page.max()) + 1) + page, return_index=True)[1]
    pages = np.bincount(chunk_index[pairs], minlength=len(chunks)) * max(1, -(-row_bytes // STAGING_ALIGN))
    staged_cost = (chunk_bytes + 2.0 * entries * row_bytes) / sequential_rate
    direct_cost = pages / random_reads
    return (staged_cost <= direct_cost)[chunk_index]
