"""trainer.link.ranking against plain reference implementations: ranks with ties, MRR, Hits@k, ROC AUC."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trainer.link.ranking as ranking
from trainer.link.ranking import (
    HITS_AT,
    LINK_METRICS,
    hits_at,
    link_roc_auc,
    link_scores,
    mean_reciprocal_rank,
    positive_ranks,
)

# --- reference implementations: the definitions, candidate by candidate and pair by pair ---


def ref_rank(pos: float, negs: list[float]) -> float:
    """The mean of the optimistic rank (ties below the positive) and the pessimistic one (ties above)."""
    optimistic = 1 + sum(1 for n in negs if n > pos)
    pessimistic = 1 + sum(1 for n in negs if n >= pos)
    return (optimistic + pessimistic) / 2


def ref_mrr(pos: list[float], neg: list[list[float]]) -> float:
    if not pos:
        return math.nan
    return sum(1 / ref_rank(p, n) for p, n in zip(pos, neg, strict=True)) / len(pos)


def ref_hits(pos: list[float], neg: list[list[float]], k: int) -> float:
    if not pos:
        return math.nan
    return sum(1 for p, n in zip(pos, neg, strict=True) if ref_rank(p, n) <= k) / len(pos)


def ref_auc(pos: list[float], neg: list[list[float]]) -> float:
    negatives = [n for row in neg for n in row]
    if not pos or not negatives:
        return math.nan
    wins = 0.0
    for p in pos:
        for n in negatives:
            wins += 1.0 if p > n else 0.5 if p == n else 0.0
    return wins / (len(pos) * len(negatives))


# few distinct values: ties between a positive and its negatives are common, not a corner case
SCORE = st.one_of(st.integers(-3, 3).map(float), st.floats(-1e6, 1e6, allow_nan=False, width=32))


@st.composite
def split_scores(draw: st.DrawFn) -> tuple[list[float], list[list[float]]]:
    rows = draw(st.integers(0, 12))
    k = draw(st.integers(1, 60))
    pos = draw(st.lists(SCORE, min_size=rows, max_size=rows))
    neg = [draw(st.lists(SCORE, min_size=k, max_size=k)) for _ in range(rows)]
    return pos, neg


def arrays(pos: list[float], neg: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    k = len(neg[0]) if neg else 1
    return np.array(pos, dtype=np.float64), np.array(neg, dtype=np.float64).reshape(len(pos), k)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-12)


@settings(max_examples=200)
@given(split_scores())
def test_scores_match_the_references(case):
    pos, neg = case
    p, n = arrays(pos, neg)
    assert positive_ranks(p, n).tolist() == [ref_rank(a, b) for a, b in zip(pos, neg)]
    assert same(mean_reciprocal_rank(p, n), ref_mrr(pos, neg))
    for k in (1, 2, 10, 50):
        assert same(hits_at(p, n, k), ref_hits(pos, neg, k))
    assert same(link_roc_auc(p, n), ref_auc(pos, neg))
    scores = link_scores(p, n)
    assert tuple(scores) == LINK_METRICS
    assert same(scores["mrr"], ref_mrr(pos, neg)) and same(scores["roc_auc"], ref_auc(pos, neg))
    assert all(same(scores[f"hits@{k}"], ref_hits(pos, neg, k)) for k in HITS_AT)


@settings(max_examples=50)
@given(split_scores(), st.integers(1, 40))
def test_ranks_in_small_chunks_are_the_same(case, cells):
    """The row chunks that bound ``positive_ranks``' memory change nothing (a chunk of one row included)."""
    pos, neg = case
    p, n = arrays(pos, neg)
    whole = positive_ranks(p, n)
    original = ranking._CHUNK_CELLS
    ranking._CHUNK_CELLS = cells  # by hand, not monkeypatch: hypothesis runs the body many times per fixture
    try:
        chunked = positive_ranks(p, n)
    finally:
        ranking._CHUNK_CELLS = original
    np.testing.assert_array_equal(chunked, whole)


def test_known_values():
    pos = np.array([5.0, 1.0, 0.0])
    neg = np.array([[1.0, 2.0, 3.0], [2.0, 0.0, 1.0], [1.0, 2.0, 3.0]])
    # ranks: 1 (first), 2.5 (above 0, tied with 1, below 2), 4 (last)
    assert positive_ranks(pos, neg).tolist() == [1.0, 2.5, 4.0]
    assert mean_reciprocal_rank(pos, neg) == pytest.approx((1 + 1 / 2.5 + 1 / 4) / 3)
    assert hits_at(pos, neg, 1) == pytest.approx(1 / 3) and hits_at(pos, neg, 3) == pytest.approx(2 / 3)
    # a collapsed model ranks every positive in the middle of its 1 + K candidates, not first
    flat = positive_ranks(np.zeros(4), np.zeros((4, 99)))
    assert flat.tolist() == [50.5] * 4  # (K + 2) / 2 and link_roc_auc(np.zeros(4), np.zeros((4, 99))) == 0.5


def test_undefined_scores_are_nan_and_bad_shapes_raise():
    empty = link_scores(np.zeros(0), np.zeros((0, 5)))
    assert tuple(empty) == LINK_METRICS and all(math.isnan(v) for v in empty.values())
    assert math.isnan(link_roc_auc(np.ones(3), np.zeros((3, 0))))  # no negative: no AUC
    with pytest.raises(ValueError, match="pos must be"):
        positive_ranks(np.zeros(3), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="pos must be"):
        link_roc_auc(np.zeros((3, 1)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="k must be at least 1"):
        hits_at(np.zeros(3), np.zeros((3, 4)), 0)
