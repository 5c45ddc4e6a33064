"""Soak test: a well-behaved trainer, a hog and a hostile client against one daemon for N minutes.

The daemon (``megabatch serve`` as a subprocess, on a small generated graph) runs with a short
``stall_timeout`` and ``idle_timeout`` (5 s), so evictions happen many times within the soak, and room
for four sessions. Three client threads share it for ``--minutes``:

  * good: trains epochs and evaluates, checking every batch against the dataset (``x`` rows of ``n_id``,
    seed labels, ``edge_index`` bounds, ``seq`` without gaps) and releasing it; it retries ``StartEpoch``
    (evaluating meanwhile) while another session owns the training pipeline, reconnects after ``busy``,
    and ends its session every few epochs as a finished training run does;
  * hog: takes the training pipeline, then either holds every slot without releasing one (evicted for
    ``stall_timeout``) or finishes an epoch and sits on the pipeline (evicted for ``idle_timeout``);
    it reconnects HOG_PAUSE (2 s) later and does it again; the eviction latencies are recorded;
  * hostile: one abuse per fresh connection, in shuffled rounds (about 30 s each): random bytes, huge
    declared lengths, valid msgpack of the wrong shape, messages out of order or from the wrong side, a
    StatsRequest flood it never reads, connections without a Hello (one at a time, and a burst past
    ``max_pending``), ``ftruncate``/writable reopen/hole punch on its sealed memfd and on the daemon's
    descriptor of it, a forged client name, absurd releases and credits, an abrupt close (RST). Each abuse
    checks the daemon's answer against proto/PROTOCOL.md (the error code, whether it closes).

A sampler reads /proc/PID of the daemon (VmRSS, descriptors, memfd descriptors, memfd mappings, threads)
and its Prometheus endpoint every 2 s. The start and end samples are taken with no client connected and
the daemon settled: start after a warm-up session (one epoch and both evaluations, so numba compilation,
lazily opened files and thread pools are behind it), end after the soak. Flat means: descriptors, memfd
descriptors and memfd mappings equal, at most ``THREAD_SLACK`` more threads, RSS grown by at most
``RSS_BOUND``. Exit 1 when the daemon died or did not exit 0 on SIGTERM, was not flat, served the good
client no batch or a wrong one, let a client break the segment's seals, or wrote a traceback, an error
line, a line outside its logger or a line a client forged to its log (started with ``JOURNAL_STREAM``
naming the log file, so every line carries its syslog priority); what is odd but not fatal (an eviction
of the good client, an abuse answered otherwise than proto/PROTOCOL.md says) is reported as a warning.

Writes bench/results/soak.{json,md}; the daemon's log (``soak-daemon.log``) stays in the work directory.

    .venv/bin/python bench/soak.py --minutes 5 [--nodes 100000] [--seed 0] [--work DIR]
    .venv/bin/python bench/soak.py --minutes 0.5 --nodes 20000      # a quick check
"""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import ROOT, generated_dataset, machine_description, scrape, stop_process, wait_for_socket
from bench.soak_clients import GoodClient, Hog
from bench.soak_hostile import Hostile
from bench.soak_report import evaluate, failures, metric_sum, read_log, render, slope_mib_per_minute, write_report
from bench.soak_sampler import Sample, Sampler, settled_sample
from bench.soak_settings import (
    AVG_DEGREE,
    CHECK_FEATURE_BYTES,
    CLOSE_WAIT,
    FEAT_DIM,
    RSS_BOUND,
    THREAD_SLACK,
    parse_args,
    write_config,
)
from loader.daemon.server import HANDSHAKE_TIMEOUT
from loader.format.dataset import open_dataset
from loader.sampling.inmemory import load_in_memory
from proto.client import ControlClient
from proto.sizes import format_size

