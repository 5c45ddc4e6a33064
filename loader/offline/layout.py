"""Write the partition-contiguous files of a prepared dataset in bounded memory.

``write_structure`` builds the in-neighbour CSC (and the static nodes' second copy of their
lists) with an external sort keyed by (new target id, new source id). ``write_features``
permutes feature rows into the new order through per-range bucket files, so that every read
and write is sequential, and places each partition's first row on a 4096-byte boundary.
"""

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loader.format.dataset import FEATURE_ALIGNMENT
from loader.format.feature_codec import FeatureCodec
from loader.format.fileio import write_all
from loader.format.npyio import NpyReader, NpyWriter, rows_per_chunk, write_npy
from loader.format.raw import RawDataset, iter_edge_chunks
from loader.offline.extsort import DISTRIBUTE_BYTES_PER_EDGE, external_sort_edges
from proto.errors import UserError
from proto.progress import Progress

__all__ = ["Renumbering", "feature_offsets", "write_structure", "write_features"]


@dataclass(frozen=True)
class Renumbering:
    """The new node order.

    new_to_orig: int64 (N,), original id of each new id; orig_to_new: its inverse;
    node_begin/node_end: int64 (P,), each partition's new-id range (contiguous, in order).
    """

    new_to_orig: np.ndarray
    orig_to_new: np.ndarray
    node_begin: np.ndarray
    node_end: np.ndarray

    @classmethod
    def from_parts(cls, part: np.ndarray, num_parts: int) -> "Renumbering":
        """Order nodes by (partition, original id)."""
        new_to_orig = np.argsort(part, kind="stable").astype(np.int64)
        orig_to_new = np.empty_like(new_to_orig)
        orig_to_new[new_to_orig] = np.arange(len(part), dtype=np.int64)
        sizes = np.bincount(part, minlength=num_parts).astype(np.int64)
        node_end = np.cumsum(sizes)
        return cls(new_to_orig, orig_to_new, node_end - sizes, node_end)

    def partition_of(self, new_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.node_end, new_ids, side="right")


def write_structure(raw: RawDataset, renumbering: Renumbering, indptr: np.ndarray, static_nodes: np.ndarray,
                    out_dir: Path, scratch: Path, budget: int, index_dtype: np.dtype, progress: bool) -> int:
    """Write ``indices.npy``, ``indptr.npy``, ``static_indptr.npy`` and ``static_indices.npy``.

    ``indptr`` (new ids) comes from the degree pass; the sorted edges fill exactly its ranges.
    Returns the number of cut edges (endpoints in different partitions).
    """
    n = raw.header.num_nodes
    o2n = renumbering.orig_to_new
    chunk_rows = rows_per_chunk(DISTRIBUTE_BYTES_PER_EDGE, budget, minimum=1024)

    def by_new_target() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for src, dst in iter_edge_chunks(raw, chunk_rows):
            yield o2n[dst], o2n[src]
            del src, dst

    is_static = np.zeros(n, dtype=bool)
    is_static[static_nodes] = True
    cut_edges = 0
    with NpyWriter(out_dir / "indices.npy", index_dtype, nrows=raw.header.num_edges) as indices, \
            NpyWriter(out_dir / "static_indices.npy", index_dtype) as static_indices:
        for bucket in external_sort_edges(by_new_target, n, scratch, budget, progress=progress,
                                          step="build CSC"):
            indices.append(bucket.secondary.astype(index_dtype))
            cut_edges += int(np.count_nonzero(renumbering.partition_of(bucket.primary)
                                              != renumbering.partition_of(bucket.secondary)))
            static_mask = is_static[bucket.primary]
            static_indices.append(bucket.secondary[static_mask].astype(index_dtype))
    write_npy(out_dir / "indptr.npy", indptr)
    static_indptr = np.zeros(len(static_nodes) + 1, dtype=np.int64)
    np.cumsum(indptr[static_nodes + 1] - indptr[static_nodes], out=static_indptr[1:])
    write_npy(out_dir / "static_indptr.npy", static_indptr)
    return cut_edges


