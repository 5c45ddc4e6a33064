"""Evaluation scores as plain numpy functions, and the choice of the metric that fits a task.

Three metrics, named as ``--metric`` names them:

- ``accuracy``: share of labelled nodes whose arg-max class is right.
- ``macro_f1``: the unweighted mean of per-class F1 (2 TP / (2 TP + FP + FN)) over the classes
  present in the labels. A class that is predicted but absent from the labels adds false
  positives to the classes it was confused with, and no F1 term of its own.
- ``roc_auc``: area under the ROC curve, ties counted as one half (the Mann-Whitney U statistic
  divided by positives x negatives). Binary tasks rank the score of class 1; multi-class tasks
  take the one-vs-rest macro average: the AUC of class ``c``'s score for "label == c" against
  the rest, averaged without weights over the classes present in the labels.

A score that is undefined for its input (no labelled node; AUC with fewer than two classes
present) is NaN, never an exception: a validation split that happens to hold one class must not
end a training run. Callers decide what NaN means (the loop never takes it as an improvement).

``choose_metric`` resolves ``auto``: ``roc_auc`` for a binary task whose minority class is under
``MINORITY_SHARE`` of the labelled training nodes (accuracy rewards predicting the majority
there), else ``accuracy``.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["METRICS", "METRIC_CHOICES", "MINORITY_SHARE", "SHORT_NAMES", "MetricChoice", "choose_metric",
           "confusion_matrix", "accuracy_from_confusion", "macro_f1_from_confusion", "accuracy", "macro_f1",
           "binary_roc_auc", "roc_auc"]

METRICS = ("accuracy", "roc_auc", "macro_f1")
"""The metrics a run can be judged by."""

METRIC_CHOICES = ("auto", *METRICS)
"""What ``--metric`` accepts: a metric, or ``auto`` (``choose_metric``)."""

MINORITY_SHARE = 0.35
"""``auto`` picks roc_auc for a binary task whose minority class is under this share of labelled nodes."""

SHORT_NAMES = {"accuracy": "acc", "roc_auc": "auc", "macro_f1": "f1"}
"""The names of the metrics in epoch log lines."""


@dataclass(frozen=True)
class MetricChoice:
    """The metric a run is judged by and why (``reason`` completes "metric NAME (...)" in the log)."""

    metric: str
    """One of ``METRICS``."""
    reason: str

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")


def choose_metric(requested: str, num_classes: int, class_counts: Sequence[int] | None) -> MetricChoice:
    """Resolve ``requested`` (a ``METRIC_CHOICES`` name) for a task with ``num_classes`` classes.

    ``class_counts``: labelled training nodes per class (index = class). Only ``auto`` on a binary
    task needs it; None there means "not known yet" and is a ValueError.
    """
    if requested not in METRIC_CHOICES:
        raise ValueError(f"metric must be one of {', '.join(METRIC_CHOICES)}, got {requested!r}")
    if requested != "auto":
        return MetricChoice(requested, "as requested")
    if num_classes != 2:
        return MetricChoice("accuracy", f"auto: {num_classes} classes, not a binary task")
    if class_counts is None:
        raise ValueError("auto needs the class counts of the training labels for a binary task")
    counts = [int(c) for c in class_counts]
    total = sum(counts)
    if total == 0:
        return MetricChoice("accuracy", "auto: binary task, but no labelled training node to judge the balance by")
    minority = min(range(len(counts)), key=lambda c: counts[c])
    share = counts[minority] / total
    if share < MINORITY_SHARE:
        return MetricChoice("roc_auc", f"auto: binary task, minority class {minority} is {100 * share:.1f}% of "
                                       f"{total:,} labelled training nodes, under {100 * MINORITY_SHARE:.0f}%")
    return MetricChoice("accuracy", f"auto: binary task, minority class {minority} is {100 * share:.1f}% of "
                                    f"{total:,} labelled training nodes, not under {100 * MINORITY_SHARE:.0f}%")


def _labels(labels: np.ndarray, name: str = "labels") -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-d integer array, got {labels.dtype} of shape {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{name} must be non-negative (drop unlabelled nodes first), got {labels.min()}")
    return labels.astype(np.int64, copy=False)


def confusion_matrix(predicted: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """int64 (num_classes, num_classes): entry [t, p] counts nodes of label t predicted as p."""
    predicted, labels = _labels(predicted, "predicted"), _labels(labels)
    if predicted.shape != labels.shape:
        raise ValueError(f"predicted has shape {predicted.shape}, labels {labels.shape}")
    if labels.size and max(int(labels.max()), int(predicted.max())) >= num_classes:
        raise ValueError(f"a class id is not below num_classes {num_classes}")
    counts = np.bincount(labels * num_classes + predicted, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def accuracy_from_confusion(confusion: np.ndarray) -> float:
    """Correct / labelled; NaN without a labelled node."""
    total = int(confusion.sum())
    return float(np.trace(confusion)) / total if total else math.nan


def macro_f1_from_confusion(confusion: np.ndarray) -> float:
    """Mean F1 over the classes that have a label in ``confusion`` (a row with a count); NaN when none has."""
    tp = np.diag(confusion).astype(np.float64)
    fp = confusion.sum(axis=0) - tp
    fn = confusion.sum(axis=1) - tp
    present = confusion.sum(axis=1) > 0
    if not present.any():
        return math.nan
    # a present class has tp + fn > 0, so the denominator is never 0
    f1 = 2 * tp[present] / (2 * tp[present] + fp[present] + fn[present])
    return float(f1.mean())


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Share of ``predicted == labels``; NaN for empty input."""
    predicted, labels = _labels(predicted, "predicted"), _labels(labels)
    if predicted.shape != labels.shape:
        raise ValueError(f"predicted has shape {predicted.shape}, labels {labels.shape}")
    return float(np.mean(predicted == labels)) if labels.size else math.nan


