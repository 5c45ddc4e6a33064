"""bench/compare.py: a daemon that dies is a row of the report, not the bench's end."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import death, report, run_mode
from bench.harness import cgroup_available

ARGS = argparse.Namespace(nodes=1000, avg_degree=4, feat_dim=8, batch_size=64, fanouts="10,5", slots=2, superbatch=8,
                          staged_superbatch=512, sample_group=8, ranks=[1], warmup=0, batches=1, seconds=1,
                          train_steps=1)


def dying(script: str):
    """A daemon command that runs ``script`` instead of serving (it never makes its socket)."""
    return lambda config: [sys.executable, "-c", script]


def run(tmp_path: Path, script: str, mode: str, **kw: object) -> dict[str, object]:
    return run_mode(mode, tmp_path / "dataset", tmp_path, ARGS, 16 << 20, {}, command=dying(script), drop=False,
                    **kw)  # type: ignore[arg-type]


def test_a_daemon_that_exits_is_reported_with_its_code_and_last_line(tmp_path):
    result = run(tmp_path, "import sys; print('starting'); sys.exit('megabatch: error: the budget is too small')",
                 "inmemory")
    assert result["daemon_exit"] == 1
    assert result["failure"] == "died: exit 1: megabatch: error: the budget is too small"
    assert "batches_per_s" not in result
    text = report([result], ARGS, 16 << 20, 64 << 20, [500.0])
    row = next(line for line in text.splitlines() if line.startswith("| inmemory |"))
    assert row.endswith("| died: exit 1: megabatch: error: the budget is too small |")


def test_a_daemon_killed_by_a_signal_is_reported_by_the_signal(tmp_path):
    result = run(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "inmemory")
    assert result["failure"] == "died: killed by SIGKILL"


def test_a_daemon_that_exits_0_before_it_is_stopped_still_died(tmp_path):
    assert run(tmp_path, "pass", "inmemory")["failure"] == "died: exited (0) before the bench stopped it"


@pytest.mark.skipif(not cgroup_available(), reason="needs a writable cgroup v1 memory controller (root)")
def test_a_daemon_oom_killed_by_its_cgroup_is_reported_as_such(tmp_path):
    # 256 MiB written into a 48 MiB cgroup: the kernel's OOM killer ends it, and the cgroup counts the kill
    result = run(tmp_path, "x = b'x' * (256 << 20)", "exact", overhead=32 << 20)
    assert result["oom_kills"] >= 1
    assert result["failure"] == "died: OOM-killed (cgroup limit 48 MiB)"
    text = report([result], ARGS, 16 << 20, 64 << 20, [500.0])
    assert "| died: OOM-killed (cgroup limit 48 MiB) |" in text


def test_a_daemon_still_running_after_the_stop_or_failed_by_the_bench_is_told_apart(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("")
    # killed by the bench 120 s after its SIGTERM: it lived through the measurement, it did not stop
    assert death(-9, False, 0, None, log, None) == "slow stop: no exit within 120 s of SIGTERM (killed)"
    assert death(0, False, 0, None, log, "ConnectionClosed: gone") == "bench failed: ConnectionClosed: gone"
    assert death(0, False, 0, None, log, None) is None
    # an OOM kill is one whenever it came (the cgroup counted it)
    assert death(-9, False, 1, 768 << 20, log, None) == "died: OOM-killed (cgroup limit 768 MiB)"


def test_run_names_carry_the_aggregation_cache_and_the_report_pairs_them(tmp_path):
    from bench.compare import is_aggregated, run_parts, write_config

    assert run_parts("exact-unchecked-agg-r2") == ("exact", False, 2) and is_aggregated("exact-unchecked-agg-r2")
    assert run_parts("staged-agg") == ("staged", True, 1) and not is_aggregated("staged")
    args = argparse.Namespace(**vars(ARGS))
    write_config(tmp_path / "x.toml", "exact-agg", tmp_path, tmp_path / "s.sock", 1 << 30, args, {})
    assert "aggregation_cache = true" in (tmp_path / "x.toml").read_text()
    plain = {"mode": "exact", "batches_per_s": 2.0, "seeds_per_s": 2048.0, "rows_per_batch": 38000.0,
             "disk_bytes_per_batch": 150e6}
    agg = {"mode": "exact-agg", "batches_per_s": 3.0, "seeds_per_s": 3072.0, "rows_per_batch": 22000.0,
           "disk_bytes_per_batch": 60e6, "aggregate_disk_bytes_per_batch": 40e6,
           "estimated_rows": {"without": 37000, "with": 21000}}
    text = report([plain, agg], args, 1 << 30, 2 << 30, [690.0])
    row = next(line for line in text.splitlines() if line.startswith("| exact | 37000 / 21000"))
    assert "1.50x" in row and "38,000 / 22,000" in row


@pytest.mark.parametrize("out", ["bench/results/ab", "../ab", ".", ""])
def test_an_out_that_is_not_a_stem_is_refused_before_any_work(out, tmp_path):
    """``--out`` names a file stem under bench/results; a path used to fail with a traceback after the whole run."""
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "bench" / "compare.py"), "--out", out,
                           "--work", str(work)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("compare.py: error: --out: expected a file stem")
    assert not work.exists()
