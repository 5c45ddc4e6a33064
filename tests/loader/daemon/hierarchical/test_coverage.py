"""Neighbour coverage of a sampled pass against a plain reference, and the epoch's warnings."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.daemon.hierarchical.coverage import (
    COVERAGE_WARN,
    EXCESS_SKEW_WARN,
    EpochQuality,
    NeighbourSlots,
    QualityKnobs,
    neighbour_slots,
)
from loader.daemon.hierarchical.schedule import GroupSkew
from loader.sampling.sampling import CSCGraph, batch_keys, sample_pass


def reference_slots(sampled, full_degree, fanouts):
    """Per batch, per hop: the targets are the block of nodes first reached one hop earlier."""
    full = 0
    for b in range(sampled.num_batches):
        nodes = sampled.nodes[sampled.node_ptr[b]:sampled.node_ptr[b + 1]]
        start = 0
        for hop, fanout in enumerate(fanouts):
            block = nodes[start:start + sampled.num_sampled_nodes[b, hop]]
            start += sampled.num_sampled_nodes[b, hop]
            for v in block.tolist():
                d = int(full_degree[v])
                full += d if fanout < 0 else min(fanout, d)
    return full


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 60), st.integers(0, 300), st.integers(1, 20), st.lists(st.integers(-1, 6), min_size=1,
                                                                               max_size=3),
       st.integers(0, 2**32), st.integers(0, 5))
def test_slots_match_the_reference(n, e, batch_size, fanouts, seed, cut_extra):
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, n, e))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    graph = CSCGraph(indptr, rng.integers(0, n, e), np.arange(n, dtype=np.int64))
    # the full graph had up to cut_extra more in-neighbours per node than the mega-batch kept
    full_degree = np.diff(indptr) + rng.integers(0, cut_extra + 1, n)
    seeds = rng.permutation(n)[:max(1, n // 2)]
    keys = batch_keys(seed, 0, 0, 0, 0, -(-len(seeds) // batch_size))
    sampled = sample_pass(graph, seeds, batch_size, fanouts, keys)
    slots = neighbour_slots(sampled, full_degree, tuple(fanouts))
    assert slots.filled == int(sampled.num_sampled_edges.sum())
    assert slots.full == reference_slots(sampled, full_degree, fanouts)
    assert slots.filled <= slots.full
    if cut_extra == 0:
        assert slots.filled == slots.full  # nothing cut, nothing lost


def test_epoch_quality_weights_and_warnings():
    quality = EpochQuality()
    assert quality.coverage == 1.0 and quality.skew == 0.0 and quality.warnings() == {}
    quality.add(NeighbourSlots(90, 100), GroupSkew(0.1, 0.08, 300), 300)
    quality.add(NeighbourSlots(10, 100), GroupSkew(0.12, 0.10, 100), 100)
    assert quality.coverage == 0.5 and abs(quality.skew - (0.1 * 300 + 0.12 * 100) / 400) < 1e-12
    assert abs(quality.chance - (0.08 * 300 + 0.10 * 100) / 400) < 1e-12
    assert abs(quality.excess - (quality.skew - quality.chance)) < 1e-12
    assert quality.coverage < COVERAGE_WARN and quality.excess < EXCESS_SKEW_WARN
    assert set(quality.warnings()) == {"coverage"}
    skewed = EpochQuality()
    skewed.add(NeighbourSlots(100, 100), GroupSkew(0.9, 0.1, 10), 10)
    assert set(skewed.warnings()) == {"skew"}
    assert "0.800 beyond the 0.100 random groups of seeds have" in skewed.warnings()["skew"]


def test_skew_that_chance_explains_does_not_warn():
    """A small graph in many partitions: random groups of so few seeds are skewed 0.3 anyway, and grouping
    partitions adds only 0.05 to it, which costs nothing."""
    by_chance = EpochQuality()
    by_chance.add(NeighbourSlots(100, 100), GroupSkew(0.35, 0.30, 50), 50)
    assert by_chance.warnings() == {}
    # the same excess over a large mega-batch, where chance explains nothing, is past the limit
    homophily = EpochQuality()
    homophily.add(NeighbourSlots(100, 100), GroupSkew(0.12, 0.01, 5000), 5000)
    assert set(homophily.warnings()) == {"skew"}
    # an excess as large as the chance part but under the floor is quiet: the bench's quiet configurations
    quiet = EpochQuality()
    quiet.add(NeighbourSlots(100, 100), GroupSkew(0.06, 0.02, 5000), 5000)
    assert quiet.warnings() == {}


def test_a_warning_names_only_the_knobs_not_already_set():
    skewed = EpochQuality()
    skewed.add(NeighbourSlots(50, 100), GroupSkew(0.9, 0.0, 10), 10)
    nothing_set = QualityKnobs(schedule_balanced=False, fraction_auto=False, whole_graph=False,
                               static_cache_off=True, partitions=32, advised_partitions=256, float32_features=True)
    said = skewed.warnings(nothing_set)
    assert "--feat-dtype float16" in said["skew"]
    assert "schedule = \"balanced\"" in said["skew"] and "--partitions auto (256 partitions, not 32" in said["skew"]
    assert "megabatch_fraction" in said["skew"] and "megabatch_fraction" in said["coverage"]
    assert "static_cache = \"auto\"" in said["coverage"]
    # the case: balanced already in effect, partitions already many, fraction auto, whole budget used
    all_set = QualityKnobs(schedule_balanced=True, fraction_auto=True, whole_graph=False, static_cache_off=False,
                           partitions=256, advised_partitions=256)
    said = skewed.warnings(all_set)
    for knob in ("schedule", "--partitions", "megabatch_fraction", "static_cache", "--feat-dtype"):
        assert knob not in said["skew"] + said["coverage"], (knob, said)
    assert "[memory] budget" in said["skew"] and "mode = \"staged\"" in said["skew"]


def test_expected_edge_coverage():
    from loader.daemon.hierarchical.coverage import expected_edge_coverage
    assert expected_edge_coverage(0.4, 32, 32) == 1.0  # every partition: nothing cut away
    assert expected_edge_coverage(0.0, 32, 1) == 1.0  # nothing cut
    assert abs(expected_edge_coverage(1.0, 33, 9) - 0.25) < 1e-12  # all cut: the other 8 of 32 partitions
    assert expected_edge_coverage(0.5, 1, 1) == 1.0


def test_a_warning_that_holds_is_logged_at_its_first_epoch_then_every_tenth():
    from loader.daemon.hierarchical.coverage import WARN_EVERY, WarningStreaks
    streaks = WarningStreaks()
    logged = [sorted(streaks.to_log({"skew"})) for _ in range(2 * WARN_EVERY + 1)]
    assert [i for i, kinds in enumerate(logged) if kinds] == [0, WARN_EVERY, 2 * WARN_EVERY]
    assert streaks.to_log(set()) == set()
    assert streaks.to_log({"skew", "coverage"}) == {"skew", "coverage"}  # cleared, so news again
