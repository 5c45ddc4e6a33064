"""trainer.scores against plain reference implementations, and the choice of the metric for ``auto``."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.scores import (
    MINORITY_SHARE,
    MetricChoice,
    accuracy,
    accuracy_from_confusion,
    binary_roc_auc,
    choose_metric,
    confusion_matrix,
    macro_f1,
    macro_f1_from_confusion,
    roc_auc,
)

# --- reference implementations: the definitions, written out pair by pair and count by count ---


def ref_binary_auc(scores: list[float], positive: list[bool]) -> float:
    """Share of (positive, negative) pairs ranked right, a tie counting 1/2; NaN without both kinds."""
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    if not pos or not neg:
        return math.nan
    wins = 0.0
    for a in pos:
        for b in neg:
            wins += 1.0 if a > b else 0.5 if a == b else 0.0
    return wins / (len(pos) * len(neg))


def ref_roc_auc(probabilities: list[list[float]], labels: list[int]) -> float:
    classes = len(probabilities[0])
    if classes == 2:
        return ref_binary_auc([row[1] for row in probabilities], [y == 1 for y in labels])
    present = sorted(set(labels))
    if len(present) < 2:
        return math.nan
    per_class = [ref_binary_auc([row[c] for row in probabilities], [y == c for y in labels]) for c in present]
    return sum(per_class) / len(per_class)


def ref_macro_f1(predicted: list[int], labels: list[int]) -> float:
    present = sorted(set(labels))
    if not present:
        return math.nan
    f1s = []
    for c in present:
        tp = sum(1 for p, y in zip(predicted, labels, strict=True) if p == c and y == c)
        fp = sum(1 for p, y in zip(predicted, labels, strict=True) if p == c and y != c)
        fn = sum(1 for p, y in zip(predicted, labels, strict=True) if p != c and y == c)
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn)
        f1s.append(2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    return sum(f1s) / len(f1s)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-12)


# --- strategies: few distinct score values, so ties are common ---

SCORE = st.sampled_from([-2.0, -0.5, 0.0, 0.25, 0.25000001, 1.0, 3.0]) | st.floats(-10, 10, allow_nan=False)


@st.composite
def scored_labels(draw: st.DrawFn, max_classes: int = 5) -> tuple[list[list[float]], list[int]]:
    classes = draw(st.integers(2, max_classes))
    n = draw(st.integers(1, 40))
    labels = draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n))
    rows = draw(st.lists(st.lists(SCORE, min_size=classes, max_size=classes), min_size=n, max_size=n))
    return rows, labels


@st.composite
def predictions(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    classes = draw(st.integers(1, 6))
    n = draw(st.integers(0, 40))
    labels = draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n))
    predicted = draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n))
    return predicted, labels, classes


@given(st.lists(st.tuples(SCORE, st.booleans()), max_size=60))
def test_binary_auc_matches_pairwise_counting(pairs):
    scores, positive = [s for s, _ in pairs], [p for _, p in pairs]
    got = binary_roc_auc(np.array(scores), np.array(positive, dtype=bool))
    want = ref_binary_auc(scores, positive)
    assert (math.isnan(got) and math.isnan(want)) or got == want  # both exact: sums of halves


@given(st.lists(st.tuples(SCORE, st.booleans()), min_size=2, max_size=60))
def test_binary_auc_is_symmetric_and_ignores_monotone_transforms(pairs):
    scores = np.array([s for s, _ in pairs])
    positive = np.array([p for _, p in pairs], dtype=bool)
    auc = binary_roc_auc(scores, positive)
    if math.isnan(auc):
        assert positive.all() or not positive.any()
        return
    assert same(binary_roc_auc(-scores, positive), 1.0 - auc)  # reversing the ranking
    assert same(binary_roc_auc(scores, ~positive), 1.0 - auc)  # swapping the classes
    dense_rank = np.unique(scores, return_inverse=True)[1].astype(np.float64)
    assert binary_roc_auc(dense_rank, positive) == auc  # only the order of the scores counts, ties included


@given(scored_labels())
def test_roc_auc_matches_the_one_vs_rest_reference(data):
    rows, labels = data
    got = roc_auc(np.array(rows), np.array(labels, dtype=np.int64))
    assert same(got, ref_roc_auc(rows, labels))


@given(predictions())
def test_confusion_accuracy_and_macro_f1_match_explicit_counts(data):
    predicted, labels, classes = data
    p, y = np.array(predicted, dtype=np.int64), np.array(labels, dtype=np.int64)
    matrix = confusion_matrix(p, y, classes)
    for t in range(classes):
        for q in range(classes):
            assert matrix[t, q] == sum(1 for a, b in zip(predicted, labels, strict=True) if b == t and a == q)
    want_acc = sum(a == b for a, b in zip(predicted, labels, strict=True)) / len(labels) if labels else math.nan
    assert same(accuracy(p, y), want_acc) and same(accuracy_from_confusion(matrix), want_acc)
    want_f1 = ref_macro_f1(predicted, labels)
    assert same(macro_f1(p, y), want_f1) and same(macro_f1_from_confusion(matrix), want_f1)


@settings(max_examples=50)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_perfect_predictions_score_one(labels):
    y = np.array(labels, dtype=np.int64)
    assert accuracy(y, y) == 1.0 and macro_f1(y, y) == 1.0
    onehot = np.eye(4)[y]
    assert math.isnan(roc_auc(onehot, y)) if len(set(labels)) < 2 else roc_auc(onehot, y) == 1.0


def test_known_values():
    # 2 positives, 2 negatives: pairs (0.9>0.1) (0.9>0.4) (0.4=0.4 tie) (0.4>0.1) -> 3.5 / 4
    assert binary_roc_auc(np.array([0.9, 0.4, 0.4, 0.1]), np.array([True, True, False, False])) == 0.875
    # class 2 is predicted but absent from the labels: it adds a false positive to class 0's row only
    assert macro_f1(np.array([0, 2, 1, 1]), np.array([0, 0, 1, 1])) == pytest.approx((2 / 3 + 1.0) / 2)
    assert math.isnan(macro_f1(np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert math.isnan(roc_auc(np.full((3, 3), 1 / 3), np.array([2, 2, 2])))


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match="non-negative"):
        accuracy(np.array([0, 1]), np.array([0, -1]))
    with pytest.raises(ValueError, match="shape"):
        macro_f1(np.array([0, 1]), np.array([0]))
    with pytest.raises(ValueError, match="not below the 2 score columns"):
        roc_auc(np.zeros((2, 2)), np.array([0, 2]))


# --- choose_metric ---


@pytest.mark.parametrize("counts, metric", [((66, 34), "roc_auc"), ((65, 35), "accuracy"), ((35, 65), "accuracy"),
                                            ((10, 90), "roc_auc"), ((0, 10), "roc_auc"), ((50, 50), "accuracy"),
                                            ((0, 0), "accuracy")])
def test_auto_picks_auc_for_imbalanced_binary_tasks(counts, metric):
    choice = choose_metric("auto", 2, counts)
    assert choice.metric == metric and choice.reason.startswith("auto: binary task")
    if sum(counts):
        minority = min(counts) / sum(counts)
        assert (minority < MINORITY_SHARE) == (metric == "roc_auc")
        assert f"{100 * minority:.1f}% of {sum(counts):,} labelled training nodes" in choice.reason


def test_auto_on_multiclass_is_accuracy_whatever_the_balance():
    assert choose_metric("auto", 3, (1, 1, 98)) == MetricChoice("accuracy", "auto: 3 classes, not a binary task")
    assert choose_metric("auto", 5, None).metric == "accuracy"


def test_an_explicit_metric_is_kept():
    for name in ("accuracy", "roc_auc", "macro_f1"):
        assert choose_metric(name, 2, (1, 99)) == MetricChoice(name, "as requested")


def test_choose_metric_refuses_unknown_names_and_missing_counts():
    with pytest.raises(ValueError, match="metric must be one of auto, accuracy, roc_auc, macro_f1, got 'f1'"):
        choose_metric("f1", 2, (1, 1))
    with pytest.raises(ValueError, match="needs the class counts"):
        choose_metric("auto", 2, None)
    with pytest.raises(ValueError, match="metric must be one of"):
        MetricChoice("auto", "x")
