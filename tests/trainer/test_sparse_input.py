"""Sparse input rows: the CSR kernels against numpy, the product and its gradient against the dense ones, and
when the dense path is kept."""

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trainer.models import build_model
from trainer.sparse_input import gives_up_early, max_sparse_entries, rows_times_weight, sparse_rows
from trainer.sparse_input_kernels import csr_of_dense, transpose_csr


def _matrices(min_side: int = 0) -> st.SearchStrategy[np.ndarray]:
    shapes = hnp.array_shapes(min_dims=2, max_dims=2, min_side=min_side, max_side=12)
    return hnp.arrays(np.float32, shapes, elements=st.sampled_from([0.0, 0.0, 0.0, -0.0, 1.0, -2.5, 3.0]))


_MATRICES = _matrices()


def _reference_csr(x):
    rows, cols = np.nonzero(x)  # row-major: by row, then column
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=x.shape[0]))])
    return indptr, cols, x[rows, cols]


@settings(max_examples=200, deadline=None)
@given(x=_MATRICES)
def test_csr_of_dense_and_its_transpose_match_numpy(x):
    indptr, indices, values, fits = csr_of_dense(x, x.size, True)
    assert fits
    for mine, reference in zip((indptr, indices, values), _reference_csr(x), strict=True):
        np.testing.assert_array_equal(mine, reference)
    transposed = transpose_csr(indptr, indices, values, x.shape[1])
    for mine, reference in zip(transposed, _reference_csr(np.ascontiguousarray(x.T)), strict=True):
        np.testing.assert_array_equal(mine, reference)


@settings(max_examples=200, deadline=None)
@given(x=_matrices(), rows=st.integers(0, 80), limit=st.integers(0, 40))
def test_csr_of_dense_gives_up_past_its_limit(x, rows, limit):
    x = np.resize(x, (rows, x.shape[1])) if x.size else x  # up to 80 rows: past the first eighth's probe
    *_, fits = csr_of_dense(x, limit, True)
    count = np.count_nonzero(x)
    probe = x.shape[0] // 8
    # gives up past the limit, or early where the first eighth of the rows holds over a quarter of it
    assert fits == (count <= limit and (probe < 8 or 4 * np.count_nonzero(x[:probe]) <= limit))
    # and gives_up_early says so from the CSR (the rule a batch held sparse is taken or left by)
    assert gives_up_early(_reference_csr(x)[0], limit) == (not fits)
    assert csr_of_dense(x, count, False)[3]  # without the probe, exactly the count fits, however it is spread


@settings(max_examples=100, deadline=None)
@given(x=_matrices(min_side=1), out=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_rows_times_weight_and_its_gradient_equal_the_dense_product(x, out, seed):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, x.shape[1], generator=gen, requires_grad=True)
    dense = torch.from_numpy(x)
    rows = sparse_rows(dense, dense.numel())
    assert rows is not None
    got, want = rows_times_weight(rows, weight), dense @ weight.t()
    torch.testing.assert_close(got, want)
    upstream = torch.randn(x.shape[0], out, generator=gen)
    (mine,) = torch.autograd.grad(got, weight, upstream)
    (reference,) = torch.autograd.grad(want, weight, upstream)
    torch.testing.assert_close(mine, reference)


def test_sparse_rows_keeps_the_dense_path_where_the_product_would_not_pay():
    x = torch.zeros(10, 10)
    x[0, :5] = 1.0
    assert sparse_rows(x, 5) is not None
    assert sparse_rows(x, 4) is None  # 5 non-zero entries
    assert sparse_rows(torch.zeros(10, 10), 0) is None  # a budget of none: no scan at all
    assert sparse_rows(x.double(), 100) is None  # the product is float32's
    assert sparse_rows(torch.zeros(0, 10), 100) is None
    assert sparse_rows(x.clone().requires_grad_(), 100) is None  # input rows need no gradient
    with pytest.raises(ValueError, match="columns"):
        rows_times_weight(sparse_rows(x, 100), torch.zeros(3, 9))


def test_the_rule_takes_the_sparse_product_on_wide_sparse_rows_only():
    # coauthor-cs's link batch (9,628 rows of 6,805 columns, 4,404 targets, 0.9% non-zero) takes it
    budget = max_sparse_entries(9_628, 4_404, 6_805)
    assert budget > 0.009 * 9_628 * 6_805
    # bench/compare's batch (256 columns, five sources a target) does not, however sparse
    assert max_sparse_entries(55_000, 11_000, 256) == 0
    # nor does a layer without targets
    assert max_sparse_entries(100, 0, 6_805) == 0


@pytest.mark.parametrize("dense", [False, True])
def test_dense_inputs_forces_the_dense_path(dense):
    model = build_model("sage", 2000, 8, 4, 2, 0.0)
    model.dense_inputs = dense
    edge_index = torch.tensor([[1, 2, 3], [0, 0, 1]])
    x = torch.zeros(4, 2000)
    x[1, 3] = 1.0
    with mock.patch.object(model, "sparse_input_layer", wraps=model.sparse_input_layer) as sparse_path:
        model.layer(0, x, edge_index, 2)
    assert sparse_path.called != dense
