"""The CUDA path end to end: pinned slots, side-stream copies, the device feature cache (`make gpu-check`).

Run it on a machine with an NVIDIA GPU (on one without, it says so in one line and exits 2). Two parts:

1. **Copies**: host-to-device copies of ``--copy-size`` bytes from (a) pageable memory (a plain
   array), (b) a read-only mapping of a memfd segment registered with ``cudaHostRegister`` the way
   the trainer registers the daemon's slots (``trainer.host_pinning``) and (c) torch's own pinned
   memory, each timed on a side stream with CUDA events: GB/s, and how long the calling thread was
   blocked per copy (a pinned copy returns at once; a pageable one blocks for the whole copy, which
   is what keeps it from overlapping a training step). Each copy is checked bitwise.
2. **Training through the daemon**: a generated graph prepared with METIS, one ``megabatch serve``
   (``--mode``, default the default mode) and ``megabatch train --device cuda`` sessions against it,
   ``--steps`` steps each: pageable slots (``--no-pin-slots``), pinned slots, and pinned slots with a
   device feature cache of ``--feature-cache``, after an untimed warm-up session, then one with
   ``--device-memory`` at half the pinned session's CUDA peak (micro-batches cut on the host, one at a
   time on the device), and one more against a second daemon serving the aggregation cache (``megabatch
   aggregate --kind mean`` first; batches one hop smaller carrying x_agg). Per session: samples/s,
   data-wait, step time, the time waited per batch, the H2D GB/s the trainer measured on its copy stream
   and CUDA's peak.

Writes ``<out>/gpu-check.{json,md}`` (default ``bench/results``).

    .venv/bin/python bench/gpu_check.py [--nodes 500000] [--feat-dim 256] [--steps 200] [--mode hierarchical]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import RESULTS, generated_dataset, machine_description, stop_process, wait_for_socket
from proto.shm import create_segment, map_segment
from proto.sizes import format_size, parse_size
from trainer.host_pinning import pin_region

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # the read-only mapping, on purpose

PY = sys.executable


def _timed_copies(host: torch.Tensor, reps: int) -> dict[str, float]:
    """GB/s on a side stream (event time) and host ms blocked per ``non_blocking`` copy call."""
    device = torch.device("cuda")
    stream = torch.cuda.Stream(device)
    dst = torch.empty(host.shape, dtype=host.dtype, device=device)
    with torch.cuda.stream(stream):
        for _ in range(2):
            dst.copy_(host, non_blocking=True)
    stream.synchronize()
    blocked = 0.0
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        began.record(stream)
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(host, non_blocking=True)
            blocked += time.perf_counter() - t0
        ended.record(stream)
    ended.synchronize()
    seconds = began.elapsed_time(ended) / 1000
    same = bool(torch.equal(dst.cpu(), host))
    return {"gb_s": host.numel() * host.element_size() * reps / seconds / 1e9,
            "host_blocked_ms_per_copy": 1000 * blocked / reps, "bitwise_equal": same}


def copy_rates(nbytes: int, reps: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, nbytes, dtype=np.uint8)
    out: dict[str, object] = {}
    out["pageable"] = _timed_copies(torch.from_numpy(payload.copy()), reps)
    writer = create_segment(nbytes, "megabatch-gpu-check")
    try:
        np.frombuffer(writer.mapping, dtype=np.uint8)[:] = payload
        reader = map_segment(os.dup(writer.reader_fd), nbytes)
        try:
            outcome = pin_region(reader.mapping)
            view = np.frombuffer(reader.mapping, dtype=np.uint8)
            result = _timed_copies(torch.from_numpy(view), reps)
            del view
            result["registered"] = outcome.region is not None
            result["refusal"] = outcome.reason
            out["registered_read_only_segment"] = result
            if outcome.region is not None:
                outcome.region.release()
        finally:
            reader.close()
    finally:
        writer.close()
    out["torch_pinned"] = _timed_copies(torch.from_numpy(payload).pin_memory(), reps)
    return out


def train_session(sock: Path, work: Path, name: str, steps: int, extra: list[str]) -> dict[str, object]:
    out = work / f"{name}.json"
    log = work / f"{name}.log"
    cmd = [PY, "-m", "trainer", "--socket", str(sock), "--device", "cuda", "--epochs", "1", "--max-steps",
           str(steps), "--json-out", str(out), "--no-progress", *extra]
    print("$", " ".join(cmd), flush=True)
    with log.open("w") as sink:
        done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT)
    text = log.read_text()
    if done.returncode != 0:
        return {"session": name, "failure": f"exit {done.returncode}: {text.strip().splitlines()[-1:]}"}
    epoch = json.loads(out.read_text())["epochs"][-1]
    batches = max(1, epoch["batches"])
    slots = next((line for line in text.splitlines() if "slot segment" in line), "slots not pinned (--no-pin-slots)")
    return {"session": name, "batches": epoch["batches"], "samples_per_s": epoch["samples_per_s"],
            "data_wait": epoch["data_wait"], "step_ms": 1000 * epoch["step_s"] / batches,
            "wait_ms": 1000 * epoch["wait_s"] / batches,
            "h2d_mb_per_batch": epoch.get("h2d_bytes", 0) / batches / 1e6,
            "h2d_gb_s": epoch["h2d_bytes"] / epoch["h2d_s"] / 1e9 if epoch.get("h2d_s") else None,
            "slots": slots.strip(), "peak_device_bytes": epoch.get("peak_device_bytes", 0),
            "micro_per_batch": epoch["micro_batches"] / epoch["split_batches"] if epoch.get("split_batches") else None}


def start_daemon(work: Path, name: str, dataset: Path, sock: Path, args: argparse.Namespace, *,
                 aggregation: bool) -> subprocess.Popen[bytes]:
    """``megabatch serve`` of the check's config (``aggregation``: with ``[sampler] aggregation_cache``), its
    output in ``work/<name>.log``."""
    config = work / f"{name}.toml"
    config.write_text(f"""[dataset]\npath = "{dataset}"\n[memory]\nbudget = "{args.budget}"\n[loader]
