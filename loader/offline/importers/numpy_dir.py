"""Import a directory of ``.npy`` files in the PyG convention.

Files: ``edge_index.npy`` (int, shape (2, E): row 0 sources, row 1 targets),
``features.npy`` (N, D) numbers, ``labels.npy`` (N,) int (-1 unlabeled; one-hot (N, C) is
converted), and optionally a split as ``{train,val,test}_idx.npy`` node ids or
``{train,val,test}_mask.npy`` boolean node masks.

Edges and features are read in row/column ranges with explicit reads, so memory stays at
one chunk whatever the file size.
"""

import contextlib
import os
from collections.abc import Generator
from pathlib import Path

import numpy as np

from loader.format.fileio import pread_into
from loader.format.npyio import NpyReader, read_npy, rows_per_chunk
from loader.format.raw import SPLIT_NAMES
from loader.offline.importers.common import ImportReadRequest, ImportSource, normalize_labels, split_from_mask
from proto.errors import UserError

__all__ = ["read_numpy_dir"]

# both rows as read, cast to int64, plus the range check's temporaries
_BYTES_PER_EDGE = 48


def _read_split(root: Path, num_nodes: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray],
                                                     tuple[str, str, str]] | None:
    found: dict[str, Path] = {}
    for name in SPLIT_NAMES:
        idx, mask = root / f"{name}_idx.npy", root / f"{name}_mask.npy"
        if idx.exists() and mask.exists():
            raise UserError(f"{root}: both {idx.name} and {mask.name}; keep one")
        if idx.exists() or mask.exists():
            found[name] = idx if idx.exists() else mask
    if not found:
        return None
    if len(found) != len(SPLIT_NAMES):
        missing = [name for name in SPLIT_NAMES if name not in found]
        raise UserError(f"{root}: has {', '.join(p.name for p in found.values())} but no split file for "
                        f"{', '.join(missing)}; a split needs train, val and test")
    parts = []
    for path in found.values():
        if path.name.endswith("_mask.npy"):
            parts.append(split_from_mask(read_npy(path), str(path), num_nodes))
        else:
            parts.append(read_npy(path, expect_ndim=1))
    origins = tuple(str(path) for path in found.values())
    return (parts[0], parts[1], parts[2]), (origins[0], origins[1], origins[2])


def read_numpy_dir(req: ImportReadRequest, stack: contextlib.ExitStack) -> ImportSource:
    """Open a directory of ``.npy`` files as an ``ImportSource``."""
    del stack  # each stream opens and closes its own files
    root = req.src
    if not root.is_dir():
        raise UserError(f"{root}: not a directory (expected edge_index.npy, features.npy, labels.npy)")
    edge_path, feat_path, label_path = root / "edge_index.npy", root / "features.npy", root / "labels.npy"

    with NpyReader(edge_path, expect_ndim=2) as reader:
        if reader.shape[0] != 2:
            hint = "; save edge_index.T" if reader.shape[1] == 2 else ""
            raise UserError(f"{edge_path}: shape {reader.shape}, expected (2, E){hint}")
        if reader.dtype.kind not in "iu":
            raise UserError(f"{edge_path}: dtype {reader.dtype}, expected integer node ids")
        num_edges, edge_dtype, edge_offset = reader.shape[1], reader.dtype, reader.data_offset
    with NpyReader(feat_path, expect_ndim=2) as reader:
        if reader.dtype.kind not in "biuf":
            raise UserError(f"{feat_path}: dtype {reader.dtype}, expected floats")
        n, dim = reader.shape
        feat_rows = rows_per_chunk(dim * (2 * reader.dtype.itemsize + 8), req.memory_budget)
    if n == 0 or dim == 0:
        raise UserError(f"{feat_path}: shape {(n, dim)}; need at least one node and one feature")
    labels = normalize_labels(read_npy(label_path), str(label_path))
    if len(labels) != n:
        raise UserError(f"{label_path}: {len(labels)} labels, but {feat_path.name} has {n} rows")
    found = _read_split(root, n) if req.want_split else None
    edge_rows = rows_per_chunk(_BYTES_PER_EDGE, req.memory_budget)

    def edges() -> Generator[tuple[np.ndarray, np.ndarray], None, None]:
        # row-major (2, E): the sources and the targets are two contiguous runs
        with NpyReader(edge_path, expect_ndim=2):
            fd = os.open(edge_path, os.O_RDONLY)
            try:
                for start in range(0, num_edges, edge_rows):
                    count = min(edge_rows, num_edges - start)
                    pair = np.empty((2, count), dtype=edge_dtype)
                    for row in range(2):
                        offset = edge_offset + (row * num_edges + start) * edge_dtype.itemsize
                        pread_into(fd, pair[row], offset, edge_path)
                    yield pair[0].astype(np.int64), pair[1].astype(np.int64)
            finally:
                os.close(fd)

    def features() -> Generator[np.ndarray, None, None]:
        with NpyReader(feat_path, expect_ndim=2) as reader:
            for _start, rows in reader.chunks(feat_rows):
                yield rows

    return ImportSource(num_nodes=n, feat_dim=dim, labels=labels,
                        split=found[0] if found is not None else None,
                        split_origins=found[1] if found is not None else ("train", "val", "test"),
                        edges=edges, edge_origin=str(edge_path), num_edges=num_edges,
                        features=features, feature_origin=str(feat_path))