def feature_offsets(node_begin: np.ndarray, node_end: np.ndarray, row_bytes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Byte offset and length of each partition in ``features.bin``, and the padded file size."""
    nbytes = (node_end - node_begin) * row_bytes
    padded = -(-nbytes // FEATURE_ALIGNMENT) * FEATURE_ALIGNMENT
    offsets = np.concatenate(([0], np.cumsum(padded)[:-1])).astype(np.int64)
    return offsets, nbytes.astype(np.int64), int(padded.sum())


def write_features(raw: RawDataset, renumbering: Renumbering, static_nodes: np.ndarray, out_dir: Path,
                   scratch: Path, budget: int, out_dtype: np.dtype, progress: bool,
                   codec: FeatureCodec | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Write ``features.bin`` and ``static_features.npy``; return per-partition (offset, nbytes).

    Pass 1 streams the raw rows in original order and appends each to the bucket file of its
    new-id range; pass 2 loads one bucket at a time, orders it, and writes it in place.
    Rows are cast to ``out_dtype``; a float16 overflow is an error, not a silent inf. With ``codec``
    (``out_dtype`` uint8) rows are written as its 8-bit codes.
    """
    if (codec is None) != (np.dtype(out_dtype) != np.uint8):
        raise ValueError("uint8 features are written with a codec, and only they")
    n, dim = raw.header.num_nodes, raw.header.feat_dim
    in_dtype = np.dtype(raw.header.feat_dtype)
    in_row = dim * in_dtype.itemsize
    out_row = dim * out_dtype.itemsize
    offsets, nbytes, total = feature_offsets(renumbering.node_begin, renumbering.node_end, out_row)
    # each row costs its input bytes twice (chunk + reordered copy) plus id bookkeeping
    chunk_rows = rows_per_chunk(2 * in_row + 32, budget, minimum=64)
    # encoding holds two float32 copies of a bucket's rows (scaled, rounded) beside them
    coding = 0 if codec is None else 2 * dim * 4
    bucket_rows = rows_per_chunk(in_row + out_row + coding + 24, budget, minimum=64)
    num_buckets = -(-n // bucket_rows)
    id_paths = [scratch / f"feat-{b:06d}.ids" for b in range(num_buckets)]
    row_paths = [scratch / f"feat-{b:06d}.rows" for b in range(num_buckets)]
    o2n = renumbering.orig_to_new
    try:
        with NpyReader(raw.features) as reader, Progress("features: distribute", n, "rows",
                                                          enabled=progress) as bar:
            for start, rows in reader.chunks(chunk_rows):
                new_ids = o2n[start:start + len(rows)]
                which = new_ids // bucket_rows
                order = np.argsort(which, kind="stable")
                new_ids, rows, which = new_ids[order], rows[order], which[order]
                bounds = np.searchsorted(which, np.arange(num_buckets + 1))
                for b in np.flatnonzero(np.diff(bounds)).tolist():
                    lo, hi = bounds[b], bounds[b + 1]
                    _append(id_paths[b], new_ids[lo:hi])
                    _append(row_paths[b], rows[lo:hi])
                bar.update(len(rows))
                del rows, new_ids, which, order
        fd = os.open(out_dir / "features.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, total)
            with NpyWriter(out_dir / "static_features.npy", out_dtype, (dim,), nrows=len(static_nodes)) as static, \
                    Progress("features: place", num_buckets, "buckets", enabled=progress) as bar:
                for b in range(num_buckets):
                    lo, hi = b * bucket_rows, min(n, (b + 1) * bucket_rows)
                    ids = np.fromfile(id_paths[b], dtype=np.int64)
                    rows = np.fromfile(row_paths[b], dtype=in_dtype).reshape(-1, dim)
                    id_paths[b].unlink()
                    row_paths[b].unlink()
                    block = np.empty((hi - lo, dim), dtype=out_dtype)
                    block[ids - lo] = rows if codec is None else codec.encode(rows)
                    del rows, ids
                    if codec is None and out_dtype != in_dtype and not np.isfinite(block).all():
                        _raise_overflow(block, lo, renumbering, out_dtype)
                    _place_block(fd, block, lo, renumbering, offsets, out_row)
                    in_block = static_nodes[(static_nodes >= lo) & (static_nodes < hi)]
                    static.append(block[in_block - lo])
                    bar.update()
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        for path in (*id_paths, *row_paths):
            if path.exists():
                path.unlink()
    return offsets, nbytes


def _raise_overflow(block: np.ndarray, first_new_id: int, renumbering: Renumbering, dtype: np.dtype) -> None:
    row = int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
    orig = int(renumbering.new_to_orig[first_new_id + row])
    raise UserError(f"features of node {orig} overflow {dtype}; keep --feat-dtype float32")


def _append(path: Path, array: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        write_all(fd, array)
    finally:
        os.close(fd)


def _place_block(fd: int, block: np.ndarray, first: int, renumbering: Renumbering, offsets: np.ndarray,
                 row_bytes: int) -> None:
    """pwrite rows ``[first, first + len(block))`` at their partitions' aligned offsets."""
    last = first + len(block)
    part = int(np.searchsorted(renumbering.node_end, first, side="right"))
    while part < len(offsets) and renumbering.node_begin[part] < last:
        seg_lo = max(first, int(renumbering.node_begin[part]))
        seg_hi = min(last, int(renumbering.node_end[part]))
        if seg_hi > seg_lo:
            offset = int(offsets[part]) + (seg_lo - int(renumbering.node_begin[part])) * row_bytes
            write_all(fd, block[seg_lo - first:seg_hi - first], offset=offset)
        part += 1
