"""Stage 1, the scheduler: which partitions form each mega-batch of an epoch.

HierBatching (Algorithm 1, line 12) cuts a seeded shuffle of all partitions into groups of N_d
("random"). Min-cut partitions are homophilous, so their labels cluster: a random group's training
labels can be far from the epoch's mix, and the model chases each mega-batch's mix in turn (on
amazon-photo, 32 METIS partitions, N_d/N_p = 1/4, the groups' labels are 0.26 away from the epoch's
in total variation, and validation accuracy lags in-memory sampling by 5-30 points for the first
10 epochs). "balanced" (the default) keeps the shuffle but deals the shuffled partitions greedily,
each to the open group whose label mix it evens most (``balanced_group_of``), which brings that
distance to 0.15 (0.03 with 256 partitions): stratified mega-batches, still random and seeded.

Either way every partition is in exactly one group per epoch, so every training node is in exactly
one mega-batch, which is what makes "each training node once per pass" hold across the epoch.
"""

import math
from dataclasses import dataclass

import numpy as np

from loader.daemon.hierarchical.schedule_kernels import balanced_group_of
from loader.daemon.link_serving import LinkStateWork
from loader.format.partition_table import PartitionTable

__all__ = ["ScheduledMegaBatch", "schedule_epoch", "label_skew", "binomial_mean_abs_deviation", "chance_label_skew",
           "LabelMix", "GroupSkew", "train_label_counts", "CLASS_WEIGHT_CAP"]

_SCHEDULE_STREAM = 0x5C4ED
_TIE_STREAM = 0xBA1A


