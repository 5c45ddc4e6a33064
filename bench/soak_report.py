"""The soak's report: the daemon's log read by syslog priority, the pass/fail verdict (``evaluate``: a list of
checks, each "ok", "warn" or "FAIL"; ``failures``), the markdown (``render``) and bench/results/soak.{json,md}."""

import collections
import json
import re
from pathlib import Path

import numpy as np

from bench.harness import RESULTS
from bench.soak_sampler import Sample
from bench.soak_settings import (
    BATCH_SIZE,
    FANOUTS,
    FEAT_DIM,
    FORGED_MARK,
    IDLE_TIMEOUT,
    MAX_CLIENTS,
    RSS_BOUND,
    SLOTS,
    STALL_TIMEOUT,
    THREAD_SLACK,
)
from proto.sizes import format_size


def read_log(path: Path) -> dict[str, object]:
    """Lines by syslog priority (the daemon prefixes them when JOURNAL_STREAM names its stderr), the
    warning and error lines grouped with their numbers masked, tracebacks, and forged lines."""
    names = {"2": "critical", "3": "error", "4": "warning", "6": "info", "7": "debug"}
    levels: collections.Counter[str] = collections.Counter()
    kinds: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    tracebacks, forged = 0, 0
    bad: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"<(\d)>", line)
        level = names.get(m.group(1), "other") if m else "unprefixed"
        levels[level] += 1
        body = line[m.end():] if m else line
        tracebacks += "Traceback (most recent call last)" in line
        forged += body.startswith(FORGED_MARK) or body.startswith(f"megabatch: {FORGED_MARK}")
        if level in ("critical", "error", "warning", "unprefixed"):
            kinds[level][re.sub(r"\d+", "N", body)[:160]] += 1
        if level in ("critical", "error", "unprefixed") and len(bad) < 20:
            bad.append(line[:300])
    return {"levels": dict(levels), "tracebacks": tracebacks, "forged_lines": forged, "first_bad_lines": bad,
            "kinds": {level: dict(c.most_common(15)) for level, c in kinds.items()}}


def metric_sum(metrics: dict[str, float], name: str) -> dict[str, float]:
    """Samples of counter ``name`` by label set (``_created`` timestamps left out)."""
    return {key[len(name):] or "total": value for key, value in metrics.items()
            if key.startswith(name) and (key == name or key.startswith(name + "{"))}


def slope_mib_per_minute(samples: list[Sample]) -> float | None:
    if len(samples) < 3:
        return None
    t = np.array([s.t for s in samples])
    rss = np.array([s.rss for s in samples], dtype=np.float64)
    return float(np.polyfit(t, rss, 1)[0]) * 60 / 2**20


Check = tuple[str, str, str]
"""(what, "ok" / "warn" / "FAIL", detail)."""


