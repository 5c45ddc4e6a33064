"""Every loader mode side by side on one out-of-core graph, in one run: the comparative benchmark.

On a generated graph whose features are several times the memory budget (default 2M nodes, ~40M
edges, 256-dim float32: 2 GiB of features) each mode (hierarchical, exact, static, mmap, inmemory)
runs as its own ``megabatch serve``: the page cache dropped first, the daemon in a cgroup v1 memory
limit of budget + the stated daemon overhead (where available; ``inmemory``, the upper bound,
runs without a limit since it holds everything). Per mode:

  1. loader-only: a consumer that touches every feature byte of each batch, for ``--batches``
     batches or ``--seconds`` seconds of the first epoch, whichever ends first, after ``--warmup``
     untimed batches (numba compilation, cold caches): batches/s and seeds/s (the seeds the batches
     delivered: a mode whose batches are not all full trains on fewer), the epoch time that rate
     implies, feature MB/s delivered;
  2. disk bytes the daemon read meanwhile (/proc/PID/io), feature-cache miss ratio (exact
     and static share the trace: same seeds, same batches), neighbour-cache hit ratio, sampler
     seconds per batch and the changeset planner's cost relative to sampling;
  3. GraphSAGE for ``--train-steps`` steps through the daemon: samples/s and data-wait;
  4. the daemon's peak RSS, the cgroup's peak (page cache included: it fills up to the limit and is
     reclaimed there, which is not a failure) and its OOM kills (which are).

A daemon that dies (OOM-killed, a signal, a non-zero exit: its log's last line), that does not stop within
120 s of the bench's SIGTERM, or against which the bench's measurement fails, is reported in its row
(column "daemon", with what was measured before) and the bench goes on with the next mode.

With ``--ranks 1,2`` each mode also serves a job of 2 ranks (rows ``<mode>-r2``): 2 consumers join one
job on the daemon and take their pieces at once (every run of the bench sizes its slots for the largest
job, so the memory plans, caches included, are the same), and the report gives the job's loader batches/s over
all ranks and the disk bytes per delivered batch, each over the single trainer's (the training step is
measured for single trainers only; 2-rank training is in bench/accuracy_bench.py, mode HB2).

Evaluation batches are as large as training batches (``eval_batch_size = --batch-size``): no
evaluation runs here, and slots sized for the 1024-seed default would take every mode's budget
(42 MiB a slot on the 500k-node graph with 256-seed batches).

Ratios are to ``mmap`` (what PyG/DGL over np.memmap do) and to ``inmemory``, per batch and per seed. With
``--read-checks both`` (the default) hierarchical, exact and static also run a second time with
``[io] check_reads = false`` (rows ``<mode>-unchecked``), and the report gives what the read checks cost: the
checked run's loader batches/s over the unchecked one's. Two daemon runs a minute apart on a shared virtual disk
differ by more than the few percent measured, so for the row-granular modes (exact, static) the report also
gives bench/read_check_bench.py's replay of their reads, checked and unchecked interleaved batch by
batch (``--replay-batches``, default 200; 0 skips it).

With ``--aggregation-cache`` every run has a twin ``<run>-agg`` with ``[sampler] aggregation_cache = true`` (the
dataset's mean cache is built first where it has none), and the report sets each pair side by side: the cost
model's rows per batch (the daemon's startup line) against the rows delivered, disk bytes per batch (x_agg's
share), batches/s, seeds/s and training samples/s. Writes bench/results/compare.{json,md,png} (``--out`` names
another stem).

    .venv/bin/python bench/compare.py [--nodes 2000000] [--budget 448M] [--modes ...] [--ranks 1,2] [--work DIR]
"""

import argparse
import gc
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.compare_report import AGGREGATED, CHECKED_MODES, UNCHECKED, chart, is_aggregated, report, run_parts
from bench.harness import (
    DAEMON_OVERHEAD,
    RESULTS,
    drop_caches,
    generated_dataset,
    join_before_exec,
    machine_description,
    memory_cgroup,
    process_cpu_seconds,
    process_read_bytes,
    scrape,
    sequential_rates,
    sh,
    stop_process,
    wait_for_socket,
    warn,
)
from bench.read_check_bench import replay_read_checks
from loader.daemon.fullgraph.staged import STAGED_SUPERBATCH
from loader.format.dataset import open_dataset
from proto.client import ControlClient, JobMember
from proto.messages import BatchReady, Credit, EpochEnd, Release, StartEpoch
from proto.sizes import format_size, parse_size

