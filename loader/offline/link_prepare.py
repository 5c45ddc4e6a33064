"""``prepare``'s part of a link-prediction dataset: the raw link files in new ids, the training
positives in edge-bucket order (docs/FORMAT.md, "Link prediction").

Held-out positives and their negatives keep their rows: each id is mapped through the
renumbering, nothing is reordered, so row r of ``val_edges.npy`` and of ``val_neg_tails.npy``
are the raw dataset's row r. The training positives are mapped the same way, then sorted by
(partition of source, partition of target, source, target) with one external sort
(``loader.format.link.bucket_keys``) and written with the offsets of their P * P buckets.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from loader.format.link import HELD_OUT, LINK_FILES, bucket_ids, bucket_keys, decode_bucket_keys
from loader.format.npyio import NpyColumnWriter, NpyReader, NpyWriter, rows_per_chunk, write_npy
from loader.format.raw import RawDataset
from loader.offline.extsort import DISTRIBUTE_BYTES_PER_EDGE, external_sort_edges
from loader.offline.layout import Renumbering

__all__ = ["bucket_table_bytes", "write_link_files"]


def bucket_table_bytes(num_partitions: int) -> int:
    """Bytes prepare holds for the bucket counts (and their offsets) of ``num_partitions`` partitions."""
    return 16 * (num_partitions * num_partitions + 1)


def write_link_files(raw: RawDataset, renumbering: Renumbering, out_dir: Path, scratch: Path, budget: int,
                     progress: bool) -> None:
    """Write the six link files of a prepared dataset (``LINK_FILES``) into ``out_dir``.

    ``budget``: bytes for streaming chunks and the sort, besides ``bucket_table_bytes``.
    """
    o2n = renumbering.orig_to_new
    columns = rows_per_chunk(32, budget, minimum=1024)
    for name in HELD_OUT:
        with NpyReader(raw.link_file(f"{name}_edges"), expect_dtype=np.int64, expect_ndim=2) as reader, \
                NpyColumnWriter(out_dir / LINK_FILES[f"{name}_edges"], np.int64, 2, reader.shape[1]) as out:
            for _start, pairs in reader.column_chunks(columns):
                out.append(o2n[pairs])
        with NpyReader(raw.link_file(f"{name}_neg_tails"), expect_dtype=np.int64, expect_ndim=2) as reader, \
                NpyWriter(out_dir / LINK_FILES[f"{name}_neg_tails"], np.int64, reader.shape[1:],
                          nrows=reader.nrows) as negatives:
            for _start, tails in reader.chunks(rows_per_chunk(2 * max(1, reader.row_bytes), budget)):
                negatives.append(o2n[tails])
    _write_train_edges(raw, renumbering, out_dir, scratch, budget, progress)


def _write_train_edges(raw: RawDataset, renumbering: Renumbering, out_dir: Path, scratch: Path, budget: int,
                       progress: bool) -> None:
    n = raw.header.num_nodes
    begin, end = renumbering.node_begin, renumbering.node_end
    num_parts = len(end)
    path = raw.link_file("train_edges")
    columns = rows_per_chunk(DISTRIBUTE_BYTES_PER_EDGE + 32, budget, minimum=1024)

    def by_bucket() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        with NpyReader(path, expect_dtype=np.int64, expect_ndim=2) as reader:
            for _start, pairs in reader.column_chunks(columns):
                keys = bucket_keys(renumbering.orig_to_new[pairs[0]], renumbering.orig_to_new[pairs[1]], begin, end, n)
                yield keys // n, keys % n
                del pairs, keys

    counts = np.zeros(num_parts * num_parts, dtype=np.int64)
    with NpyReader(path, expect_dtype=np.int64, expect_ndim=2) as reader:
        total = reader.shape[1]
    with NpyColumnWriter(out_dir / LINK_FILES["train_edges"], np.int64, 2, total) as out:
        for bucket in external_sort_edges(by_bucket, n, scratch, budget, progress=progress,
                                          step="link: edge buckets"):
            src, dst = decode_bucket_keys(bucket.primary * n + bucket.secondary, begin, end, n)
            out.append(np.stack((src, dst)))
            counts += np.bincount(bucket_ids(src, dst, end), minlength=num_parts * num_parts)
            del src, dst
    offsets = np.zeros(num_parts * num_parts + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    write_npy(out_dir / LINK_FILES["edge_buckets"], offsets)