@dataclass(frozen=True)
class ScheduledMegaBatch:
    """One mega-batch to load: scheduler -> disk reader."""

    epoch: int
    index: int
    """Position of this mega-batch within its epoch (0-based)."""
    count: int
    """Mega-batches in the epoch."""
    partitions: np.ndarray
    """int64 partition ids, ascending (so reads walk the files forward)."""
    epoch_batches: int = -1
    """Batches the whole epoch will publish, or -1 when not known ahead (``passes = "auto"``)."""
    link: LinkStateWork | None = None
    """A link dataset's mega-batch (a buffer state): the training edges it trains (``link_serving.link_states``)."""
    train_nodes: np.ndarray | None = None
    """int64 dataset ids, ascending: the training nodes this mega-batch trains, a subset of its partitions' (a
    buffer state of ``formation = "comet"``, ``swap_schedule``); None: all of them."""

    def __post_init__(self) -> None:
        parts = np.ascontiguousarray(self.partitions, dtype=np.int64)
        if parts.ndim != 1 or len(parts) == 0:
            raise ValueError(f"ScheduledMegaBatch.partitions must be a non-empty 1-D array, got shape {parts.shape}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"ScheduledMegaBatch.index {self.index} outside [0, {self.count})")
        object.__setattr__(self, "partitions", parts)
        if self.train_nodes is not None:
            object.__setattr__(self, "train_nodes", np.ascontiguousarray(self.train_nodes, dtype=np.int64))

    @property
    def is_last(self) -> bool:
        return self.index == self.count - 1


def schedule_epoch(num_partitions: int, per_megabatch: int, seed: int, epoch: int,
                   label_counts: np.ndarray | None = None) -> list[ScheduledMegaBatch]:
    """The epoch's mega-batches; a pure function of its arguments (same seed, same schedule).

    Without ``label_counts`` ("random"): the shuffle cut into groups of ``per_megabatch``. With
    ``label_counts`` (float (P, C), training labels per partition; "balanced"): as many groups,
    sizes differing by at most one, dealt by ``balanced_group_of`` in the shuffle's order.
    """
    if num_partitions <= 0 or per_megabatch <= 0:
        raise ValueError(f"need positive partition counts, got {num_partitions} and {per_megabatch}")
    rng = np.random.Generator(np.random.PCG64([seed, _SCHEDULE_STREAM, epoch]))
    order = rng.permutation(num_partitions).astype(np.int64)
    if label_counts is None:
        groups = [order[i:i + per_megabatch] for i in range(0, num_partitions, per_megabatch)]
    else:
        counts = np.ascontiguousarray(label_counts, dtype=np.float64)
        if counts.ndim != 2 or counts.shape[0] != num_partitions:
            raise ValueError(f"label_counts: shape {counts.shape}, expected ({num_partitions}, classes)")
        num_groups = -(-num_partitions // per_megabatch)
        capacity = np.full(num_groups, num_partitions // num_groups, dtype=np.int64)
        capacity[:num_partitions % num_groups] += 1
        tie = np.random.Generator(np.random.PCG64([seed, _TIE_STREAM, epoch])).random(num_groups) * 1e-9
        group_of = balanced_group_of(counts, order, capacity, tie)
        # each group's partitions, groups in id order (which group is dealt first is random: ``tie``)
        by_group = np.argsort(group_of[order], kind="stable")
        bounds = np.cumsum(np.bincount(group_of, minlength=num_groups))[:-1]
        groups = np.split(order[by_group], bounds)
    return [ScheduledMegaBatch(epoch, i, len(groups), np.sort(g)) for i, g in enumerate(groups)]


def label_skew(label_counts: np.ndarray, partitions: np.ndarray) -> float:
    """Total variation distance between the training labels of ``partitions`` and of all partitions.

    0 when the group's labels are mixed exactly as the epoch's, 1 when they share no class; 0 for a
    group without training nodes (it trains nothing).
    """
    mix = LabelMix(label_counts)
    return mix.of(mix.group_counts(partitions)).skew


def binomial_mean_abs_deviation(n: int, p: float) -> float:
    """E|X - np| for X ~ Binomial(n, p), by De Moivre's closed form (exact, O(1)).

    With m = floor(np): 2 (m + 1) C(n, m + 1) p^(m + 1) (1 - p)^(n - m), computed in logs so that
    n in the millions neither overflows nor underflows to a wrong 0.
    """
    if n <= 0 or p <= 0.0 or p >= 1.0:
        return 0.0
    m = math.floor(n * p)
    if m + 1 > n:  # np rounds up to n (p within an ulp of 1): X <= n = np, nothing deviates upwards
        return 0.0
    log_term = (math.lgamma(n + 1) - math.lgamma(m + 2) - math.lgamma(n - m)
                + (m + 1) * math.log(p) + (n - m) * math.log1p(-p))
    return 2.0 * (m + 1) * math.exp(log_term)


def chance_label_skew(group_size: int, proportions: np.ndarray, population: int) -> float:
    """The label skew a group of ``group_size`` training nodes drawn at random from ``population`` has
    on average: what no grouping of partitions can remove, only a larger mega-batch.

    The total variation distance is half the sum over classes of |share in group - share in all|.
    Drawn with replacement, a class's count is binomial (``binomial_mean_abs_deviation``); drawn
    without, its spread shrinks by the finite-population factor sqrt((N - n) / (N - 1)), which is 0
    for a group holding every node. A mega-batch's measured skew above this is the partitions'
    doing (homophily), and only that excess pulls the model toward a few classes beyond what
    any mini-batch of seeds already does.
    """
    n, total = int(group_size), int(population)
    if n <= 0 or total <= 1 or n >= total:
        return 0.0
    shares = np.asarray(proportions, dtype=np.float64)
    deviation = sum(binomial_mean_abs_deviation(n, float(p)) for p in shares)  # a term per class, not per node
    return float(0.5 * deviation / n * math.sqrt((total - n) / (total - 1)))


@dataclass(frozen=True)
class GroupSkew:
    """A group of partitions' label skew and the part of it a random group of its size has anyway."""

    skew: float
    chance: float
    seeds: int
    """Training nodes with a label in the group."""

    @property
    def excess(self) -> float:
        """Skew beyond chance (never negative): the part that grouping by partitions adds."""
        return max(0.0, self.skew - self.chance)


CLASS_WEIGHT_CAP = 10.0
"""Largest class weight (``[hierarchy] label_prior_loss``): a class a mega-batch holds a handful of seeds of would
otherwise dominate its batches' gradients (importance weights are unbiased but their variance grows with them)."""


class LabelMix:
    """The epoch's training labels per partition, with the totals every group is compared with computed once."""

    def __init__(self, label_counts: np.ndarray) -> None:
        self.counts = np.ascontiguousarray(label_counts, dtype=np.float64)
        self.total = self.counts.sum(axis=0)
        self.population = int(round(float(self.total.sum())))
        self.prior = self.total / self.total.sum() if self.population > 0 else self.total

    def group_counts(self, partitions: np.ndarray) -> np.ndarray:
        """float64 (C,): the training labels of ``partitions``, per class."""
        return self.counts[partitions].sum(axis=0)

    def seed_counts(self, labels: np.ndarray) -> np.ndarray:
        """float64 (C,): ``labels`` (a group's training seeds' labels; -1, unlabelled, left out), per class."""
        labels = np.asarray(labels, dtype=np.int64)
        return np.bincount(labels[labels >= 0], minlength=self.counts.shape[1]).astype(np.float64)

    def class_weight(self, group: np.ndarray) -> np.ndarray:
        """float32 (C,): per class, the epoch's share of training labels over the group's (``group``: its labels
        per class, ``group_counts`` or ``seed_counts``), capped at ``CLASS_WEIGHT_CAP`` (0 for a class the group
        lacks: no seed of it to weigh). A loss weighing each seed by its class's weight has, over the group's
        seeds, the expectation of the epoch's label mix."""
        seeds = float(group.sum())
        weight = np.zeros(len(group), dtype=np.float64)
        present = group > 0
        if seeds > 0 and self.population > 0:
            weight[present] = np.minimum(self.prior[present] / (group[present] / seeds), CLASS_WEIGHT_CAP)
        return weight.astype(np.float32)

    def of(self, group: np.ndarray) -> GroupSkew:
        """A group's skew against the whole (``group``: its labels per class; 0 for a group without labelled
        training nodes)."""
        seeds = int(round(float(group.sum())))
        if seeds <= 0 or self.population <= 0:
            return GroupSkew(0.0, 0.0, 0)
        skew = float(0.5 * np.abs(group / group.sum() - self.prior).sum())
        return GroupSkew(skew, chance_label_skew(seeds, self.prior, self.population), seeds)


def train_label_counts(partitions: PartitionTable, train_ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """float64 (P, C): training nodes of each class in each partition (unlabelled ones left out).

    train_ids: sorted dataset ids; labels: int64 (N,), -1 = unlabelled.
    """
    num_parts = len(partitions)
    part_of = partitions.partition_of(train_ids)
    train_labels = labels[train_ids]
    keep = train_labels >= 0
    classes = int(train_labels[keep].max()) + 1 if keep.any() else 1
    flat = np.bincount(part_of[keep] * classes + train_labels[keep], minlength=num_parts * classes)
    return flat.reshape(num_parts, classes).astype(np.float64)
