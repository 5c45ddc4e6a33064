"""link_kernels.has_edges against a plain set lookup."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.offline.link_kernels import has_edges


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 30), e=st.integers(0, 120), q=st.integers(0, 60), seed=st.integers(0, 2**31),
       dtype=st.sampled_from([np.int32, np.int64]))
def test_has_edges_matches_a_set(n, e, q, seed, dtype):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    order = np.lexsort((src, dst))  # the CSC: by target, each list sorted by source (repeats allowed)
    indices = src[order].astype(dtype)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    qs, qd = rng.integers(0, n, q), rng.integers(0, n, q)
    if e:  # some queries that are edges
        pick = rng.integers(0, e, q // 2)
        qs[:len(pick)], qd[:len(pick)] = src[pick], dst[pick]
    out = np.zeros(q, dtype=np.bool_)
    has_edges(indptr, indices, qs, qd, out)
    edges = set(zip(src.tolist(), dst.tolist()))
    assert out.tolist() == [(s, d) in edges for s, d in zip(qs.tolist(), qd.tolist())]
