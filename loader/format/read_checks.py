"""Checked reads (dataset format 1.1, 1.2): the checksums ``prepare`` writes and the readers verify.

Two granularities, because the modes read at two granularities (docs/FORMAT.md, "Read checks"):

* per partition (``partition_checksums.npy``, uint64 (P, 3)): XXH3-64 of the partition's bytes of
  ``features.bin`` (its rows and the zero padding up to the next page: together the partitions tile
  the file), of ``indices.npy`` and of ``indptr.npy`` (its N_p + 1 entries), exactly the ranges the
  hierarchical reader reads. One library call per range; 10 GB/s next to a 0.7 GB/s disk.
* per block (``feature_blocks.npy``, ``index_pages.npy``, uint64, one per block of the file, the
  last block zero-padded; ``loader.format.checksum_kernels``): the row-granular exact and static modes read
  scattered pages of ``features.bin`` and ``indices.npy`` and check on the read thread the blocks
  holding what they use. ``indices.npy``'s blocks are 4 KiB pages; ``features.bin``'s are sized to
  its rows (512 to 4096 bytes, ``features.check_block`` in the manifest; format 1.1 had 4 KiB pages
  there too), so a 1 KiB row costs a 1 KiB hash, not a page's. 8 B per block, held in RAM and
  charged to the memory plan.

A mismatch raises ``CorruptData`` naming the file and the byte offset (the page, or the partition's
range); the session that asked gets a ``data_corrupt`` error, the metric
``megabatch_read_check_failures_total{file}`` counts it, and nothing of the batch is published.
Datasets of format 1.0 carry no read checks: the daemon serves them unchecked and says so once.
"""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from loader.format.checksum_kernels import PAGE_BYTES, block_checksums, check_block_bytes, first_bad_block
from loader.format.dataset import CHECK_FILES, Dataset
from loader.format.fileio import HASH_CHUNK_BYTES, range_xxh3
from loader.format.npyio import NpyReader, read_npy, write_npy
from loader.format.partition_table import PartitionTable
from proto.errors import UserError
from proto.progress import Progress

__all__ = ["CorruptData", "ReadChecks", "load_read_checks", "write_read_checks", "partition_checksum_table",
           "file_block_checksums", "verify_partition_range", "verify_blocks", "block_table", "block_table_bytes",
           "PARTITION_CHECK_COLUMNS", "PAGE_BYTES"]

log = logging.getLogger("megabatch.read_checks")

PARTITION_CHECK_COLUMNS = ("features", "indices", "indptr")
"""Columns of ``partition_checksums.npy``."""

class CorruptData(UserError):
    """Bytes read from a dataset file do not match the checksum ``prepare`` recorded for them."""

    def __init__(self, path: Path | str, offset: int, what: str) -> None:
        super().__init__(f"{path}: {what} at byte {offset} fails its checksum (the file changed or the disk "
                         f"returned corrupt data); nothing of this batch was served; run 'megabatch verify' "
                         f"on the dataset and prepare it again")
        self.path = Path(path)
        self.offset = offset


@dataclass(frozen=True)
class ReadChecks:
    """The checksums one daemon verifies against; block tables are loaded only for the row-granular modes."""

    partition_sums: np.ndarray
    """uint64 (P, 3): columns ``PARTITION_CHECK_COLUMNS``."""
    feature_blocks: np.ndarray
    """uint64, one per ``feature_block`` bytes of features.bin (empty when not loaded)."""
    feature_block: int
    """Bytes per checksum of ``feature_blocks`` (512 to 4096)."""
    index_pages: np.ndarray
    """uint64, one per page of indices.npy (empty when not loaded)."""