PY = sys.executable
MODES = ("hierarchical", "exact", "static", "staged", "hybrid", "mmap", "inmemory")
ESTIMATE = re.compile(r"fetches about ([\d,]+) rows \(([^)]+)\) without it, ([\d,]+) \(([^)]+)\) with it")
"""The daemon's startup line pricing the aggregation cache (``loader.daemon.aggregate_rows``)."""
METRICS_PORT = 9461


def write_config(path: Path, run: str, dataset: Path, sock: Path, budget: int, args: argparse.Namespace,
                 caches: dict[str, int]) -> None:
    mode, checked, _ = run_parts(run)
    cache_lines = "".join(f"{key} = {value}\n" for key, value in caches.items())
    superbatch = args.staged_superbatch if mode == "staged" else args.superbatch
    staging = path.parent / "staging"
    staging.mkdir(exist_ok=True)
    path.write_text(f"""[dataset]
path = "{dataset}"
[loader]
mode = "{mode}"
[fullgraph]
superbatch = {superbatch}
sample_group = {args.sample_group}
staging_dir = "{staging}"
{cache_lines}[memory]
budget = {budget}
[hierarchy]
megabatch_fraction = "auto"
passes = 1
[sampler]
batch_size = {args.batch_size}
fanouts = [{args.fanouts}]
eval_fanouts = [{args.fanouts}]
eval_batch_size = {args.batch_size}
aggregation_cache = {"true" if is_aggregated(run) else "false"}
[io]
direct_io = true
read_threads = 4
check_reads = {"true" if checked and mode != "mmap" else "false"}
[publisher]
slots = {args.slots}
[server]
socket = "{sock}"
max_clients = {max(args.ranks)}
[metrics]
port = {METRICS_PORT}
""")


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


class RankConsumer:
    """One client's share of the first epoch: touches every feature byte of each batch (x_agg's too)."""

    def __init__(self, sock: Path, job: JobMember | None) -> None:
        self.client = ControlClient.connect(str(sock), client="compare", timeout=None, job=job, aggregation=True)
        self.client.send(Credit(count=self.client.welcome.slots.count))
        self.epoch_batches = -1
        self.ended = False

    def consume(self, batches: int, seconds: float) -> tuple[int, int, int]:
        """(batches, seeds, feature bytes) of up to ``batches`` batches or ``seconds`` seconds."""
        count = seeds = nbytes = 0
        t0 = time.perf_counter()
        while not self.ended and count < batches and time.perf_counter() - t0 < seconds:
            msg = self.client.recv(timeout=900)
            if isinstance(msg, EpochEnd):
                self.ended = True
                break
            assert isinstance(msg, BatchReady)
            self.epoch_batches = msg.num_batches
            arrays = self.client.read_batch(msg).arrays
            rows = [arrays[name] for name in ("x", "x_agg") if name in arrays]
            for x in rows:
                float(x.sum(dtype=np.float64))
                nbytes += x.nbytes
            count += 1
            seeds += len(arrays["y"])  # a mode's batches need not all be full: its rate in seeds is what trains
            del rows, arrays
            self.client.send(Release(slot=msg.slot, seq=msg.seq))
        return count, seeds, nbytes