# the pieces: soak_settings (constants, arguments, the daemon's config), soak_sampler (the daemon's /proc and
# metrics), soak_clients (the good trainer and the hog), soak_hostile (the hostile client), soak_report (the
# verdict and bench/results/soak.{json,md}); this file starts the daemon, runs them and collects the result
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mb-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    dataset = generated_dataset(work, args.nodes, AVG_DEGREE, FEAT_DIM, max(8, min(256, args.nodes // 3000)))
    manifest = open_dataset(dataset).manifest
    reference = None
    if manifest.num_nodes * manifest.row_bytes <= CHECK_FEATURE_BYTES:
        reference = load_in_memory(open_dataset(dataset))

    sock, port, config, log_path = work / "soak.sock", free_port(), work / "soak.toml", work / "soak-daemon.log"
    sock.unlink(missing_ok=True)  # a socket left by a killed run would look like a ready daemon
    write_config(config, dataset, sock, port, args.seed)
    result: dict[str, object] = {"machine": machine_description(), "args": asdict(args), "dataset": str(dataset),
                                 "config": config.read_text(), "log": str(log_path),
                                 "bounds": {"rss_bytes": RSS_BOUND, "thread_slack": THREAD_SLACK,
                                            "fds": 0, "memfd_fds": 0, "memfd_maps": 0}}
    with open(log_path, "w") as log:
        st = os.fstat(log.fileno())
        # the daemon's own journald format: every line, tracebacks too, starts with its syslog priority
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        started = time.monotonic()
        daemon = subprocess.Popen([PY, "-m", "loader.cli", "serve", "--config", str(config)],
                                  stdout=log, stderr=log, env=env, cwd=ROOT)
    stop = threading.Event()
    try:
        wait_for_socket(sock, daemon, timeout=600)
        result["startup_seconds"] = time.monotonic() - started
        print(f"soak: daemon {daemon.pid} ready in {result['startup_seconds']:.1f} s; warm-up session", flush=True)
        # warm-up, untimed: numba compilation, lazily opened files, thread pools, first megabatches
        warm = GoodClient(str(sock), reference, threading.Event(), args.seed)
        client = ControlClient.connect(str(sock), client="soak-warmup", timeout=60)
        try:
            warm.session(client, 1, evals=("val", "test"))
        finally:
            client.close()
        t0 = time.monotonic()
        start, start_settled = settled_sample(daemon, port, t0)
        start_metrics = scrape(port)
        if start is None:
            raise SystemExit("soak: the daemon died during the warm-up")
        result.update(warmup={"batches": dict(warm.batches), "errors": dict(warm.tally.errors)},
                      start=asdict(start), start_settled=start_settled)
        print(f"soak: start RSS {format_size(start.rss)}, {start.fds} fds, {start.memfd_maps} memfd maps, "
              f"{start.threads} threads; soaking {args.minutes:g} min", flush=True)

        good = GoodClient(str(sock), reference, stop, args.seed)
        hog = Hog(str(sock), stop)
        hostile = Hostile(str(sock), daemon.pid, stop, args.seed + 1)

        def progress(s: Sample) -> None:
            print(f"soak: t={s.t:5.0f} s RSS {format_size(s.rss)} fds {s.fds} memfd maps {s.memfd_maps} "
                  f"threads {s.threads} | good {sum(good.batches.values())} batches, hog evicted "
                  f"{len(hog.latency['stall']) + len(hog.latency['idle'])}x, hostile {hostile.connections} "
                  f"connections", flush=True)

        sampler = Sampler(daemon, port, t0, stop, progress)
        threads: list[threading.Thread] = [sampler, good, hog, hostile]
        for thread in threads:
            thread.start()
        stop.wait(args.minutes * 60)
        stop.set()
        soak_seconds = time.monotonic() - t0
        for thread in threads:
            thread.join(timeout=HANDSHAKE_TIMEOUT + 2 * CLOSE_WAIT + 60)
        stuck = [thread.name for thread in threads if thread.is_alive()]
        died = sampler.died_at is not None or daemon.poll() is not None
        end, end_settled = (None, False) if died else settled_sample(daemon, port, t0)
        end_metrics = scrape(port) if end is not None and daemon.poll() is None else {}
    finally:
        stop.set()
        exit_code = stop_process(daemon, 60)
    samples = sampler.samples
    result.update({
        "soak_seconds": soak_seconds, "daemon_died_at": sampler.died_at, "threads_stuck": stuck,
        "end": asdict(end) if end is not None else None, "end_settled": end_settled, "daemon_exit": exit_code,
        "max": {key: max([getattr(s, key) for s in samples] + [getattr(start, key)])
                for key in ("rss", "fds", "memfd_fds", "memfd_maps", "threads")},
        "rss_slope_mib_per_min": slope_mib_per_minute(samples),
        "samples": [asdict(s) for s in samples],
        "good": {"batches": dict(good.batches), "events": dict(good.tally.events),
                 "errors": dict(good.tally.errors), "error_examples": good.tally.examples},
        "hog": {"events": dict(hog.tally.events), "errors": dict(hog.tally.errors),
                "error_examples": hog.tally.examples,
                "eviction_latency_s": {k: {"count": len(v), "mean": float(np.mean(v)) if v else None,
                                           "max": max(v) if v else None} for k, v in hog.latency.items()}},
        "hostile": {"connections": hostile.connections, "unexpected": dict(hostile.unexpected),
                    "unexpected_examples": hostile.examples, "breaches": hostile.breaches,
                    "outcomes": {name: dict(c.most_common(8)) for name, c in sorted(hostile.outcomes.items())}},
        "metrics": {name: {"start": metric_sum(start_metrics, name), "end": metric_sum(end_metrics, name)}
                    for name in ("megabatch_batches_published_total", "megabatch_evictions_total",
                                 "megabatch_protocol_errors_total", "megabatch_refused_connections_total",
                                 "megabatch_accept_errors_total")},
        "daemon_log": read_log(log_path),
    })
    checks = evaluate(result, start, end)
    result["checks"] = [{"check": c, "status": s, "detail": d} for c, s, d in checks]
    report = render(result, start, end, checks)
    print(report)
    write_report(result, report)
    failed = failures(checks)
    print(f"soak: {'FAILED: ' + '; '.join(failed) if failed else 'passed'} (log: {log_path})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
