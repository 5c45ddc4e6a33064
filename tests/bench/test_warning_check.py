"""bench/warning_check.py: the daemon's skew rule replayed offline, and the bar's verdicts."""

import json

import numpy as np

from bench.warning_check import ConfigCheck, EpochVerdict, accuracy_gaps, replay
from loader.daemon.hierarchical.schedule import LabelMix, schedule_epoch, train_label_counts
from loader.format.dataset import open_dataset
from tests.daemon_harness import small_dataset


def verdicts(*warns_per_seed):
    return [EpochVerdict(seed, epoch, 0.2, 0.01, 0.19, w) for seed, ws in enumerate(warns_per_seed)
            for epoch, w in enumerate(ws)]


def test_the_bar_needs_a_warning_in_every_seed_of_a_loss_and_none_where_quiet():
    assert ConfigCheck("g", 32, 8, 3.5, verdicts([True, False], [False, True])).verdict == "right"
    assert ConfigCheck("g", 32, 8, 3.5, verdicts([True, True], [False, False])).verdict == "missed"
    assert ConfigCheck("g", 32, 8, 0.5, verdicts([False], [False])).verdict == "right"
    assert ConfigCheck("g", 32, 8, -1.0, verdicts([False], [True])).verdict == "false alarm"
    assert ConfigCheck("g", 32, 8, 1.0, verdicts([True], [False])).verdict == "no bar"
    assert ConfigCheck("g", 32, 8, None, verdicts([True])).verdict == "no gap measured"


def test_gaps_are_read_from_accuracy_bench_results(tmp_path):
    result = {"args": {"partitions": 32}, "datasets": {"amazon-photo": {"gaps": [
        {"mode": "HB", "gap_points": 3.55}, {"mode": "HB25", "gap_points": 9.0}]},
        "cora-planetoid": {"gaps": [{"mode": "HB", "gap_points": None}]}}}
    path = tmp_path / "accuracy.json"
    path.write_text(json.dumps(result))
    assert accuracy_gaps([path]) == {("amazon-photo", 32): 3.55}


def test_replay_is_the_daemons_epoch_quality(tmp_path):
    dataset = small_dataset(tmp_path, nodes=2000, partitions=16)
    per, epochs = replay(dataset, 4.0, [0, 1], 3)
    assert per == 4 and [(e.seed, e.epoch) for e in epochs] == [(s, e) for s in (0, 1) for e in range(3)]
    # epoch 1 of seed 1 by hand: the seed-weighted mean of its mega-batches' skews
    ds = open_dataset(dataset)
    parts = ds.partitions()
    train = np.sort(ds.read("train", np.int64, 1))
    counts = train_label_counts(parts, train, ds.read("labels", np.int64, 1))
    mix = LabelMix(counts)
    groups = [mix.of(mix.group_counts(s.partitions)) for s in schedule_epoch(16, 4, 1, 1, counts)]
    want = sum(g.skew * g.seeds for g in groups) / sum(g.seeds for g in groups)
    assert abs(epochs[4].skew - want) < 1e-9
    assert all(e.chance >= 0.0 and 0.0 <= e.excess <= e.skew for e in epochs)
