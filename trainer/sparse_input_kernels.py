"""The numba kernels of trainer/sparse_input.py: a dense matrix's non-zeros as CSR, and a CSR's transpose."""

import numpy as np

from proto.jit import kernel

__all__ = ["csr_of_dense", "transpose_csr"]


@kernel
def csr_of_dense(x: np.ndarray, max_nnz: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(indptr, indices, values, True) of the non-zero entries of the 2-D ``x``, row by row; (..., False) as soon
    as there are more than ``max_nnz`` of them, or when the first eighth of the rows holds more than a
    quarter of them (a matrix just too dense would otherwise cost a nearly whole scan before the dense path)."""
    n, f = x.shape
    indptr = np.zeros(n + 1, np.int64)
    indices = np.empty(max_nnz, np.int64)
    values = np.empty(max_nnz, x.dtype)
    k = 0
    probe = n // 8
    for i in range(n):
        if i == probe and probe >= 8 and 4 * k > max_nnz:
            return indptr, indices[:0].copy(), values[:0].copy(), False
        for j in range(f):
            v = x[i, j]
            if v != 0:
                if k == max_nnz:
                    return indptr, indices[:0].copy(), values[:0].copy(), False
                indices[k] = j
                values[k] = v
                k += 1
        indptr[i + 1] = k
    return indptr, indices[:k].copy(), values[:k].copy(), True


@kernel
def transpose_csr(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray,
                   num_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR of the transpose: a counting sort of the entries by column, rows ascending within a column."""
    counts = np.zeros(num_cols + 1, np.int64)
    for k in range(indices.size):
        counts[indices[k] + 1] += 1
    t_indptr = np.cumsum(counts)
    fill = t_indptr[:-1].copy()
    t_indices = np.empty(indices.size, np.int64)
    t_values = np.empty(values.size, values.dtype)
    for i in range(indptr.size - 1):
        for k in range(indptr[i], indptr[i + 1]):
            at = fill[indices[k]]
            t_indices[at] = i
            t_values[at] = values[k]
            fill[indices[k]] = at + 1
    return t_indptr, t_indices, t_values
