"""8-bit feature codes: a decoded value is within half a step of the value encoded (property test against a
plain per-value reference), a two-valued 0/1 column decodes exactly, and the column ranges fold chunk by chunk."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from loader.format.feature_codec import LEVELS, ColumnRange, FeatureCodec
from proto.errors import UserError

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


def plain_codes(rows: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The codes one value at a time: round((x - low) / (high - low) * 255), 0 for a constant column."""
    out = np.zeros(rows.shape, dtype=np.uint8)
    for i in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            span = float(high[j]) - float(low[j])
            if span > 0:
                out[i, j] = min(LEVELS, max(0, round((float(rows[i, j]) - float(low[j])) / span * LEVELS)))
    return out


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 20), st.integers(1, 8)), elements=finite))
def test_codes_and_values_against_a_plain_reference(rows):
    span = ColumnRange(rows.shape[1])
    span.add(rows, 0)
    codec = span.codec()
    np.testing.assert_array_equal(codec.low, rows.min(axis=0))
    np.testing.assert_array_equal(codec.high, rows.max(axis=0))
    codes = codec.encode(rows)
    assert codes.dtype == np.uint8
    # float32 arithmetic may round a value sitting on a half step the other way: at most one code apart
    assert np.abs(codes.astype(int) - plain_codes(rows, codec.low, codec.high).astype(int)).max() <= 1
    values = codec.decode(codes)
    assert values.dtype == np.float32
    step = (codec.high.astype(np.float64) - codec.low) / LEVELS
    tolerance = 1.5 * step + 1e-6 * np.maximum(1.0, np.abs(rows).max(axis=0))
    assert (np.abs(values.astype(np.float64) - rows) <= tolerance).all()
    assert (values >= codec.low - 1e-6 * np.abs(codec.low) - 1e-30).all()


def test_zero_one_columns_and_constant_columns_decode_exactly():
    rng = np.random.default_rng(0)
    rows = (rng.random((500, 12)) < 0.1).astype(np.float32)
    rows[:, 3] = 0.0  # a column with no 1 at all: constant
    rows[:, 4] = 2.5  # constant, not zero
    span = ColumnRange(12)
    span.add(rows, 0)
    codec = span.codec()
    np.testing.assert_array_equal(codec.decode(codec.encode(rows)), rows)
    out = np.full(rows.shape, np.nan, dtype=np.float32)
    assert codec.decode(codec.encode(rows), out=out) is out and np.array_equal(out, rows)


def test_ranges_fold_over_chunks_and_refuse_a_non_finite_value():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(300, 5)).astype(np.float32)
    span = ColumnRange(5)
    for start in range(0, 300, 64):
        span.add(rows[start:start + 64], start)
    np.testing.assert_array_equal(span.codec().table(), np.stack([rows.min(axis=0), rows.max(axis=0)]))
    rows[130, 2] = np.nan
    bad = ColumnRange(5)
    bad.add(rows[:128], 0)
    with pytest.raises(UserError, match="row 130 holds a NaN"):
        bad.add(rows[128:], 128)


def test_a_malformed_range_is_refused():
    with pytest.raises(ValueError, match="finite low <= high"):
        FeatureCodec(np.array([1.0], np.float32), np.array([0.0], np.float32))
    with pytest.raises(ValueError, match="expected \\(2, D\\)"):
        FeatureCodec.from_table(np.zeros((3, 4), np.float32))


def test_a_column_wider_than_float32_is_refused():
    span = ColumnRange(2)
    span.add(np.array([[-3e38, 0.0], [3e38, 1.0]], dtype=np.float32), 0)
    with pytest.raises(UserError, match="feature column 0 spans more than float32 holds"):
        span.codec()


@settings(max_examples=40, deadline=None)
@given(arrays(np.uint8, st.tuples(st.integers(0, 30), st.integers(1, 9))), st.integers(0, 2**32 - 1))
def test_the_decode_kernel_is_the_numpy_expression_bitwise(codes, seed):
    rng = np.random.default_rng(seed)
    low = rng.normal(size=codes.shape[1]).astype(np.float32)
    high = low + rng.random(codes.shape[1]).astype(np.float32) * 10
    codec = FeatureCodec(low, high)
    plain = np.divide(codes, np.float32(LEVELS), dtype=np.float32) * (high - low) + low
    assert codec.decode(codes).tobytes() == plain.astype(np.float32).tobytes()
