"""Read a file in ``features.bin``'s layout: the dense (N, D) matrix whole, or partition by partition, one
sequential read per partition either way.

``features.bin`` and the aggregation cache's ``aggregates-KIND.bin`` share the layout (docs/FORMAT.md): partition
p's rows are nodes ``node_begin[p]..node_end[p]`` at byte ``feat_offset[p]``, padded to ``feat_padded[p]`` bytes.
The in-memory reference reads the former, in-memory training with ``--aggregation-cache`` the latter; both check
what they read in the same pass, each against its own sums (``RangeCheck``), so a file is read once.
"""

import os
from collections.abc import Callable, Generator
from pathlib import Path

import numpy as np

from loader.format.dataset import Dataset
from loader.format.fileio import pread_into
from loader.format.partition_table import PartitionTable
from proto.errors import UserError

__all__ = ["RangeCheck", "read_feature_layout", "feature_ranges"]

RangeCheck = Callable[[int, memoryview, bytes, int], None]
"""Called per partition, in file order, with (partition, its rows' bytes, the padding after them as read, the
rows' byte offset in the file); raises ``CorruptData`` (or ``UserError``) for bytes that fail their sums."""


def read_feature_layout(dataset: Dataset, path: Path, partitions: PartitionTable,
                        check: RangeCheck | None = None) -> np.ndarray:
    """``path``'s rows in node order, (N, D) in the feature dtype; each partition's range (rows and padding) is shown
    to ``check`` once read. One-line ``UserError`` for a missing or truncated file or a partition table that
    contradicts the manifest."""
    m = dataset.manifest
    rows = np.empty((m.num_nodes, m.feat_dim), dtype=m.feat_dtype.value)
    # one sequential read per partition, straight into its rows: no second copy of the matrix
    for _ in _read_ranges(dataset, path, partitions, check, lambda begin, end: rows[begin:end]):
        pass
    return rows


def feature_ranges(dataset: Dataset, path: Path, partitions: PartitionTable,
                   check: RangeCheck | None = None) -> Generator[tuple[int, np.ndarray], None, None]:
    """``path``'s rows one partition at a time, in file order, as (its first node, its rows (n_p, D)), each checked
    as ``read_feature_layout`` checks it: a caller that keeps less than the dense matrix (its non-zeros) never holds
    more than one partition's rows. Each partition's rows are a fresh array."""
    dim, dtype = dataset.manifest.feat_dim, dataset.manifest.feat_dtype.value
    yield from _read_ranges(dataset, path, partitions, check, lambda begin, end: np.empty((end - begin, dim), dtype))


def _read_ranges(dataset: Dataset, path: Path, partitions: PartitionTable, check: RangeCheck | None,
                 into: Callable[[int, int], np.ndarray]) -> Generator[tuple[int, np.ndarray], None, None]:
    """Read each partition's rows into ``into(node_begin, node_end)`` and yield (node_begin, those rows)."""
    m = dataset.manifest
    n = m.num_nodes
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    try:
        size = os.fstat(fd).st_size
        # the partitions in table order are in file order (prepare lays them out so): a checksum may span them
        for p, part in enumerate(partitions.rows()):
            begin, end, offset, nbytes = part.node_begin, part.node_end, part.feat_offset, part.feat_nbytes
            if not 0 <= begin <= end <= n or nbytes != (end - begin) * m.row_bytes or part.feat_padded < nbytes:
                raise UserError(f"{dataset.path / 'partitions.npy'}: partition {p} (nodes {begin}..{end}, "
                                f"{nbytes} feature bytes) does not match the manifest")
            if offset + nbytes > size:
                raise UserError(f"{path}: truncated (partition {p} needs bytes up to {offset + nbytes}, "
                                f"file has {size})")
            rows = into(begin, end)
            pread_into(fd, rows, offset, path)
            if check is not None:
                pad = part.feat_padded - nbytes
                tail = os.pread(fd, pad, offset + nbytes) if pad else b""
                if len(tail) != pad:
                    raise UserError(f"{path}: truncated (partition {p}'s padding needs bytes up to "
                                    f"{offset + part.feat_padded})")
                check(p, rows.data.cast("B"), tail, offset)
            yield begin, rows
    finally:
        os.close(fd)