mode = "{args.mode}"\n[hierarchy]\npasses = 1\n[sampler]\nbatch_size = {args.batch_size}\nfanouts = [10, 5]
aggregation_cache = {"true" if aggregation else "false"}
[server]\nsocket = "{sock}"\nmax_clients = 2\n[metrics]\nport = 0\n""")
    with (work / f"{name}.log").open("w") as log:
        return subprocess.Popen([PY, "-m", "loader.cli", "serve", "--config", str(config)], stdout=log,
                                stderr=subprocess.STDOUT)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=500_000)
    p.add_argument("--avg-degree", type=float, default=15)
    p.add_argument("--feat-dim", type=int, default=256)
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--mode", default="hierarchical", help="[loader] mode (default hierarchical, the default mode)")
    p.add_argument("--budget", default="2G", help="[memory] budget of the daemon (default 2G)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200, help="training steps per session (default 200)")
    p.add_argument("--warmup-steps", type=int, default=50, help="steps of an untimed first session (default 50)")
    p.add_argument("--feature-cache", default="1G", help="device feature cache of the third session (default 1G)")
    p.add_argument("--copy-size", default="64M", help="bytes per copy in the copy test (default 64M)")
    p.add_argument("--copy-reps", type=int, default=20)
    p.add_argument("--work", default=None, help="keep the generated data here (reused when present)")
    p.add_argument("--out", default=str(RESULTS), help="where gpu-check.{json,md} go (default bench/results)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA {torch.version.cuda}); run it on a "
              f"machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    gpu = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__} (CUDA {torch.version.cuda})"
    print(f"gpu_check on {gpu}; host {machine_description()}", flush=True)

    copies = copy_rates(parse_size(args.copy_size), args.copy_reps)
    for kind, row in copies.items():
        print(f"copy {kind}: {row}", flush=True)

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mb-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    dataset = generated_dataset(work, args.nodes, args.avg_degree, args.feat_dim, args.partitions,
                                generate_budget=None, prepare_budget="8G")
    print(f"dataset ready in {time.perf_counter() - t0:.0f} s", flush=True)
    sock = work / "gpu-check.sock"
    sock.unlink(missing_ok=True)
    daemon = start_daemon(work, "gpu-check", dataset, sock, args, aggregation=False)
    sessions: list[dict[str, object]] = []
    try:
        wait_for_socket(sock, daemon)
        # untimed: the daemon's first mega-batch load and numba compilation would otherwise land on the first session
        print(f"warm-up session: {train_session(sock, work, 'warm-up', args.warmup_steps, [])}", flush=True)
        for name, extra in (("pageable", ["--no-pin-slots"]), ("pinned", []),
                            ("pinned+cache", ["--feature-cache", args.feature_cache])):
            row = train_session(sock, work, name, args.steps, extra)
            print(f"session {name}: {row}", flush=True)
            sessions.append(row)
        # --device-memory at half the peak whole batches reached: the micro-batch path on the device, checked
        whole = next((r for r in sessions if r["session"] == "pinned" and r.get("peak_device_bytes")), None)
        if whole is not None:
            budget = int(whole["peak_device_bytes"]) // 2  # type: ignore[call-overload]
            row = train_session(sock, work, "device-memory", args.steps, ["--device-memory", str(budget)])
            row["budget_bytes"] = budget
            print(f"session device-memory: {row}", flush=True)
            sessions.append(row)
    finally:
        stop_process(daemon, 60)
    # the aggregation cache (BatchGNN): a daemon serving x_agg, batches one hop smaller
    if not (dataset / "aggregates-mean.bin").exists():
        subprocess.run([PY, "-m", "loader.cli", "-q", "aggregate", str(dataset), "--kind", "mean"], check=True)
    sock.unlink(missing_ok=True)
    daemon = start_daemon(work, "gpu-check-agg", dataset, sock, args, aggregation=True)
    try:
        wait_for_socket(sock, daemon)
        print(f"warm-up session (aggregation): {train_session(sock, work, 'warm-up-agg', args.warmup_steps, [])}",
              flush=True)
        row = train_session(sock, work, "pinned+aggregation", args.steps, [])
        print(f"session pinned+aggregation: {row}", flush=True)
        sessions.append(row)
    finally:
        stop_process(daemon, 60)

    lines = [f"# gpu_check: {gpu}", "", f"host: {machine_description()}", "",
             f"## Host-to-device copies of {format_size(parse_size(args.copy_size))} (side stream, {args.copy_reps} "
             f"copies)", "", "| source | GB/s | host blocked per copy (ms) | bitwise equal |", "|---|---|---|---|"]
    for kind, row in copies.items():
        assert isinstance(row, dict)
        note = "" if row.get("registered", True) else f" (not registered: {row['refusal']})"
        lines.append(f"| {kind}{note} | {row['gb_s']:.1f} | {row['host_blocked_ms_per_copy']:.2f} | "
                     f"{row['bitwise_equal']} |")
    lines += ["", f"## Training through the daemon (mode {args.mode}, {args.nodes:,} nodes x {args.feat_dim} float32, "
              f"batch {args.batch_size}, fanouts [10, 5], GraphSAGE 256, {args.steps} steps)", "",
              "| session | samples/s | data-wait | step (ms) | waited per batch (ms) | H2D MB/batch | H2D GB/s | "
              "CUDA peak (MiB) |", "|---|---|---|---|---|---|---|---|"]
    for row in sessions:
        if "failure" in row:
            lines.append(f"| {row['session']} | failed: {row['failure']} | | | | | | |")
            continue
        h2d = row["h2d_gb_s"]
        peak = f"{int(row['peak_device_bytes']) / 2**20:.0f}"  # type: ignore[call-overload]
        if "budget_bytes" in row:
            peak += (f" (budget {int(row['budget_bytes']) / 2**20:.0f}, "  # type: ignore[call-overload]
                     f"{row['micro_per_batch'] or 1:.1f} micro-batches per batch)")
        lines.append(f"| {row['session']} | {row['samples_per_s']:,.0f} | {100 * row['data_wait']:.1f}% | "  # type: ignore[operator]
                     f"{row['step_ms']:.2f} | {row['wait_ms']:.2f} | {row['h2d_mb_per_batch']:.1f} | "
                     f"{'-' if h2d is None else f'{h2d:.1f}'} | {peak} |")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps({"gpu": gpu, "machine": machine_description(), "args": vars(args),
                                                    "copies": copies, "sessions": sessions}, indent=2))
    (out / "gpu-check.md").write_text(text + "\n")
    failed = [row for row in sessions if "failure" in row]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
