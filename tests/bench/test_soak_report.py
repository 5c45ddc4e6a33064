"""bench/soak_report.py: the soak's verdict, its markdown and its reading of the daemon log (no daemon)."""

from dataclasses import asdict, replace
from pathlib import Path

import pytest

from bench.soak_report import evaluate, failures, read_log, render, write_report
from bench.soak_sampler import Sample
from bench.soak_settings import FORGED_MARK, RSS_BOUND, THREAD_SLACK, SoakArgs, parse_args

START = Sample(t=0.0, rss=300 << 20, rss_anon=200 << 20, rss_file=90 << 20, rss_shmem=10 << 20, hwm=310 << 20,
               fds=20, memfd_fds=0, memfd_maps=0, threads=35, clients=0.0)


def soak_result(**overrides: object) -> dict[str, object]:
    """What ``bench/soak.py``'s main collects for a clean soak, with ``overrides`` replacing its sections."""
    latency = {"count": 2, "mean": 5.1, "max": 5.3}
    result: dict[str, object] = {
        "machine": "test machine", "args": asdict(SoakArgs(minutes=0.5, nodes=20_000)), "soak_seconds": 30.0,
        "start_settled": True, "end_settled": True, "daemon_died_at": None, "daemon_exit": 0, "threads_stuck": [],
        "max": {"rss": 310 << 20, "fds": 42, "memfd_fds": 9, "memfd_maps": 3, "threads": 40},
        "rss_slope_mib_per_min": 0.5,
        "good": {"batches": {"train": 100, "val": 20}, "events": {"epochs": 2}, "errors": {}, "error_examples": {}},
        "hog": {"events": {"evicted (stall)": 2, "evicted (idle)": 2}, "errors": {}, "error_examples": {},
                "eviction_latency_s": {"stall": latency, "idle": latency}},
        "hostile": {"connections": 50, "unexpected": {}, "unexpected_examples": {}, "breaches": [],
                    "outcomes": {"random bytes before Hello": {"bad_message, then eof": 3}}},
        "metrics": {"megabatch_evictions_total": {"start": {}, "end": {'{reason="stall"}': 2.0}},
                    **{name: {"start": {"total": 1.0}, "end": {"total": 1.0}}
                       for name in ("megabatch_batches_published_total", "megabatch_protocol_errors_total",
                                    "megabatch_refused_connections_total", "megabatch_accept_errors_total")}},
        "daemon_log": {"levels": {"info": 400, "warning": 30}, "tracebacks": 0, "forged_lines": 0,
                       "first_bad_lines": [], "kinds": {"warning": {"megabatch: session N: evicted": 30}}},
    }
    result.update(overrides)
    return result


def statuses(result: dict[str, object], end: Sample | None = START) -> dict[str, str]:
    return {what: status for what, status, _ in evaluate(result, START, end)}


def test_a_clean_soak_passes_every_check():
    checks = evaluate(soak_result(), START, replace(START, rss=START.rss + (1 << 20), threads=START.threads + 1))
    assert {status for _, status, _ in checks} == {"ok"}
    assert failures(checks) == []


@pytest.mark.parametrize(("end", "check"), [
    (replace(START, rss=START.rss + RSS_BOUND + 1), f"RSS end - start <= {RSS_BOUND >> 20} MiB"),
    (replace(START, fds=START.fds + 1), "open descriptors flat"),
    (replace(START, memfd_fds=1), "memfd descriptors flat"),
    (replace(START, memfd_maps=1), "memfd mappings flat"),
    (replace(START, threads=START.threads + THREAD_SLACK + 1), f"threads within +{THREAD_SLACK}"),
])
def test_a_daemon_that_is_not_flat_fails_by_what_grew(end, check):
    checks = evaluate(soak_result(), START, end)
    assert failures(checks) == [check]


def test_growth_up_to_the_bounds_is_flat():
    end = replace(START, rss=START.rss + RSS_BOUND, threads=START.threads + THREAD_SLACK)
    assert failures(evaluate(soak_result(), START, end)) == []


def test_a_dead_daemon_fails_and_has_no_end_sample_to_compare():
    result = soak_result(daemon_died_at=12.0, daemon_exit=-9)
    got = statuses(result, end=None)
    assert got["daemon alive through the soak"] == "FAIL"
    assert got["daemon exit code 0 after SIGTERM"] == "FAIL"
    assert not any(what.startswith(("RSS", "open descriptors", "threads")) for what in got)
    checks = evaluate(result, START, None)
    assert "died at t=12.0" in dict((c, d) for c, _, d in checks)["daemon alive through the soak"]


