"""Daemon throughput, disk rate, memory and trainer data-wait, side by side with the in-memory loader.

One run: generate + prepare a graph whose features exceed the daemon's budget, drop the page cache,
start ``megabatch serve`` under a cgroup memory limit, then
  1. loader-only: a consumer that touches every batch (sums x) for one epoch: batches/s, feature MB/s;
  2. the same epoch from the in-memory loader (whole graph in RAM, same sampler): the ratio;
  3. disk: bytes read while loading mega-batches / reader busy time vs the disk's sequential O_DIRECT rate;
  4. the daemon's peak RSS vs its memory budget;
  5. GraphSAGE through the daemon for --train-steps optimizer steps: the trainer's data-wait fraction.

    .venv/bin/python bench/daemon_bench.py [--nodes 1000000] [--feat-dim 256] [--budget 512M]
                                           [--train-steps 300] [--work DIR]
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import (
    DAEMON_OVERHEAD,
    RESULTS,
    drop_caches,
    generated_dataset,
    join_before_exec,
    machine_description,
    memory_cgroup,
    scrape,
    sequential_rate,
    sh,
    stop_process,
    wait_for_socket,
)
from loader.format.dataset import open_dataset
from loader.sampling.inmemory import epoch_batches_inmemory, load_in_memory
from loader.sampling.sampling import sample_pass
from proto.client import ControlClient
from proto.messages import BatchReady, Credit, EpochEnd, Release, StartEpoch
from proto.sizes import format_size, parse_size

PY = sys.executable



def consume_epoch(client: ControlClient, epoch: int) -> tuple[int, int, float]:
    """(batches, feature bytes, seconds) of one epoch, touching every feature byte."""
    client.send(StartEpoch(epoch=epoch))
    batches = nbytes = 0
    t0 = time.perf_counter()
    while True:
        msg = client.recv(timeout=600)
        if isinstance(msg, EpochEnd):
            return batches, nbytes, time.perf_counter() - t0
        assert isinstance(msg, BatchReady)
        x = client.read_batch(msg).arrays["x"]
        float(x.sum(dtype=np.float64))
        batches += 1
        nbytes += x.nbytes
        del x
        client.send(Release(slot=msg.slot, seq=msg.seq))


def inmemory_epoch(dataset: Path, batch_size: int, fanouts: list[int]) -> tuple[int, int, float]:
    data = load_in_memory(open_dataset(dataset))
    plan = epoch_batches_inmemory(data.splits["train"], batch_size, 0, 1)
    t0 = time.perf_counter()
    batches = nbytes = 0
    chunk = 64
    for first in range(0, len(plan.keys), chunk):
        keys = plan.keys[first:first + chunk]
        sampled = sample_pass(data.graph, plan.seeds[first * batch_size:(first + len(keys)) * batch_size],
                              batch_size, fanouts, keys)
        for b in range(sampled.num_batches):
            x = data.features[sampled.batch(b).nodes]
            float(x.sum(dtype=np.float64))
            batches += 1
            nbytes += x.nbytes
    return batches, nbytes, time.perf_counter() - t0


def start_daemon(config: Path, limit: int) -> tuple[subprocess.Popen[bytes], Path | None]:
    group = memory_cgroup(limit, "megabatch-daemon")
    proc = subprocess.Popen([PY, "-m", "loader.cli", "serve", "--config", str(config)],
                            preexec_fn=join_before_exec(group))
    return proc, group


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--avg-degree", type=float, default=20)
    p.add_argument("--feat-dim", type=int, default=256)
    p.add_argument("--partitions", type=int, default=256)
    p.add_argument("--budget", default="512M")
    p.add_argument("--fraction", type=float, default=0.0625, help="megabatch_fraction N_d / N_p (default 1/16)")
    p.add_argument("--slots", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--train-steps", type=int, default=300, help="GraphSAGE optimizer steps (default 300)")
    p.add_argument("--work", default=None, help="keep the generated data here (reused when present)")
    args = p.parse_args()
    budget = parse_size(args.budget)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mb-daemon-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    dataset = generated_dataset(work, args.nodes, args.avg_degree, args.feat_dim, args.partitions)
    features_bytes = (dataset / "features.bin").stat().st_size
    sock, port = work / "bench.sock", 9459
    config = work / "bench.toml"
    config.write_text(f"""[dataset]\npath = "{dataset}"\n[memory]\nbudget = "{args.budget}"
