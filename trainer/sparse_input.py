"""Sparse input rows for layer 0 on the CPU: bag-of-words features cross the slot dense, mostly zeros.

coauthor-cs's 6,805 feature columns are 0.9% non-zero (coauthor-physics' 8,415 are 0.4%, Cora's and citeseer's
about 1%), and a dense layer 0 spends nearly all of a training step multiplying those zeros: on a coauthor-cs link
batch of 256 pairs (9,628 nodes, 4,404 of them layer 0's targets) its two 6,805 x 128 products and their weight
gradients took 0.4 of the step's 0.42 s. ``sparse_rows`` finds a batch's non-zeros in one pass (the 262 MB of
rows read once, about 0.05 s), and ``rows_times_weight`` multiplies them by a weight matrix as CSR, its backward
by the transposed CSR: work proportional to the non-zeros, not to the columns.

Only where it pays: on the CPU (a GPU's dense product is fast, and its rows are on the device already), for
rows that need no gradient (input features), and where ``max_sparse_entries`` says the batch's shape and
non-zeros make the sparse product the cheaper one; a batch denser than that is left to the dense path after a
scan of at most that many non-zeros.
"""

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.sparse_input_kernels import csr_of_dense, transpose_csr

__all__ = ["SparseRows", "csr_tensor", "gives_up_early", "max_sparse_entries", "rows_times_weight", "sparse_rows"]

NNZ_COST = 15.0
ROW_COST = 221.0
BREAK_EVEN = 1.2
"""The rule that picks the sparse product, fitted to layer 0's forward and backward on this machine's CPU
(docs/PERFORMANCE.md, "Sparse input rows"): against the dense path's T x F (targets times input width), the sparse
path costs about ``NNZ_COST`` per non-zero input entry and ``ROW_COST`` per source row (its output rows, written
and read back in 128-wide floats); it is taken where that is under ``BREAK_EVEN`` times the dense cost. Of 28
fitted cases it took 10, one of them 3% slower, and left out 5 that were up to 1.25x faster."""


def max_sparse_entries(num_sources: int, num_targets: int, width: int) -> int:
    """The most non-zero input entries for which the sparse product beats the dense one on a layer of
    ``num_sources`` input rows of ``width`` columns and ``num_targets`` output rows (0: it never does)."""
    return max(0, int((BREAK_EVEN * num_targets * width - ROW_COST * num_sources) / NNZ_COST))


def csr_tensor(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is not
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                       torch.from_numpy(values), shape)


@dataclass
class SparseRows:
    """The non-zero entries of a dense (rows x cols) matrix, in CSR arrays; its transpose is built on first use
    (a backward pass needs it, evaluation does not)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    shape: tuple[int, int]
    _transposed: Tensor | None = field(default=None, repr=False)

    def first(self, count: int) -> "SparseRows":
        """The first ``count`` rows."""
        end = int(self.indptr[count])
        return SparseRows(self.indptr[:count + 1], self.indices[:end], self.values[:end], (count, self.shape[1]))

    def transposed_csr(self) -> Tensor:
        if self._transposed is None:
            rows, cols = self.shape
            self._transposed = csr_tensor(*transpose_csr(self.indptr, self.indices, self.values, cols), (cols, rows))
        return self._transposed


def gives_up_early(indptr: np.ndarray, max_nnz: int) -> bool:
    """Whether ``csr_of_dense(x, max_nnz, probe=True)`` gives up on the matrix whose CSR row pointers are
    ``indptr``: past ``max_nnz`` entries, or a first eighth of the rows holding over a quarter of them."""
    first_eighth = (indptr.size - 1) // 8
    return bool(indptr[-1] > max_nnz or (first_eighth >= 8 and 4 * indptr[first_eighth] > max_nnz))


def sparse_rows(x: Tensor, max_entries: int) -> SparseRows | None:
    """``x``'s non-zeros where there are at most ``max_entries`` of them and the sparse product applies: ``x`` a
    float32 2-D CPU tensor needing no gradient; None otherwise (the caller multiplies densely). ``x`` may be
    dense or a sparse CSR tensor (trainer/sparse_features.py's rows), which is taken or left by the same rule:
    a batch trains the same either way."""
    if (max_entries <= 0 or x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.requires_grad
            or x.numel() == 0):
        return None
    shape = (int(x.shape[0]), int(x.shape[1]))
    if x.layout == torch.sparse_csr:
        held = SparseRows(x.crow_indices().numpy(), x.col_indices().numpy(), x.values().numpy(), shape)
        return None if gives_up_early(held.indptr, min(max_entries, x.numel())) else held
    indptr, indices, values, fits = csr_of_dense(x.detach().contiguous().numpy(), min(max_entries, x.numel()), True)
    if not fits:
        return None
    return SparseRows(indptr, indices, values, shape)


class _RowsTimesWeight(torch.autograd.Function):
    """``rows @ weight.T`` with the gradient of ``weight`` only (the rows are input features)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, weight: Tensor, rows: SparseRows) -> Tensor:
        ctx.rows = rows  # type: ignore[attr-defined]
        # a weighted bag of weight columns per row: writes each output row once, where torch's CSR product
        # measured up to 3x slower on many short rows
        return F.embedding_bag(torch.from_numpy(rows.indices), weight.t().contiguous(),
                               torch.from_numpy(rows.indptr[:-1]), mode="sum",
                               per_sample_weights=torch.from_numpy(rows.values))

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        rows: SparseRows = ctx.rows  # type: ignore[attr-defined]
        return torch.sparse.mm(rows.transposed_csr(), grad.contiguous()).t(), None


def rows_times_weight(rows: SparseRows, weight: Tensor) -> Tensor:
    """``x @ weight.T`` for the dense ``x`` that ``rows`` holds, (rows x out) from ``weight`` (out x cols)."""
    if weight.shape[1] != rows.shape[1]:
        raise ValueError(f"weight has {weight.shape[1]} columns, the rows {rows.shape[1]}")
    out: Tensor = _RowsTimesWeight.apply(weight, rows)
    return out