def evaluate(result: dict[str, object], start: Sample, end: Sample | None) -> list[Check]:
    def check(what: str, passed: bool, detail: str = "", severity: str = "FAIL") -> Check:
        return what, "ok" if passed else severity, detail

    good, hog, hostile = (result[k] for k in ("good", "hog", "hostile"))
    log = result["daemon_log"]
    assert isinstance(good, dict) and isinstance(hog, dict) and isinstance(hostile, dict) and isinstance(log, dict)
    levels = log["levels"]
    wrong = sum(v for k, v in good["errors"].items() if k in ("wrong batch", "seq gap", "end count", "SlotError"))
    evicted_good = sum(v for k, v in good["errors"].items() if k == "daemon error timeout")
    other_good = sum(good["errors"].values()) - wrong - evicted_good
    checks = [
        check("daemon alive through the soak", result["daemon_died_at"] is None and end is not None,
              f"died at t={result['daemon_died_at']}" if result["daemon_died_at"] is not None else ""),
        check("daemon exit code 0 after SIGTERM", result["daemon_exit"] == 0, f"exit {result['daemon_exit']}"),
        check("client threads ended", not result["threads_stuck"], str(result["threads_stuck"])),
        check("daemon settled (no client, stable descriptors) for the start and end samples",
              bool(result["start_settled"] and result["end_settled"]), "", "warn"),
    ]
    if end is not None:
        growth = end.rss - start.rss
        checks += [
            check(f"RSS end - start <= {format_size(RSS_BOUND)}", growth <= RSS_BOUND,
                  f"{format_size(start.rss)} -> {format_size(end.rss)} ({growth / 2**20:+.1f} MiB)"),
            check("open descriptors flat", end.fds <= start.fds, f"{start.fds} -> {end.fds}"),
            check("memfd descriptors flat", end.memfd_fds <= start.memfd_fds, f"{start.memfd_fds} -> {end.memfd_fds}"),
            check("memfd mappings flat", end.memfd_maps <= start.memfd_maps, f"{start.memfd_maps} -> {end.memfd_maps}"),
            check(f"threads within +{THREAD_SLACK}", end.threads <= start.threads + THREAD_SLACK,
                  f"{start.threads} -> {end.threads}"),
        ]
    served = sum(good["batches"].values())
    checks += [
        check("good client served batches", served > 0, f"{served} batches"),
        check("good client never served a wrong batch (x, y, edge_index, seq, counts)", wrong == 0, f"{wrong}"),
        check("good client never evicted", evicted_good == 0, f"{evicted_good}x", "warn"),
        check("good client saw no other error", other_good == 0,
              "; ".join(f"{k}: {v}" for k, v in good["errors"].items()), "warn"),
        check("hog evicted for stall and for idle",
              all(hog["eviction_latency_s"][k]["count"] for k in ("stall", "idle")),
              ", ".join(f"{k} {v['count']}x" for k, v in hog["eviction_latency_s"].items()), "warn"),
        check("hog saw nothing unexpected", not hog["errors"],
              "; ".join(f"{k}: {v}" for k, v in hog["errors"].items()), "warn"),
        check("seals held against every memfd attack", not hostile["breaches"], "; ".join(hostile["breaches"][:5])),
        check("every abuse answered as documented", not hostile["unexpected"],
              "; ".join(f"{k}: {v}x" for k, v in hostile["unexpected"].items()), "warn"),
        check("no traceback, error or unprefixed line in the daemon log",
              not (log["tracebacks"] or levels.get("error") or levels.get("critical") or levels.get("unprefixed")),
              f"{log['tracebacks']} tracebacks, {levels.get('error', 0)} error, {levels.get('unprefixed', 0)} "
              f"unprefixed lines"),
        check("no log line forged by a client", log["forged_lines"] == 0, f"{log['forged_lines']}"),
    ]
    return checks


def failures(checks: list[Check]) -> list[str]:
    """The verdict: the checks that failed (the soak passed when there is none; warnings do not fail it)."""
    return [c for c, s, _ in checks if s == "FAIL"]


