"""loader.sampling.negative_weights: each negative's weight against a plain per-pair reference, the weights' mean
over the buffer's draws, and the refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.sampling.negative_weights import buffer_negative_weights


def reference(parts, positives, sizes, n, resident):
    """One pair at a time, from the module docstring's formulas."""
    weights = []
    for m in range(parts.shape[1]):
        if m < positives:
            weights.append(1.0)
            continue
        source, tail = int(parts[0, m]), int(parts[1, m])
        target = int(parts[1, (m - positives) % positives])
        near = {source, target}
        near_nodes = sum(int(sizes[q]) for q in near)
        if tail in near:
            weights.append(resident / n)
        else:
            weights.append((1 - near_nodes / n) / (1 - near_nodes / resident))
    return np.array(weights, dtype=np.float32)


@st.composite
def batches(draw):
    p = draw(st.integers(2, 6))
    sizes = np.array(draw(st.lists(st.integers(1, 20), min_size=p, max_size=p)), dtype=np.int64)
    resident_parts = draw(st.lists(st.integers(0, p - 1), min_size=2, max_size=p, unique=True))
    b = draw(st.integers(1, 5))
    k = draw(st.integers(0, 3))
    pick = st.sampled_from(resident_parts)
    positives = np.array([[draw(pick) for _ in range(b)] for _ in range(2)], dtype=np.int64)
    negatives = np.array([np.tile(positives[0], k), [draw(pick) for _ in range(b * k)]], dtype=np.int64)
    negatives = negatives.reshape(2, b * k)
    resident = int(sizes[resident_parts].sum())
    return np.concatenate([positives, negatives], axis=1), b, sizes, int(sizes.sum()), resident


@settings(max_examples=200, deadline=None)
@given(batches())
def test_weights_equal_the_per_pair_reference(batch):
    parts, positives, sizes, n, resident = batch
    got = buffer_negative_weights(parts, positives, sizes, n, resident)
    assert got.dtype == np.float32 and got.shape == (parts.shape[1],)
    np.testing.assert_allclose(got, reference(parts, positives, sizes, n, resident), rtol=1e-6)


def test_the_mean_weight_over_the_buffers_draws_is_one():
    # 4 partitions of 10, 20, 30, 40 nodes, 3 resident (0, 1, 2: 60 nodes); a pair of partitions 0 and 1
    sizes = np.array([10, 20, 30, 40])
    resident_parts = [0, 1, 2]
    tails = np.repeat(resident_parts, sizes[resident_parts])  # every resident node drawn once
    parts = np.stack([np.zeros(len(tails) + 1, dtype=np.int64), np.concatenate([[1], tails])])
    weights = buffer_negative_weights(parts, 1, sizes, 100, 60)
    assert weights[0] == 1
    assert weights[1:].mean() == pytest.approx(1.0)
    # the near class (partitions 0 and 1, 30 of the 60 resident nodes) weighs its uniform share, 30 of 100
    near = tails <= 1
    assert weights[1:][near].sum() / len(tails) == pytest.approx(0.3)


def test_a_buffer_of_every_node_weighs_every_pair_one():
    parts = np.array([[0, 1, 0, 1], [1, 0, 0, 1]])
    np.testing.assert_array_equal(buffer_negative_weights(parts, 2, np.array([5, 5]), 10, 10), np.ones(4))


@pytest.mark.parametrize("parts, positives, resident, fragment", [
    (np.zeros((3, 4), dtype=np.int64), 2, 5, "expected (2, pairs)"),
    (np.zeros((2, 5), dtype=np.int64), 2, 5, "positives: 2 does not divide the 5 pairs"),
    (np.zeros((2, 4), dtype=np.int64), 0, 5, "positives: 0"),
    (np.zeros((2, 4), dtype=np.int64), 2, 11, "resident_nodes: 11, expected 1..10"),
])
def test_what_does_not_fit_is_refused(parts, positives, resident, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        buffer_negative_weights(parts, positives, np.array([5, 5]), 10, resident)
