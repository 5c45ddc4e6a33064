"""Link-prediction scores of held-out edges, as plain numpy functions.

Every held-out positive ``r`` has one score ``pos[r]`` and K scores ``neg[r, :]``, those of its K
fixed negatives ``(source_r, tail)`` (``*_neg_tails.npy``). Names as ``--metric`` names them:

- ``mrr``: the mean over positives of 1 / rank, where the rank of positive r among its 1 + K
  candidates is ``1 + #(neg[r] > pos[r]) + #(neg[r] == pos[r]) / 2``: the mean of the optimistic
  rank (ties count below it) and the pessimistic rank (ties count above it). That is OGB's rule
  (ogbl-citation2's evaluator): a model whose scores collapse to a constant ranks every positive in
  the middle, (K + 2) / 2, instead of first, as an optimistic count would reward it.
- ``hits@1``, ``hits@10``, ``hits@50``: the share of positives whose (tie-averaged) rank is at most
  k; with k >= 1 + K every positive counts.
- ``roc_auc``: every positive (label 1) against every one of the E * K negatives (label 0), the rank
  statistic of ``trainer.scores.binary_roc_auc`` (ties count one half).

A score undefined for its input (no positive; AUC also without a negative) is NaN, never an exception,
as in ``trainer.scores``: an empty split must not end a run, and NaN is never an improvement.
"""

import math

import numpy as np

from trainer.scores import binary_roc_auc

__all__ = ["LINK_METRICS", "LINK_METRIC_CHOICES", "HITS_AT", "DEFAULT_LINK_METRIC", "positive_ranks",
           "mean_reciprocal_rank", "hits_at", "link_roc_auc", "link_scores"]

HITS_AT = (1, 10, 50)
"""The k of the Hits@k a run reports."""

LINK_METRICS = ("mrr", *(f"hits@{k}" for k in HITS_AT), "roc_auc")
"""The metrics a link-prediction run reports and can be judged by (``--metric``)."""

LINK_METRIC_CHOICES = ("auto", *LINK_METRICS)

DEFAULT_LINK_METRIC = "mrr"
"""What ``--metric auto`` means for link prediction: the ranking of a positive against its own negatives,
which is what the held-out negatives are drawn for (AUC compares positives with other sources' negatives)."""

_CHUNK_CELLS = 1 << 22
"""Candidates compared per step of ``positive_ranks``: bounds its temporary boolean arrays (~4 MiB each)."""


def _scores(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pos = np.asarray(pos, dtype=np.float64)
    neg = np.asarray(neg, dtype=np.float64)
    if pos.ndim != 1 or neg.ndim != 2 or neg.shape[0] != pos.shape[0]:
        raise ValueError(f"pos must be (E,) and neg (E, K), got {pos.shape} and {neg.shape}")
    return pos, neg


def positive_ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """float64 (E,): each positive's tie-averaged rank among itself and its row of ``neg`` (1 = best)."""
    pos, neg = _scores(pos, neg)
    ranks = np.empty(pos.shape[0], dtype=np.float64)
    rows = max(1, _CHUNK_CELLS // max(1, neg.shape[1]))
    for start in range(0, pos.shape[0], rows):
        p, n = pos[start:start + rows, None], neg[start:start + rows]
        ranks[start:start + rows] = 1.0 + (n > p).sum(axis=1) + 0.5 * (n == p).sum(axis=1)
    return ranks


def mean_reciprocal_rank(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mean of 1 / ``positive_ranks``; NaN without a positive."""
    ranks = positive_ranks(pos, neg)
    return float(np.mean(1.0 / ranks)) if ranks.size else math.nan


def hits_at(pos: np.ndarray, neg: np.ndarray, k: int) -> float:
    """Share of positives whose ``positive_ranks`` is at most ``k`` (>= 1); NaN without a positive."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    ranks = positive_ranks(pos, neg)
    return float(np.mean(ranks <= k)) if ranks.size else math.nan


def link_roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC of every positive against every negative; NaN without both."""
    pos, neg = _scores(pos, neg)
    scores = np.concatenate((pos, neg.reshape(-1)))
    positive = np.zeros(scores.shape[0], dtype=bool)
    positive[:pos.shape[0]] = True
    return binary_roc_auc(scores, positive)


def link_scores(pos: np.ndarray, neg: np.ndarray) -> dict[str, float]:
    """Every ``LINK_METRICS`` score of one split, by name (the ranks computed once)."""
    ranks = positive_ranks(pos, neg)
    empty = ranks.size == 0
    scores = {"mrr": math.nan if empty else float(np.mean(1.0 / ranks))}
    for k in HITS_AT:
        scores[f"hits@{k}"] = math.nan if empty else float(np.mean(ranks <= k))
    scores["roc_auc"] = link_roc_auc(pos, neg)
    return scores
