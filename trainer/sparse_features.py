"""Bag-of-words features held in memory as their non-zeros, so that a batch's rows are gathered as CSR.

With sparse input rows (trainer/sparse_input.py) layer 0 costs in proportion to a batch's non-zeros, and what
was left of an in-memory step on coauthor-physics (8,415 columns, 0.4% non-zero) was the dense rows themselves:
a link batch's 14,300 rows are 480 MB gathered from the feature matrix (0.32 s) and then scanned for their
non-zeros. Held as CSR (13 MiB for the whole matrix instead of 1.1 GiB) the same rows are gathered by index in
9 ms, and the step that took 1.3 s on dense rows takes 0.12 s (docs/PERFORMANCE.md, "Features held sparse").

``trainer.inmemory_source.load_held`` reads a dataset's features partition by partition straight into the CSR
(``sparse_feature_ranges``), so the dense matrix is never in memory (coauthor-physics' trainer held 1.1 GiB of it
beside the 13 MiB it used); features too dense to hold so are read again as the dense matrix.

A batch's ``x`` is then a sparse CSR tensor: layer 0 takes it, or leaves it for the dense path, by the rule it
applies to dense rows (``sparse_rows``), so a batch trains bit for bit as it would from dense rows; a model
that cannot take it (GAT, an aggregation cache, a GPU) densifies it first.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from proto.errors import UserError
from trainer.sparse_input import csr_tensor
from trainer.sparse_input_kernels import csr_of_dense, gather_csr_rows

__all__ = ["MAX_DENSITY", "SparseFeatures", "sparse_features", "sparse_feature_ranges"]

MAX_DENSITY = 0.05
"""Features are held sparse where at most this share of their entries is non-zero: the shared bag-of-words
graphs are 0.4-1.3% (their dense rows cost 20x or more the non-zeros' bytes), amazon-photo's 35% stays dense.
Below about 30% the CSR is the smaller; 5% keeps a margin for the index bytes and the densifying a GAT or GPU
batch does."""

SCAN_ROWS = 4096
"""Rows per chunk of the one scan that builds the CSR: the dense copy a chunk makes stays tens of MB."""


@dataclass(frozen=True)
class SparseFeatures:
    """A (rows x cols) float32 feature matrix as CSR arrays (int64 row pointers and column indices)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    shape: tuple[int, int]

    @property
    def density(self) -> float:
        return self.values.size / max(1, self.shape[0] * self.shape[1])

    @property
    def summary(self) -> str:
        """For a source's description."""
        return f"features held sparse: {self.density:.1%} non-zero"

    def rows(self, nodes: np.ndarray) -> Tensor:
        """The rows of ``nodes`` (int64 ids, in order) as a sparse CSR tensor of ``len(nodes)`` rows."""
        indptr, indices, values = gather_csr_rows(self.indptr, self.indices, self.values,
                                                  np.ascontiguousarray(nodes, dtype=np.int64))
        return csr_tensor(indptr, indices, values, (int(nodes.size), self.shape[1]))


def sparse_features(features: np.ndarray, max_density: float = MAX_DENSITY,
                    chunk_rows: int = SCAN_ROWS) -> SparseFeatures | None:
    """``features`` (float32, 2-D) as ``SparseFeatures`` where at most ``max_density`` of its entries are non-zero;
    None otherwise (other dtypes too), found out as soon as the scan passes that share. The scan reads
    ``chunk_rows`` rows at a time."""
    if features.ndim != 2:
        return None
    return sparse_feature_ranges([(0, features)], features.shape, max_density, chunk_rows)


def sparse_feature_ranges(ranges: Iterable[tuple[int, np.ndarray]], shape: tuple[int, int],
                          max_density: float = MAX_DENSITY, chunk_rows: int = SCAN_ROWS) -> SparseFeatures | None:
    """The (rows x cols) matrix whose rows come as ``ranges`` (first row, float32 rows), in any order, covering
    every row once, as ``SparseFeatures``; None where more than ``max_density`` of its entries are non-zero (the
    rest of ``ranges`` is then not read) or a range is not float32. A range is scanned ``chunk_rows`` rows at a
    time. ``UserError`` where the ranges do not tile the rows."""
    rows, cols = shape
    if rows * cols == 0:
        return None
    budget = int(max_density * rows * cols)
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    total = 0
    for begin, block in ranges:
        if block.dtype != np.float32 or block.ndim != 2 or block.shape[1] != cols:
            return None
        for start in range(0, block.shape[0], chunk_rows):
            chunk = np.ascontiguousarray(block[start:start + chunk_rows])
            count = int(np.count_nonzero(chunk))
            if total + count > budget:
                return None
            indptr, indices, values, fits = csr_of_dense(chunk, count, False)
            assert fits  # exactly ``count`` entries, and no early give-up
            parts.append((begin + start, indptr, indices, values))
            total += count
    parts.sort(key=lambda part: part[0])
    pointers, covered = [np.zeros(1, np.int64)], 0
    for begin, indptr, _, _ in parts:
        if begin != covered:
            raise UserError(f"the feature ranges do not tile the {rows} rows: row {min(begin, covered)} is "
                            f"{'missing' if begin > covered else 'read twice'}")
        pointers.append(indptr[1:] + pointers[-1][-1])
        covered += indptr.size - 1
    if covered != rows:
        raise UserError(f"the feature ranges cover {covered} of {rows} rows")
    return SparseFeatures(np.concatenate(pointers), np.concatenate([p[2] for p in parts]),
                          np.concatenate([p[3] for p in parts]), (rows, cols))
