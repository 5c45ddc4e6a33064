import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.offline.extsort import SORT_BYTES_PER_EDGE, external_sort_edges


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), e=st.integers(0, 400), chunk=st.integers(1, 97), bucket_edges=st.integers(1, 50),
       dedup=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_sorted_output_equals_numpy_sort(tmp_path_factory, n, e, chunk, bucket_edges, dedup, seed):
    rng = np.random.default_rng(seed)
    primary = rng.integers(0, n, e)
    secondary = rng.integers(0, n, e)

    def source():
        for start in range(0, e, chunk):
            yield primary[start:start + chunk], secondary[start:start + chunk]

    scratch = tmp_path_factory.mktemp("sort")
    buckets = list(external_sort_edges(source, n, scratch, bucket_edges * SORT_BYTES_PER_EDGE, dedup=dedup,
                                       progress=False))
    keys = primary * n + secondary
    expected = np.unique(keys) if dedup else np.sort(keys)
    got = np.concatenate([b.primary * n + b.secondary for b in buckets]) if buckets else np.empty(0, np.int64)
    np.testing.assert_array_equal(got, expected)
    for bucket in buckets:
        if bucket.primary.size:
            assert bucket.primary_begin <= bucket.primary.min() and bucket.primary.max() < bucket.primary_end
    assert [b.primary_begin for b in buckets][:1] == [0] and buckets[-1].primary_end == n
    assert list(scratch.iterdir()) == []