def block_table_bytes(dataset: Dataset) -> int:
    """RAM the block checksums take once loaded (0 for a dataset without read checks)."""
    m = dataset.manifest
    if not m.has_read_checks:
        return 0
    return (8 * -(-m.files["features.bin"].bytes // m.feature_check_bytes)
            + 8 * -(-m.files["indices.npy"].bytes // PAGE_BYTES))


def load_read_checks(dataset: Dataset, *, blocks: bool) -> ReadChecks | None:
    """The dataset's read checks, or None (with a warning) for a format 1.0 dataset, which has none."""
    m = dataset.manifest
    if not m.has_read_checks:
        log.warning("%s: dataset format %s has no read checks: reads are not verified (prepare it again with "
                    "this megabatch for format 1.2); 'megabatch verify' still checks the files", dataset.path,
                    m.version)
        return None
    sums = read_npy(dataset.path / CHECK_FILES["partition_checksums"], expect_dtype=np.uint64, expect_ndim=2)
    if sums.shape != (m.num_partitions, len(PARTITION_CHECK_COLUMNS)):
        raise UserError(f"{dataset.path / CHECK_FILES['partition_checksums']}: shape {sums.shape}, expected "
                        f"({m.num_partitions}, {len(PARTITION_CHECK_COLUMNS)}); run 'megabatch verify'")
    empty = np.empty(0, dtype=np.uint64)
    feature_blocks = index_pages = empty
    if blocks:
        feature_blocks = block_table(dataset, m.feature_check_file, "features.bin", m.feature_check_bytes)
        index_pages = block_table(dataset, CHECK_FILES["index_pages"], "indices.npy", PAGE_BYTES)
    return ReadChecks(sums, feature_blocks, m.feature_check_bytes, index_pages)


def block_table(dataset: Dataset, name: str, data_file: str, block: int) -> np.ndarray:
    """The block checksums ``name`` holds for ``data_file`` (one XXH3-64 per ``block`` bytes), their count checked
    against the file's size in the manifest."""
    path = dataset.path / name
    table = read_npy(path, expect_dtype=np.uint64, expect_ndim=1)
    expected = -(-dataset.manifest.files[data_file].bytes // block)
    if len(table) != expected:
        raise UserError(f"{path}: {len(table)} block checksums, {data_file} has {expected} blocks of {block} bytes; "
                        f"run 'megabatch verify'")
    return table


def verify_partition_range(checks: ReadChecks, partition: int, column: int, data: memoryview,
                           path: Path, file_offset: int) -> None:
    """Raise ``CorruptData`` unless ``data`` (partition ``partition``'s bytes of one file) hashes to its sum."""
    if xxhash.xxh3_64_intdigest(data) != int(checks.partition_sums[partition, column]):
        raise CorruptData(path, file_offset, f"partition {partition}'s {PARTITION_CHECK_COLUMNS[column]} range "
                                             f"({len(data)} bytes from byte {file_offset})")


def verify_blocks(sums: np.ndarray, block: int, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  file_offsets: np.ndarray, path: Path) -> None:
    """Raise ``CorruptData`` naming the first block of the ranges in ``data`` that fails its checksum.

    Range r is the file's bytes ``file_offsets[r]`` (block aligned) to ``+ lengths[r]`` (whole blocks, or
    up to the end of the file) at ``data[starts[r]:]``.
    """
    at = first_bad_block(data, starts, lengths, file_offsets, sums, block)
    if at >= 0:
        raise CorruptData(path, int(at), f"the {block}-byte block")


def file_block_checksums(path: Path, block: int = PAGE_BYTES, progress: Progress | None = None) -> np.ndarray:
    """One checksum per ``block`` bytes of ``path`` (the last block zero-padded), read in bounded chunks."""
    size = path.stat().st_size
    sums = np.empty(-(-size // block), dtype=np.uint64)
    buffer = np.empty(HASH_CHUNK_BYTES, dtype=np.uint8)
    view = buffer.data
    with open(path, "rb", buffering=0) as handle:
        for first in range(0, size, HASH_CHUNK_BYTES):
            got = handle.readinto(view[:min(HASH_CHUNK_BYTES, size - first)])
            if got is None or got < min(HASH_CHUNK_BYTES, size - first):
                raise UserError(f"{path}: changed while being checksummed")
            block_checksums(buffer[:got], sums[first // block:(first + got + block - 1) // block], block)
            if progress is not None:
                progress.update(got)
    return sums


def partition_checksum_table(directory: Path, partitions: PartitionTable, files: dict[str, str]) -> np.ndarray:
    """uint64 (P, 3): each partition's range of features.bin, indices.npy and indptr.npy, hashed."""
    with NpyReader(directory / files["indices"]) as idx, NpyReader(directory / files["indptr"]) as ptr:
        indices_at, itemsize, indptr_at = idx.data_offset, idx.dtype.itemsize, ptr.data_offset
    table = np.empty((len(partitions), len(PARTITION_CHECK_COLUMNS)), dtype=np.uint64)
    buffer = np.empty(HASH_CHUNK_BYTES, dtype=np.uint8)
    paths = [directory / files[name] for name in ("features", "indices", "indptr")]
    fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in paths]
    try:
        for p, part in enumerate(partitions.rows()):
            ranges = ((part.feat_offset, part.feat_padded),
                      (indices_at + part.edge_begin * itemsize, (part.edge_end - part.edge_begin) * itemsize),
                      (indptr_at + part.node_begin * 8, (part.node_end - part.node_begin + 1) * 8))
            for column, ((offset, length), fd, path) in enumerate(zip(ranges, fds, paths)):
                table[p, column] = range_xxh3(fd, offset, length, buffer.data, path)
    finally:
        for fd in fds:
            os.close(fd)
    return table


def write_read_checks(directory: Path, partitions: PartitionTable, files: dict[str, str], *, row_bytes: int,
                      progress: bool) -> int:
    """Write the three read-check files of format 1.2 into ``directory`` (prepare's temporary output);
    return the feature block (``features.check_block``), sized to ``row_bytes``."""
    write_npy(directory / CHECK_FILES["partition_checksums"], partition_checksum_table(directory, partitions, files))
    feature_block = check_block_bytes(row_bytes)
    for name, data_file, block in (("feature_blocks", files["features"], feature_block),
                                   ("index_pages", files["indices"], PAGE_BYTES)):
        path = directory / data_file
        with Progress(f"block checksums {data_file}", path.stat().st_size, "B", enabled=progress) as bar:
            write_npy(directory / CHECK_FILES[name], file_block_checksums(path, block, bar))
    return feature_block