def render(result: dict[str, object], start: Sample, end: Sample | None, checks: list[Check]) -> str:
    good, hog, hostile, log, mx = (result[k] for k in ("good", "hog", "hostile", "daemon_log", "max"))
    metrics = result["metrics"]
    assert isinstance(good, dict) and isinstance(hog, dict) and isinstance(hostile, dict)
    assert isinstance(log, dict) and isinstance(mx, dict) and isinstance(metrics, dict)
    args = result["args"]
    assert isinstance(args, dict)
    soak = float(result["soak_seconds"])  # type: ignore[arg-type]
    slope = result["rss_slope_mib_per_min"]

    def mib(n: int) -> str:
        return f"{n / 2**20:.1f} MiB"

    def delta(name: str) -> str:
        m = metrics[name]
        keys = sorted(set(m["start"]) | set(m["end"]))
        return ", ".join(f"{k} {m['end'].get(k, 0) - m['start'].get(k, 0):g}" for k in keys
                         if m["end"].get(k, 0) != m["start"].get(k, 0)) or "none"

    rows = [("RSS", mib(start.rss), mib(end.rss) if end else "-", mib(mx["rss"]),
             f"{(end.rss - start.rss) / 2**20:+.1f} MiB" if end else "-", f"<= +{format_size(RSS_BOUND)}")]
    for key, bound in (("fds", "+0"), ("memfd_fds", "+0"), ("memfd_maps", "+0"), ("threads", f"+{THREAD_SLACK}")):
        rows.append((key, str(getattr(start, key)), str(getattr(end, key)) if end else "-", str(mx[key]),
                     f"{getattr(end, key) - getattr(start, key):+d}" if end else "-", bound))
    lat = hog["eviction_latency_s"]
    lines = [
        f"machine: {result['machine']}",
        f"soak: {soak / 60:.1f} min after a warm-up session; graph {args['nodes']:,} nodes x {FEAT_DIM} features, "
        f"batch {BATCH_SIZE}, fanouts {list(FANOUTS)}, {SLOTS} slots, max_clients {MAX_CLIENTS}, stall_timeout "
        f"{STALL_TIMEOUT:g} s, idle_timeout {IDLE_TIMEOUT:g} s, seed {args['seed']}",
        "",
        "| daemon (no client connected) | start | end | max during soak | end - start | bound |",
        "|---|---|---|---|---|---|",
        *(f"| {' | '.join(r)} |" for r in rows),
        "",
        f"RSS detail at end: anon {mib(end.rss_anon)}, file {mib(end.rss_file)}, shmem {mib(end.rss_shmem)}; peak "
        f"(VmHWM) {mib(end.hwm)}; RSS trend over the soak {slope:+.1f} MiB/min" if end and slope is not None
        else "RSS detail: -",
        "",
        f"- good client: {sum(good['batches'].values())} batches "
        f"({', '.join(f'{k} {v}' for k, v in sorted(good['batches'].items()))}); "
        + ", ".join(f"{k} {v}" for k, v in sorted(good["events"].items()))
        + f"; errors: {', '.join(f'{k} {v}' for k, v in good['errors'].items()) or 'none'}",
        f"- hog: evicted for stall {lat['stall']['count']}x (latency mean/max "
        f"{fmt_s(lat['stall']['mean'])}/{fmt_s(lat['stall']['max'])} vs {STALL_TIMEOUT:g} s), for idle "
        f"{lat['idle']['count']}x ({fmt_s(lat['idle']['mean'])}/{fmt_s(lat['idle']['max'])} vs {IDLE_TIMEOUT:g} s); "
        + ", ".join(f"{k} {v}" for k, v in sorted(hog["events"].items()))
        + f"; errors: {', '.join(f'{k} {v}' for k, v in hog['errors'].items()) or 'none'}",
        f"- hostile: {hostile['connections']} connections, {sum(hostile['unexpected'].values())} answered "
        f"otherwise than documented",
        f"- daemon metrics over the soak: batches published {delta('megabatch_batches_published_total')}; evictions "
        f"{delta('megabatch_evictions_total')}; protocol errors {delta('megabatch_protocol_errors_total')}; "
        f"refused connections {delta('megabatch_refused_connections_total')}; accept errors "
        f"{delta('megabatch_accept_errors_total')}",
        f"- daemon exit code after SIGTERM: {result['daemon_exit']}; log lines: "
        + ", ".join(f"{k} {v}" for k, v in sorted(log["levels"].items()))
        + f", tracebacks {log['tracebacks']}",
        "",
        "| abuse (one per connection) | count | what the daemon did (most frequent) |",
        "|---|---|---|",
    ]
    for name, outcomes in hostile["outcomes"].items():
        top = "; ".join(f"{o} ({n})" for o, n in list(outcomes.items())[:3]).replace("|", "/")
        flag = f" **{hostile['unexpected'][name]} unexpected**" if name in hostile["unexpected"] else ""
        lines.append(f"| {name} | {sum(outcomes.values())} | {top}{flag} |")
    lines += ["", "| check | status | detail |", "|---|---|---|"]
    lines += [f"| {c} | {s} | {d.replace('|', '/')} |" for c, s, d in checks]
    for level in ("error", "critical", "unprefixed", "warning"):
        kinds = log["kinds"].get(level)
        if kinds:
            lines += ["", f"daemon log, {level} lines by kind (numbers masked):"]
            lines += [f"    {n:6d}  {text}" for text, n in kinds.items()]
    return "\n".join(lines)


def fmt_s(value: object) -> str:
    return "-" if value is None else f"{float(value):.1f} s"  # type: ignore[arg-type]


def write_report(result: dict[str, object], text: str, directory: Path = RESULTS) -> None:
    """``directory/soak.json`` (``result``) and ``directory/soak.md`` (``text``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "soak.json").write_text(json.dumps(result, indent=2, default=str))
    (directory / "soak.md").write_text(text + "\n")