def macro_f1(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes present in ``labels``; NaN for empty input."""
    predicted, labels = _labels(predicted, "predicted"), _labels(labels)
    if predicted.shape != labels.shape:
        raise ValueError(f"predicted has shape {predicted.shape}, labels {labels.shape}")
    num_classes = 1 + max(int(predicted.max()), int(labels.max())) if labels.size else 1
    return macro_f1_from_confusion(confusion_matrix(predicted, labels, num_classes))


def binary_roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative) + P(tie) / 2; NaN without both kinds.

    Computed from average ranks (O(n log n)); every rank sum is a multiple of 1/2 below 2**53 for
    any realistic n, so float64 holds it exactly.
    """
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    if scores.ndim != 1 or scores.shape != positive.shape:
        raise ValueError(f"scores and positive must be 1-d of the same length, got {scores.shape} and "
                         f"{positive.shape}")
    n = scores.shape[0]
    n_pos = int(positive.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(scores, kind="stable")
    ranked = scores[order]
    starts = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
    ends = np.append(starts[1:], n)
    # 1-based rank of a tie group = the mean of the positions it spans
    group_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat(group_rank, ends - starts)
    u = float(ranks[positive].sum()) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def roc_auc(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of per-class scores (n, C) against ``labels`` (n,): class 1's column when C == 2, else the
    one-vs-rest macro average over the classes present in ``labels``; NaN with fewer than two present.
    """
    probabilities = np.asarray(probabilities)
    labels = _labels(labels)
    if probabilities.ndim != 2 or probabilities.shape[0] != labels.shape[0]:
        raise ValueError(f"probabilities must be (n, classes) with n = {labels.shape[0]} labels, got "
                         f"{probabilities.shape}")
    num_classes = probabilities.shape[1]
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"label {labels.max()} is not below the {num_classes} score columns")
    if num_classes == 2:
        return binary_roc_auc(probabilities[:, 1], labels == 1)
    present = np.flatnonzero(np.bincount(labels, minlength=num_classes))
    if present.shape[0] < 2:
        return math.nan
    return float(np.mean([binary_roc_auc(probabilities[:, c], labels == c) for c in present]))
