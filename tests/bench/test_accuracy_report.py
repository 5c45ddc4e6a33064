"""bench/accuracy_report.py: epochs to target, the bars, epoch times read from compare.json, time at scale."""

import json
from dataclasses import replace

import pytest

from bench.accuracy_report import (
    EPOCHS_BAR,
    CompareEpochs,
    EpochPoint,
    Run,
    ScaleEpoch,
    analyse,
    bars,
    compare_run,
    dataset_markdown,
    epochs_ratio,
    mean_reached,
    read_compare,
    scale_header,
    scale_markdown,
    time_at_scale,
)


def run(mode: str, seed: int, val: list[float], test: list[float] | None = None, seconds: float = 2.0) -> Run:
    test = test or val
    return Run("g", mode, seed, [EpochPoint(e + 1, v, t, 1.0, seconds) for e, (v, t) in enumerate(zip(val, test))],
               False, seconds * len(val), [], [])


def test_mean_reached_skips_the_seeds_that_never_reach():
    assert mean_reached([4, None, 6]) == 5
    assert mean_reached([None, None]) is None


def test_epochs_ratio_is_the_mode_mean_over_ns_mean():
    assert epochs_ratio([10, 14], [8, 8]) == pytest.approx(1.5)
    assert epochs_ratio([10, None], [5, 5]) == pytest.approx(2.0)
    assert epochs_ratio([None], [5]) is None
    assert epochs_ratio([5], [None]) is None


def test_time_at_scale_is_epochs_times_the_epoch_seconds():
    assert time_at_scale(12.5, 18.0) == pytest.approx(225.0)
    assert time_at_scale(None, 18.0) is None
    assert time_at_scale(3.0, None) is None


def test_bars_pass_within_both_and_name_each_miss():
    assert bars([10, 12], [10, 10], -0.9) == []
    assert bars([10], [10], +3.0) == []  # above NS is no miss
    assert bars([int(10 * EPOCHS_BAR)], [10], 0.0) == []  # the bar itself passes
    assert bars([13], [10], 0.0) == ["epochs 1.30x > 1.25x"]
    assert bars([10, None, 10], [10, 10, 10], -1.5) == ["1/3 seeds never reach the target", "test -1.50 pt"]
    assert bars([10], [None], 0.0) == ["no epochs ratio (NS never reaches the target)"]


def test_epoch_seconds_are_the_epoch_batches_over_the_rate():
    assert ScaleEpoch("hierarchical", 66.8, 1172).seconds == pytest.approx(1172 / 66.8)
    assert ScaleEpoch("exact", None, 1172).seconds is None
    assert ScaleEpoch("exact", 2.0, None).seconds is None
    died = ScaleEpoch("staged", 10.7, 1172, failed="died: OOM-killed")
    assert died.seconds is None and "OOM-killed" in died.note
    assert ScaleEpoch("staged", 10.0, 1000, remark="slow stop").seconds == pytest.approx(100.0)


def test_compare_run_maps_every_mode_to_its_row():
    assert compare_run("NS", "hierarchical") == "inmemory"
    assert compare_run("HB", "hierarchical") == "hierarchical"
    assert compare_run("HB25r", "hierarchical") == "hierarchical"
    assert compare_run("HB2", "hierarchical") == "hierarchical-r2"
    assert compare_run("STAGED", "hierarchical") == "staged"
    assert compare_run("EX", "staged") == "exact"
    assert compare_run("FULL", "hierarchical") is None


def compare_file(tmp_path, rows):
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"machine": "2 cores", "args": {"nodes": 2_000_000, "budget": "448M", "batch_size": 1024,
                                                               "fanouts": "10,5"}, "results": rows}))
    return path


def test_read_compare_takes_each_row_and_tells_a_failure(tmp_path):
    path = compare_file(tmp_path, [
        {"mode": "hierarchical", "batches_per_s": 50.0, "epoch_batches": 1000, "daemon_exit": 0, "failure": None},
        {"mode": "hierarchical-unchecked", "batches_per_s": 55.0, "epoch_batches": 1000},
        {"mode": "staged", "batches_per_s": 4.0, "epoch_batches": 1000, "daemon_exit": -9,
         "failure": "slow stop: no exit within 120 s of SIGTERM (killed)"},
        {"mode": "hybrid", "batches_per_s": 3.0, "epoch_batches": 1000, "oom_kills": 1,
         "failure": "died: OOM-killed (cgroup limit 768 MiB)"},
        # files from before ``failure``: ``died``, or only the exit code and OOM kills
        {"mode": "mmap", "batches_per_s": 1.0, "epoch_batches": 1000, "died": "OOM-killed (cgroup limit 768 MiB)"},
        {"mode": "static", "batches_per_s": 2.0, "epoch_batches": 1000, "daemon_exit": -9, "oom_kills": 1},
        {"mode": "exact", "error": "no socket"}])
    scale = read_compare(path)
    assert scale.batch_size == 1024 and "2,000,000 nodes" in scale.description
    assert scale.rows["hierarchical"].seconds == pytest.approx(20.0)
    assert scale.rows["hierarchical-unchecked"].seconds == pytest.approx(1000 / 55)
    # a slow stop comes after the measurement: the rate stands, with a remark
    assert scale.rows["staged"].seconds == pytest.approx(250.0) and "slow stop" in str(scale.rows["staged"].remark)
    assert scale.rows["hybrid"].seconds is None and "died: OOM-killed" in scale.rows["hybrid"].note
    assert scale.rows["mmap"].seconds is None and "OOM-killed" in scale.rows["mmap"].note
    assert scale.rows["static"].seconds is None and "oom_kills 1" in scale.rows["static"].note
    assert scale.rows["exact"].seconds is None and "no rate" in scale.rows["exact"].note
    assert "staged (slow stop: no exit within 120 s of SIGTERM (killed); its rate is used)" in \
        scale_header(4.0, scale, path, 1024)


