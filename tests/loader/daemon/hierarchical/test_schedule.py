"""The scheduler: every partition once per epoch, seeded, epochs differ."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.hierarchical.schedule import (
    LabelMix,
    binomial_mean_abs_deviation,
    chance_label_skew,
    label_skew,
    schedule_epoch,
    train_label_counts,
)
from loader.format.partition_table import PartitionTable


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 50), st.integers(0, 2**32), st.integers(0, 100))
def test_each_partition_once_per_epoch(parts, per, seed, epoch):
    plans = schedule_epoch(parts, per, seed, epoch)
    got = np.concatenate([p.partitions for p in plans])
    assert sorted(got.tolist()) == list(range(parts))
    assert all(len(p.partitions) <= per for p in plans)
    assert [p.index for p in plans] == list(range(len(plans)))
    assert all(p.count == len(plans) for p in plans) and plans[-1].is_last
    assert all(np.all(np.diff(p.partitions) > 0) for p in plans)


def test_deterministic_and_epochs_differ():
    a = [p.partitions.tolist() for p in schedule_epoch(64, 16, 7, 3)]
    b = [p.partitions.tolist() for p in schedule_epoch(64, 16, 7, 3)]
    c = [p.partitions.tolist() for p in schedule_epoch(64, 16, 7, 4)]
    assert a == b and a != c


def clustered_counts(parts, classes, seed):
    """Training labels per partition as min-cut partitions have them: most of each partition in one class."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 5, (parts, classes)).astype(np.float64)
    counts[np.arange(parts), rng.integers(0, classes, parts)] += rng.integers(20, 200, parts)
    return counts


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.integers(1, 40), st.integers(1, 12), st.integers(0, 2**32), st.integers(0, 50))
def test_balanced_schedule_each_partition_once_in_even_groups(parts, per, classes, seed, epoch):
    counts = clustered_counts(parts, classes, seed % 1000)
    plans = schedule_epoch(parts, per, seed, epoch, counts)
    got = np.concatenate([p.partitions for p in plans])
    assert sorted(got.tolist()) == list(range(parts))
    sizes = [len(p.partitions) for p in plans]
    assert len(plans) == -(-parts // per) and max(sizes) <= per and max(sizes) - min(sizes) <= 1
    assert [p.index for p in plans] == list(range(len(plans))) and plans[-1].is_last
    assert all(np.all(np.diff(p.partitions) > 0) for p in plans)
    again = schedule_epoch(parts, per, seed, epoch, counts)
    assert [p.partitions.tolist() for p in plans] == [p.partitions.tolist() for p in again]


def test_balanced_schedule_mixes_labels_better_than_random():
    counts = clustered_counts(64, 8, 3)

    def mean_skew(label_counts):
        skews = [label_skew(counts, p.partitions) for e in range(20)
                 for p in schedule_epoch(64, 16, 5, e, label_counts)]
        return float(np.mean(skews))

    random_skew, balanced_skew = mean_skew(None), mean_skew(counts)
    assert balanced_skew < 0.5 * random_skew, (balanced_skew, random_skew)
    # still random: epochs group the partitions differently
    a, b = (schedule_epoch(64, 16, 5, e, counts)[0].partitions.tolist() for e in (0, 1))
    assert a != b


def test_label_skew_against_the_definition():
    counts = np.array([[10, 0], [0, 10], [5, 5]], dtype=np.float64)
    assert label_skew(counts, np.array([2])) == 0.0  # the group mixes exactly as all partitions do
    assert label_skew(counts, np.array([0])) == 0.5  # (1, 0) vs (0.5, 0.5)
    assert label_skew(counts, np.array([0, 2])) == 0.25  # (0.75, 0.25)
    assert label_skew(np.zeros((2, 3)), np.array([0])) == 0.0  # no training nodes: nothing to skew


def test_train_label_counts_counts_labelled_training_nodes_per_partition():
    partitions = np.zeros((3, 6), dtype=np.int64)
    partitions[:, 0], partitions[:, 1] = [0, 4, 6], [4, 6, 10]
    labels = np.array([0, 1, 1, -1, 2, 2, 0, 0, 1, 2])
    train = np.array([0, 1, 3, 4, 6, 7, 9])
    expected = np.array([[1, 1, 0], [0, 0, 1], [2, 0, 1]], dtype=np.float64)  # node 3 is unlabelled
    np.testing.assert_array_equal(train_label_counts(PartitionTable(partitions), train, labels), expected)


def reference_binomial_mad(n, p):
    """E|X - np| summed over the binomial's support term by term."""
    return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) * abs(k - n * p) for k in range(n + 1))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.floats(0.0, 1.0))