def test_a_wrong_batch_fails_but_an_evicted_good_client_only_warns():
    good = {"batches": {"train": 10}, "events": {}, "errors": {"wrong batch": 1, "daemon error timeout": 2},
            "error_examples": {}}
    got = statuses(soak_result(good=good))
    assert got["good client never served a wrong batch (x, y, edge_index, seq, counts)"] == "FAIL"
    assert got["good client never evicted"] == "warn"
    assert got["good client saw no other error"] == "ok"
    assert failures(evaluate(soak_result(good=good), START, START)) == [
        "good client never served a wrong batch (x, y, edge_index, seq, counts)"]


def test_a_good_client_served_nothing_fails():
    good = {"batches": {}, "events": {}, "errors": {}, "error_examples": {}}
    assert failures(evaluate(soak_result(good=good), START, START)) == ["good client served batches"]


def test_broken_seals_fail_and_undocumented_answers_warn():
    hostile = {"connections": 5, "unexpected": {"huge declared length": 2}, "unexpected_examples": {},
               "breaches": ["pwrite"], "outcomes": {}}
    got = statuses(soak_result(hostile=hostile))
    assert got["seals held against every memfd attack"] == "FAIL"
    assert got["every abuse answered as documented"] == "warn"


def test_a_hog_never_evicted_for_idle_warns():
    hog = {"events": {}, "errors": {}, "error_examples": {},
           "eviction_latency_s": {"stall": {"count": 1, "mean": 5.0, "max": 5.0},
                                  "idle": {"count": 0, "mean": None, "max": None}}}
    checks = evaluate(soak_result(hog=hog), START, START)
    assert statuses(soak_result(hog=hog))["hog evicted for stall and for idle"] == "warn"
    assert failures(checks) == []


@pytest.mark.parametrize("log", [
    {"levels": {"info": 1, "error": 1}, "tracebacks": 0, "forged_lines": 0},
    {"levels": {"info": 1}, "tracebacks": 1, "forged_lines": 0},
    {"levels": {"info": 1, "unprefixed": 2}, "tracebacks": 0, "forged_lines": 0},
    {"levels": {"info": 1}, "tracebacks": 0, "forged_lines": 1},
])
def test_a_bad_daemon_log_fails(log):
    assert len(failures(evaluate(soak_result(daemon_log={"first_bad_lines": [], "kinds": {}, **log}), START, START))) \
        == 1


def test_an_unsettled_daemon_only_warns():
    assert statuses(soak_result(end_settled=False))[
        "daemon settled (no client, stable descriptors) for the start and end samples"] == "warn"


def test_read_log_counts_priorities_tracebacks_and_forged_lines(tmp_path: Path):
    log = tmp_path / "daemon.log"
    log.write_text("\n".join([
        "<6>megabatch: session 1: connected",
        "<4>megabatch: session 12: evicted (stall)",
        "<4>megabatch: session 13: evicted (stall)",
        "<3>megabatch: error: boom",
        "Traceback (most recent call last):",
        f"<6>megabatch: {FORGED_MARK} session 1: root connected",
    ]) + "\n")
    got = read_log(log)
    assert got["levels"] == {"info": 2, "warning": 2, "error": 1, "unprefixed": 1}
    assert got["tracebacks"] == 1
    assert got["forged_lines"] == 1
    assert got["kinds"]["warning"] == {"megabatch: session N: evicted (stall)": 2}  # type: ignore[index]
    assert got["first_bad_lines"] == ["<3>megabatch: error: boom", "Traceback (most recent call last):"]


def test_render_and_write_report(tmp_path: Path):
    end = replace(START, rss=START.rss + (2 << 20))
    checks = evaluate(soak_result(), START, end)
    text = render(soak_result(), START, end, checks)
    assert "| RSS | 300.0 MiB | 302.0 MiB | 310.0 MiB | +2.0 MiB | <= +64 MiB |" in text
    assert "| open descriptors flat | ok | 20 -> 20 |" in text
    assert "evictions {reason=\"stall\"} 2" in text
    write_report(soak_result(), text, tmp_path / "results")
    assert (tmp_path / "results" / "soak.md").read_text() == text + "\n"
    assert '"machine": "test machine"' in (tmp_path / "results" / "soak.json").read_text()


def test_the_command_line_keeps_its_defaults_and_json_keys():
    assert asdict(parse_args("soak", [])) == {"minutes": 5.0, "nodes": 100_000, "seed": 0, "work": None}
    assert parse_args("soak", ["--minutes", "0.5", "--nodes", "20000", "--work", "/w"]) == \
        SoakArgs(minutes=0.5, nodes=20_000, seed=0, work="/w")