def two_mode_runs():
    # NS reaches 0.80 (its best 0.81 - 1 point) at epochs 4 and 6; HB at 5 and 10
    ns = [run("NS", 0, [0.5, 0.6, 0.7, 0.8, 0.81, 0.81]), run("NS", 1, [0.5, 0.6, 0.7, 0.75, 0.78, 0.81])]
    hb = [run("HB", 0, [0.5, 0.6, 0.7, 0.75, 0.8, 0.8], test=[0.5, 0.6, 0.7, 0.75, 0.79, 0.79]),
          run("HB", 1, [0.5, 0.6, 0.7, 0.75, 0.76, 0.77, 0.78, 0.79, 0.795, 0.80])]
    staged = [replace(r, mode="STAGED", reused_from="NS") for r in ns]
    return {"NS": ns, "HB": hb, "STAGED": staged, "FULL": [run("FULL", 0, [0.9])]}


def scale_of(rows: dict[str, float]) -> CompareEpochs:
    return CompareEpochs("c.json", "2M nodes", 1024, {k: ScaleEpoch(k, v, 1000) for k, v in rows.items()})


def test_analyse_reports_epochs_ratio_time_at_scale_and_bars():
    scale = scale_of({"inmemory": 20.0, "hierarchical": 50.0})  # 50 s and 20 s an epoch
    report = analyse("g", two_mode_runs(), 1, scale, "hierarchical")
    assert report.target_val_acc == pytest.approx(0.80)
    by_mode = {s.mode: s for s in report.summaries}
    ns, hb, staged = by_mode["NS"], by_mode["HB"], by_mode["STAGED"]
    assert ns.epochs_to_target == [4, 6] and ns.epochs_vs_ns == pytest.approx(1.0) and ns.missed_bars is None
    assert ns.time_at_scale == pytest.approx(5 * 50.0)
    assert hb.epochs_to_target == [5, 10] and hb.epochs_vs_ns == pytest.approx(7.5 / 5)
    assert hb.time_at_scale == pytest.approx(7.5 * 20.0)
    assert hb.missed_bars == ["epochs 1.50x > 1.25x", "test -1.50 pt"]
    # the reused exact-semantics mode: NS's accuracy and epochs, its own row of compare (absent here)
    assert staged.epochs_to_target == ns.epochs_to_target and staged.vs_ns_points == 0 and staged.missed_bars == []
    assert staged.seconds_to_target == [None, None] and staged.reused_from == "NS"
    assert staged.scale_run == "staged" and staged.time_at_scale is None and "no row staged" in staged.scale_note
    assert by_mode["FULL"].scale_run is None and by_mode["FULL"].time_at_scale is None
    assert [g.mode for g in report.gaps] == ["HB", "FULL"]  # none for the reused mode: NS against itself


def test_markdown_gives_the_new_columns_and_says_what_is_missing():
    report = analyse("g", two_mode_runs(), 1, scale_of({"hierarchical": 50.0}), "hierarchical")
    text = dataset_markdown(report, 1)
    hb_row = next(line for line in text.splitlines() if line.startswith("| HB |"))
    assert "| 1.50x | 150 |" in hb_row and "no: epochs 1.50x > 1.25x; test -1.50 pt" in hb_row
    staged_row = next(line for line in text.splitlines() if line.startswith("| STAGED |"))
    assert "- (NS's runs)" in staged_row and "| yes |" in staged_row
    assert "STAGED: NS's runs" in text and "No time at scale" in text and "NS (no row inmemory)" in text
    assert "| reference |" in next(line for line in text.splitlines() if line.startswith("| NS |"))
    summary = scale_markdown([report])
    assert "| g | HB | 7.5 | 1.50x | 0.7950 | -1.50 | 20.0 | 150 |" in summary


def test_a_mode_that_never_reaches_the_target_has_no_time_at_scale():
    runs = two_mode_runs()
    runs["HB"] = [run("HB", 0, [0.5, 0.6]), run("HB", 1, [0.5, 0.6])]
    report = analyse("g", runs, 1, scale_of({"hierarchical": 50.0}), "hierarchical")
    hb = next(s for s in report.summaries if s.mode == "HB")
    assert hb.time_at_scale is None and hb.epochs_vs_ns is None
    assert "| never |" in next(line for line in dataset_markdown(report, 1).splitlines() if line.startswith("| HB |"))


def test_scale_header_states_the_formula_and_the_source(tmp_path):
    absent = scale_header(4.0, None, tmp_path / "compare.json", 1024)
    assert "megabatch_fraction = 1/R = 0.25" in absent and "epoch_batches / batches_per_s" in absent
    assert "is absent" in absent
    other_batch = scale_header(None, CompareEpochs("c.json", "2M nodes", 256, {}), tmp_path / "c.json", 1024)
    assert "\"auto\"" in other_batch and "c.json: 2M nodes" in other_batch and "not this bench's (1024)" in other_batch