class LoaderOnly:
    """The first epoch consumed by one trainer, or by the ``ranks`` ranks of one job at once."""

    def __init__(self, sock: Path, ranks: int = 1) -> None:
        self.consumers = [RankConsumer(sock, JobMember("compare", rank, ranks, ranks) if ranks > 1 else None)
                          for rank in range(ranks)]
        for consumer in self.consumers:
            consumer.client.send(StartEpoch(epoch=0))
        self.pool = ThreadPoolExecutor(ranks)

    @property
    def epoch_batches(self) -> int:
        """Batches of the whole epoch, over every rank."""
        return self.consumers[0].epoch_batches * len(self.consumers)

    def consume(self, batches: int, seconds: float) -> tuple[int, int, int, float]:
        """(batches, seeds, feature bytes, seconds) of up to ``batches`` batches (over all ranks) or ``seconds``
        seconds."""
        t0 = time.perf_counter()
        share = -(-batches // len(self.consumers))
        done = list(self.pool.map(lambda c: c.consume(share, seconds), self.consumers))
        return sum(d[0] for d in done), sum(d[1] for d in done), sum(d[2] for d in done), time.perf_counter() - t0

    def close(self) -> None:
        self.pool.shutdown()
        for consumer in self.consumers:
            consumer.client.close()
        # a view of a slot kept alive by a reference cycle would keep the daemon's memfd pages (charged
        # to the daemon's cgroup) mapped into the next mode's measurement
        gc.collect()


def serve_command(config: Path) -> list[str]:
    """The daemon a run measures: ``megabatch serve`` of its config."""
    return [PY, "-m", "loader.cli", "serve", "--config", str(config)]


def last_line(log: Path) -> str:
    """The last non-blank line of a daemon's log (its error, where it failed with one), at most 200 characters."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def death(returncode: int, exited_early: bool, oom_kills: int, limit: int | None, log: Path, error: str | None
          ) -> str | None:
    """How a daemon's run went wrong, for its table row, or None when it ran and stopped cleanly (exit 0 on the
    bench's SIGTERM): "died: " an OOM kill by its cgroup, a signal, an exit code with its log's last line, or an exit
    before the bench stopped it; "slow stop: " still running 120 s after the SIGTERM (the bench then killed it);
    "bench failed: " the bench's own failure against a daemon that lived. ``exited_early``: it had exited before
    the bench's SIGTERM."""
    if oom_kills:
        return f"died: OOM-killed (cgroup limit {format_size(limit)})" if limit else "died: OOM-killed"
    if returncode < 0 and not exited_early:
        return "slow stop: no exit within 120 s of SIGTERM (killed)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died: killed by {name}"
    if returncode:
        line = last_line(log)
        return f"died: exit {returncode}" + (f": {line}" if line else "")
    if exited_early:
        return "died: exited (0) before the bench stopped it"
    if error is not None:
        return f"bench failed: {error}"
    return None


def run_mode(run: str, dataset: Path, work: Path, args: argparse.Namespace, budget: int,
             caches: dict[str, int], *, command: Callable[[Path], list[str]] = serve_command,
             overhead: int = DAEMON_OVERHEAD, drop: bool = True) -> dict[str, object]:
    """One daemon of run ``run`` (a mode, or ``<mode>-unchecked``) measured as the module docstring says.

    A daemon that dies (OOM-killed by its cgroup, a signal, a non-zero exit), does not stop, or a measurement
    that fails against it, gives a result whose ``failure`` says how (``death``) beside what was measured before;
    the bench goes on with the next run. ``command`` makes the daemon's command line from its config (tests inject one
    that dies), ``overhead`` is what the cgroup allows beyond ``budget``, ``drop`` drops the page cache first."""
    mode, _, ranks = run_parts(run)
    sock, config, log_path = work / f"{run}.sock", work / f"{run}.toml", work / f"{run}.log"
    sock.unlink(missing_ok=True)
    data_budget = budget if mode != "inmemory" else 64 << 30
    write_config(config, run, dataset, sock, data_budget, args, caches)
    if drop:
        drop_caches()
    limit = budget + overhead
    group = memory_cgroup(limit, f"megabatch-{run}") if mode != "inmemory" else None
    error: str | None = None
    with open(log_path, "w") as log:
        started = time.perf_counter()
        daemon = subprocess.Popen(command(config), preexec_fn=join_before_exec(group), stderr=log, stdout=log)
        out: dict[str, object] = {"mode": run, "cgroup_limit": limit if group else None}
        try:
            wait_for_socket(sock, daemon)
            out["startup_seconds"] = time.perf_counter() - started
            consumer = LoaderOnly(sock, ranks)
            try:
                # the first batches pay numba compilation and the caches' cold start: not timed
                consumer.consume(args.warmup, args.seconds)
                before, io_before = scrape(METRICS_PORT), process_read_bytes(daemon.pid)
                cpu_before = process_cpu_seconds(daemon.pid)
                batches, seeds, nbytes, seconds = consumer.consume(args.batches, args.seconds)
                cpu_after = process_cpu_seconds(daemon.pid)
                after, io_after = scrape(METRICS_PORT), process_read_bytes(daemon.pid)
            finally:
                consumer.close()
            epoch_batches = consumer.epoch_batches
            feat_hit = delta(after, before, 'megabatch_feature_cache_lookups_total{result="hit"}')
            feat_miss = delta(after, before, 'megabatch_feature_cache_lookups_total{result="miss"}')
            feat_fill = delta(after, before, 'megabatch_feature_cache_lookups_total{result="fill"}')
            feat_resident = delta(after, before, 'megabatch_feature_cache_lookups_total{result="resident"}')
            nb_hit = delta(after, before, 'megabatch_neighbor_cache_lookups_total{result="hit"}')
            nb_miss = delta(after, before, 'megabatch_neighbor_cache_lookups_total{result="miss"}')
            sampler = delta(after, before, 'megabatch_stage_busy_seconds_total{stage="sampler"}')
            planner = delta(after, before, 'megabatch_stage_busy_seconds_total{stage="planner"}')
            reader = delta(after, before, 'megabatch_stage_busy_seconds_total{stage="reader"}')
            busy = {stage: delta(after, before, f'megabatch_stage_busy_seconds_total{{stage="{stage}"}}')
                    for stage in ("sampler", "planner", "staging", "rows", "publisher", "reader", "assembler")}
            staged_written = sum(delta(after, before, f'megabatch_staging_written_bytes_total{{kind="{kind}"}}')
                                 for kind in ("rows", "edges"))
            # the partition reader's bytes: the hierarchical mode's training reads of both files
            reader_bytes = sum(delta(after, before, f'megabatch_disk_read_bytes_total{{file="{file}",purpose="train"}}')
                               for file in ("features", "indices"))
            rate = batches / seconds if seconds > 0 else 0.0
            row_bytes = args.feat_dim * 4
            served = delta(after, before, 'megabatch_feature_bytes_served_total{purpose="train"}')
            aggregate_bytes = delta(after, before, 'megabatch_disk_read_bytes_total{file="aggregates",purpose="train"}')
            out.update({
                # rows delivered per batch: x's, and x_agg's where the batches carry it
                "rows_per_batch": served / row_bytes / batches if batches else None,
                "aggregate_disk_bytes_per_batch": aggregate_bytes / batches if batches else None,
                "feature_cache_bytes": after.get("megabatch_feature_cache_bytes"),
                "neighbor_cache_bytes": after.get("megabatch_neighbor_cache_bytes"),
                "batches": batches, "seconds": seconds, "batches_per_s": rate, "epoch_batches": epoch_batches,
                "seeds": seeds, "seeds_per_s": seeds / seconds if seconds > 0 else 0.0,
                # on 2 cores the disk-reading modes are CPU-bound, and CPU per batch varies far less between
                # runs than batches/s (the virtual disk's rate drifts): the read checks' cost is read off it
                "daemon_cpu_s_per_batch": (cpu_after - cpu_before) / batches if batches else None,
                "epoch_seconds_implied": epoch_batches / rate if rate > 0 and epoch_batches > 0 else None,
                "feature_mb_s": nbytes / seconds / 1e6 if seconds > 0 else 0.0,
                "disk_bytes": io_after - io_before,
                "disk_read_mb_s": (io_after - io_before) / seconds / 1e6 if seconds > 0 else None,
                "staging_written_mb_s": staged_written / seconds / 1e6 if mode == "staged" and seconds > 0 else None,
                "ranks": ranks,
                "disk_bytes_per_batch": (io_after - io_before) / batches if batches else None,
                # rows read from disk per row delivered: misses plus the exact mode's read-ahead fills (the hybrid
                # mode's rows from resident partitions are delivered, not missed)
                "feature_miss_ratio": (feat_miss + feat_fill) / (feat_hit + feat_miss + feat_resident)
                if feat_hit + feat_miss else None,
                "resident_ratio": feat_resident / (feat_hit + feat_miss + feat_resident) if feat_resident else None,
                "neighbor_hit_ratio": nb_hit / (nb_hit + nb_miss) if nb_hit + nb_miss else None,
                "sampler_seconds_per_batch": sampler / batches if batches else None,
                "planner_over_sampler": planner / sampler if mode == "exact" and sampler > 0 else None,
                # where a batch's time goes, per stage (they overlap: the slowest one bounds the rate);
                # "rows" (disk reads of feature rows) is a part of "publisher"
                "stage_ms_per_batch": {stage: 1000 * value / batches for stage, value in busy.items()} if batches
                else None,
                "hier_read_mb_s": reader_bytes / reader / 1e6 if mode == "hierarchical" and reader > 0 else None,
            })
            if ranks == 1:
                train_json = work / f"{run}-train.json"
                t0 = time.perf_counter()
                sh([PY, "-m", "trainer", "--socket", str(sock), "--model", "sage", "--hidden", "128", "--epochs",
                    "1", "--max-steps", str(args.train_steps), "--json-out", str(train_json), "--no-progress", "-q"])
                train = json.loads(train_json.read_text())["epochs"][-1]
                out.update({"train_seconds": time.perf_counter() - t0, "train_samples_per_s": train["samples_per_s"],
                            "train_data_wait": train["data_wait"],
                            "train_steps_per_s": train["batches"] / train["train_s"] if train["train_s"] else None})
            estimate = ESTIMATE.search(log_path.read_text())
            if estimate is not None:  # the cost model's prediction, from the pilot at startup
                out["estimated_rows"] = {"without": int(estimate.group(1).replace(",", "")),
                                         "with": int(estimate.group(3).replace(",", ""))}
                out["estimated_bytes"] = {"without": estimate.group(2), "with": estimate.group(4)}
            status = Path(f"/proc/{daemon.pid}/status").read_text()
            out["daemon_peak_rss"] = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024  # type: ignore[union-attr]
        except (Exception, SystemExit) as err:  # a dead daemon is a result, not the end of the bench
            error = f"{type(err).__name__}: {err}"
        finally:
            # an exit before the bench's SIGTERM is a death, whatever its code; after it, only a non-zero one is
            exited_early = daemon.poll() is not None
            out["daemon_exit"] = stop_process(daemon, 120)
            oom_kills = 0
            if group is not None:
                out["cgroup_peak"] = int((group / "memory.max_usage_in_bytes").read_text())
                out["cgroup_limit_hits"] = int((group / "memory.failcnt").read_text())
                oom = (group / "memory.oom_control").read_text()
                match = re.search(r"oom_kill (\d+)", oom)
                oom_kills = out["oom_kills"] = int(match.group(1)) if match else 0
                group.rmdir()
    failure = out["failure"] = death(int(out["daemon_exit"]), exited_early, oom_kills,  # type: ignore[call-overload]
                                     limit if group else None, log_path, error)
    if failure is not None:
        print(f"bench: {run}: {failure} (log: {log_path})", file=sys.stderr, flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2_000_000)
    p.add_argument("--avg-degree", type=float, default=20)
    p.add_argument("--feat-dim", type=int, default=256)
    p.add_argument("--partitions", type=int, default=512)
    p.add_argument("--budget", default="448M", help="[memory] budget of each daemon (default 448M)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--superbatch", type=int, default=8)
    p.add_argument("--sample-group", type=int, default=8)
    p.add_argument("--staged-superbatch", type=int, default=STAGED_SUPERBATCH,
                   help="superbatch of mode staged, whose pass over the file the superbatch's batches share "
                        f"(default {STAGED_SUPERBATCH}, the daemon's)")
    p.add_argument("--batches", type=int, default=1200, help="loader-only batches per mode at most (default 1200)")
    p.add_argument("--seconds", type=float, default=120, help="loader-only seconds per mode at most (default 120)")
    p.add_argument("--warmup", type=int, default=8, help="loader-only batches not timed first (default 8)")
    p.add_argument("--train-steps", type=int, default=64,
                   help="GraphSAGE steps through each daemon (default 64; the first batch's wait is among them)")
    p.add_argument("--work", default="/var/tmp/megabatch-compare", help="data directory (reused when present)")
    p.add_argument("--read-checks", choices=("on", "both"), default="both",
                   help="both (default): run hierarchical, exact and static unchecked too, to measure the checks' cost")
    p.add_argument("--replay-batches", type=int, default=200,
                   help="with --read-checks both and exact or static: batches of the interleaved read-check replay "
                        "(default 200; 0: none)")
    p.add_argument("--ranks", default="1", help="comma-separated job sizes each mode serves (default 1; e.g. 1,2)")
    p.add_argument("--aggregation-cache", action="store_true",
                   help="run each mode again with [sampler] aggregation_cache = true (rows <mode>-agg; the dataset's "
                        "mean cache is built first where it has none) and report the two side by side")
    p.add_argument("--out", default="compare",
                   help="results' file stem under bench/results (default compare; another keeps compare.json, which "
                        "bench/accuracy_report.py reads, as it is)")
    p.add_argument("--unchecked-first", action="store_true",
                   help="run each mode's unchecked twin before it (the second run of a trace may find the virtual "
                        "disk's host cache warm: swap the order to see that bias)")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        p.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    if args.read_checks == "both":
        pair = (lambda m: (m + UNCHECKED, m)) if args.unchecked_first else (lambda m: (m, m + UNCHECKED))
        modes = [run for mode in modes for run in (pair(mode) if mode in CHECKED_MODES else (mode,))]
    try:
        args.ranks = [int(w) for w in args.ranks.split(",") if w]
    except ValueError:
        args.ranks = []
    if not args.ranks or min(args.ranks) < 1:
        p.error(f"--ranks: expected job sizes >= 1, got {args.ranks!r}")
    if not args.out or Path(args.out).name != args.out or args.out in (".", ".."):
        p.error(f"--out: expected a file stem under {RESULTS} (like compare-ab), got {args.out!r}")
    if args.aggregation_cache:
        modes = [run for mode in modes for run in (mode, mode + AGGREGATED)]
    modes = [run + ("" if w == 1 else f"-r{w}") for run in modes for w in args.ranks]
    budget = parse_size(args.budget)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    dataset = generated_dataset(work, args.nodes, args.avg_degree, args.feat_dim, args.partitions)
    features = (dataset / "features.bin").stat().st_size
    if args.aggregation_cache and not (dataset / "aggregates-mean.bin").exists():
        sh([PY, "-m", "loader.cli", "aggregate", str(dataset), "--kind", "mean", "--memory-budget", args.budget])
    if features < 4 * budget:
        warn(f"features ({format_size(features)}) are less than 4x the budget ({format_size(budget)})")
    if any(run_parts(run)[0] == "mmap" for run in modes) and features <= budget + DAEMON_OVERHEAD:
        # the kernel's page cache, charged to the cgroup, then holds the whole file: mmap runs from RAM
        warn(f"features ({format_size(features)}) fit in mmap's cgroup limit (budget + "
             f"{format_size(DAEMON_OVERHEAD)}): its page cache holds them all, so mmap is no out-of-core baseline")
    seq_rates = sequential_rates(dataset / "features.bin")
    seq_rate = float(statistics.median(seq_rates))
    results = []
    caches: dict[str, int] = {}
    for mode in modes:
        print(f"== {mode}", flush=True)
        # static gets exactly the caches exact chose, so their miss ratios compare the policies alone; so
        # does exact's unchecked twin when it runs second, so the pair isolates the checks from the
        # smaller caches the page tables leave (the twin that runs first cannot: checked needs more)
        same_caches = mode.startswith("static") or mode == "exact" + UNCHECKED or \
            (mode.startswith("exact") and run_parts(mode)[2] > 1)
        results.append(run_mode(mode, dataset, work, args, budget, caches if same_caches else {}))
        if mode == "exact" and results[-1].get("feature_cache_bytes") is not None:
            caches = {"feature_cache": int(results[-1]["feature_cache_bytes"]),  # type: ignore[call-overload]
                      "neighbor_cache": int(results[-1]["neighbor_cache_bytes"])}  # type: ignore[call-overload]
        print(json.dumps(results[-1]), flush=True)
    replay = None
    if args.read_checks == "both" and args.replay_batches > 0 and any(
            run_parts(run)[0] in ("exact", "static") for run in modes):
        print(f"== read-check replay ({args.replay_batches} batches)", flush=True)
        replay = replay_read_checks(open_dataset(dataset), args.replay_batches, args.batch_size,
                                    [int(f) for f in args.fanouts.split(",")])
    text = report(results, args, budget, features, seq_rates, replay)
    print(text)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"machine": machine_description(), "args": vars(args),
                                                      "sequential_mb_s": seq_rate,
                                                      "sequential_mb_s_runs": seq_rates, "results": results,
                                                      "read_check_replay": replay}, indent=2))
    (RESULTS / f"{args.out}.md").write_text(text + "\n")
    chart(results, RESULTS / f"{args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