def test_de_moivre_against_the_sum_over_the_support(n, p):
    got = binomial_mean_abs_deviation(n, p)
    want = reference_binomial_mad(n, p)
    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (n, p, got, want)


def test_de_moivre_stays_finite_for_large_groups():
    # sqrt(2 n p (1 - p) / pi) is the normal limit; lgamma keeps n = 10^7 from overflowing
    n, p = 10_000_000, 0.3
    assert math.isclose(binomial_mean_abs_deviation(n, p), math.sqrt(2 * n * p * (1 - p) / math.pi), rel_tol=1e-3)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5000), st.integers(2, 20), st.integers(0, 2**32 - 1))
def test_chance_skew_bounds(n, classes, seed):
    shares = np.random.default_rng(seed).dirichlet(np.ones(classes))
    population = n + int(np.random.default_rng(seed).integers(0, 10 * n + 1))
    chance = chance_label_skew(n, shares, population)
    assert 0.0 <= chance <= 1.0
    if population == n:
        assert chance == 0.0  # the group is everything: nothing left to chance


def test_chance_skew_is_what_random_groups_measure():
    """Monte Carlo: groups of n drawn without replacement from a labelled population, their mean total variation
    distance from the population's mix, against the closed form (both finite-population and binomial parts)."""
    rng = np.random.default_rng(0)
    for n, total, shares in ((50, 1000, [0.5, 0.3, 0.2]), (400, 2000, [0.1] * 10), (2000, 2500, [0.7, 0.3])):
        labels = rng.choice(len(shares), size=total, p=shares)
        prior = np.bincount(labels, minlength=len(shares)) / total
        tv = [0.5 * np.abs(np.bincount(rng.choice(labels, n, replace=False), minlength=len(shares)) / n - prior).sum()
              for _ in range(3000)]
        measured, predicted = float(np.mean(tv)), chance_label_skew(n, prior, total)
        assert abs(measured - predicted) < 0.08 * predicted + 0.002, (n, total, measured, predicted)


def test_label_mix_splits_skew_into_chance_and_excess():
    counts = np.array([[30.0, 0.0], [0.0, 30.0], [15.0, 15.0]])
    mix = LabelMix(counts)
    whole = mix.of(mix.group_counts(np.array([0, 1, 2])))
    assert whole.skew == 0.0 and whole.chance == 0.0 and whole.excess == 0.0
    one = mix.of(mix.group_counts(np.array([0])))
    assert one.skew == 0.5 and one.seeds == 30 and 0 < one.chance < 0.5
    assert math.isclose(one.excess, 0.5 - one.chance)
    assert mix.of(mix.group_counts(np.array([2]))).excess == 0.0  # mixed exactly as the whole: skew 0, never below 0
    # a group's seeds' labels count as its partitions' do (unlabelled seeds, -1, left out)
    seeds = np.array([0] * 30 + [-1] * 4)
    assert mix.seed_counts(seeds).tolist() == mix.group_counts(np.array([0])).tolist()
    empty = LabelMix(np.zeros((2, 3)))
    assert empty.of(empty.group_counts(np.array([0]))).seeds == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(2, 5), st.integers(0, 2**32 - 1))
def test_class_weights_make_a_groups_seeds_weigh_like_the_epochs_label_mix(parts, classes, seed):
    from loader.daemon.hierarchical.schedule import CLASS_WEIGHT_CAP

    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 40, (parts, classes)).astype(np.float64)
    mix = LabelMix(counts)
    group = rng.choice(parts, rng.integers(1, parts + 1), replace=False)
    weight = mix.class_weight(mix.group_counts(group))
    have = counts[group].sum(axis=0)
    assert weight.dtype == np.float32 and weight.shape == (classes,)
    assert (weight[have == 0] == 0).all() and (weight <= CLASS_WEIGHT_CAP).all()
    if have.sum() == 0:
        return
    # a plain reference: per present class, the epoch's share over the group's, capped
    prior = counts.sum(axis=0) / counts.sum()
    for c in np.flatnonzero(have):
        assert math.isclose(weight[c], min(prior[c] / (have[c] / have.sum()), CLASS_WEIGHT_CAP), rel_tol=1e-6)
    # uncapped, the group's seeds weighted by class hold the epoch's label mix
    if (weight[have > 0] < CLASS_WEIGHT_CAP).all() and (have > 0).all():
        np.testing.assert_allclose(have * weight / have.sum(), prior, rtol=1e-5)