[hierarchy]\nmegabatch_fraction = {args.fraction}\npasses = 1\n[sampler]\nbatch_size = {args.batch_size}
fanouts = {fanouts}\neval_fanouts = {fanouts}\neval_batch_size = {args.batch_size}\n[io]\ndirect_io = true
[publisher]\nslots = {args.slots}\n[server]\nsocket = "{sock}"\nmax_clients = 1\n[metrics]\nport = {port}\n""")
    seq_rate = sequential_rate(dataset / "features.bin")
    print(f"sequential O_DIRECT read: {seq_rate:.0f} MB/s", flush=True)

    sock.unlink(missing_ok=True)  # a socket left by a killed run would look like a ready daemon
    drop_caches()
    daemon, group = start_daemon(config, budget + DAEMON_OVERHEAD)
    result: dict[str, object] = {"machine": machine_description(), "args": vars(args),
                                 "features_bytes": features_bytes, "sequential_mb_s": seq_rate}
    try:
        wait_for_socket(sock, daemon)
        client = ControlClient.connect(str(sock), client="bench", timeout=None)
        client.send(Credit(count=client.welcome.slots.count))
        warm = consume_epoch(client, 0)  # first epoch pays numba compilation and cold starts
        before = scrape(port)
        batches, nbytes, seconds = consume_epoch(client, 1)
        after = scrape(port)
        client.close()
        disk = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("megabatch_disk_read_bytes_total"))
        reader_busy = (after['megabatch_stage_busy_seconds_total{stage="reader"}']
                       - before['megabatch_stage_busy_seconds_total{stage="reader"}'])
        result.update({"warmup_epoch_seconds": warm[2], "batches": batches, "epoch_seconds": seconds,
                       "batches_per_s": batches / seconds, "feature_mb_s": nbytes / seconds / 1e6,
                       "disk_bytes": disk, "reader_busy_seconds": reader_busy,
                       "disk_mb_s_while_loading": disk / reader_busy / 1e6, "budget": budget})
        # 5. GraphSAGE through the daemon (same epoch numbering continues)
        out = work / "train.json"
        sh([PY, "-m", "trainer", "--socket", str(sock), "--model", "sage", "--hidden", "128", "--epochs", "1",
            "--max-steps", str(args.train_steps), "--json-out", str(out), "--no-progress", "-q"])
        train = json.loads(out.read_text())
        result["trainer_data_wait"] = train["epochs"][-1]["data_wait"]
        result["trainer_samples_per_s"] = train["epochs"][-1]["samples_per_s"]
        # VmHWM: the daemon's peak resident set over the whole run (loader-only epochs and training)
        status = Path(f"/proc/{daemon.pid}/status").read_text()
        hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024  # type: ignore[union-attr]
        result["daemon_peak_rss"] = hwm
    finally:
        stop_process(daemon, 60)
        if group is not None:
            result["daemon_cgroup_peak"] = int((group / "memory.max_usage_in_bytes").read_text())
            group.rmdir()
    mem_batches, mem_bytes, mem_seconds = inmemory_epoch(dataset, args.batch_size, fanouts)
    result.update({"inmemory_batches_per_s": mem_batches / mem_seconds,
                   "inmemory_feature_mb_s": mem_bytes / mem_seconds / 1e6})
    lines = [
        f"machine: {result['machine']}",
        f"graph: {args.nodes:,} nodes, {args.feat_dim}-dim float32, features {format_size(features_bytes)} "
        f"({features_bytes / budget:.1f}x the {format_size(budget)} budget)",
        "| measure | daemon (mega-batches) | in-memory loader | ratio |", "|---|---|---|---|",
        f"| loader-only batches/s | {result['batches_per_s']:.1f} | {result['inmemory_batches_per_s']:.1f} | "
        f"{result['batches_per_s'] / result['inmemory_batches_per_s']:.2f}x |",  # type: ignore[operator]
        f"| feature MB/s delivered | {result['feature_mb_s']:.0f} | {result['inmemory_feature_mb_s']:.0f} | |",
        f"| disk MB/s while loading | {result['disk_mb_s_while_loading']:.0f} | sequential O_DIRECT "
        f"{seq_rate:.0f} | {result['disk_mb_s_while_loading'] / seq_rate:.2f}x |",  # type: ignore[operator]
        f"| daemon peak RSS | {format_size(hwm)} | budget {format_size(budget)} | "
        f"budget + {format_size(hwm - budget)} |",
        f"| trainer data-wait (GraphSAGE, {args.train_steps} steps) | "
        f"{100 * float(result['trainer_data_wait']):.1f}% | | |",  # type: ignore[arg-type]
        f"| trainer samples/s (GraphSAGE hidden 128) | {float(result['trainer_samples_per_s']):.0f} | | |",  # type: ignore[arg-type]
    ]
    if "daemon_cgroup_peak" in result:
        peak = int(result["daemon_cgroup_peak"])  # type: ignore[call-overload]
        limit = format_size(budget + DAEMON_OVERHEAD)
        lines.append(f"| daemon cgroup peak (RSS + page cache it touched; limit {limit}) | {format_size(peak)} | | |")
    report = "\n".join(lines)
    print(report)
    (RESULTS / "daemon.json").write_text(json.dumps(result, indent=2))
    (RESULTS / "daemon.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
