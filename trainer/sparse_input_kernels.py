"""The numba kernels of trainer/sparse_input.py: a dense matrix's non-zeros as CSR, a CSR's transpose, and a
CSR's rows gathered by index (trainer/sparse_features.py)."""

import numpy as np

from proto.jit import kernel

__all__ = ["csr_of_dense", "gather_csr_rows", "transpose_csr"]


@kernel
def csr_of_dense(x: np.ndarray, max_nnz: int, probe: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(indptr, indices, values, True) of the non-zero entries of the 2-D ``x``, row by row; (..., False) as soon
    as there are more than ``max_nnz`` of them, or, with ``probe``, when the first eighth of the rows holds more
    than a quarter of them (a matrix just too dense would otherwise cost a nearly whole scan before the dense
    path; ``gives_up_early`` says the same of a CSR)."""
    n, f = x.shape
    indptr = np.zeros(n + 1, np.int64)
    indices = np.empty(max_nnz, np.int64)
    values = np.empty(max_nnz, x.dtype)
    k = 0
    first_eighth = n // 8 if probe else -1
    for i in range(n):
        if i == first_eighth and first_eighth >= 8 and 4 * k > max_nnz:
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


@kernel
def gather_csr_rows(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR of the rows ``rows`` (in that order, repeats allowed) of the CSR (indptr, indices, values)."""
    out_indptr = np.zeros(rows.size + 1, np.int64)
    for i in range(rows.size):
        r = rows[i]
        out_indptr[i + 1] = out_indptr[i] + indptr[r + 1] - indptr[r]
    out_indices = np.empty(out_indptr[-1], np.int64)
    out_values = np.empty(out_indptr[-1], values.dtype)
    for i in range(rows.size):
        r = rows[i]
        start, at = indptr[r], out_indptr[i]
        for k in range(indptr[r + 1] - start):
            out_indices[at + k] = indices[start + k]
            out_values[at + k] = values[start + k]
    return out_indptr, out_indices, out_values
