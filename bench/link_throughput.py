"""Link prediction out of core: training edges per second and disk bytes per epoch of each daemon mode (issue 31).

A generated graph (``--nodes``, ``--avg-degree``, ``--feat-dim`` float32 features; ``megabatch generate``) is
imported as a link dataset (``import --format numpy --task link --undirected``: a 0.98/0.01/0.01 split of its
pairs, 20 negative tails per held-out positive, so that the held-out pairs, which every mode keeps, stay
small) and prepared into ``--partitions`` METIS partitions, once per ``--work``. Each mode then runs as its own
``megabatch serve`` with ``[memory] budget = --budget``, the page cache dropped first, in a cgroup v1 memory
limit of budget + the daemon overhead (where available; mode ``inmemory``, the upper bound, runs without one):

    exact         the shuffled order over the whole graph (Belady feature cache, neighbour cache, checked reads)
    comet, beta   mode hierarchical with ``[link] order``: a buffer of ``--fraction`` of the partitions (C), each
                  state of MariusGNN's order a mega-batch, partitions shared with the previous state copied from
                  the other buffer rather than read
    mmap          the shuffled order over memory maps (PyG over np.memmap; read checks off)
    inmemory      the shuffled order from RAM

A consumer (a link client of the daemon, no model) takes epoch 1's training batches for up to ``--seconds``,
touching every feature byte: positives (training edges) per second, batches per second, the disk bytes the
daemon read (``/proc/PID/io``) per training edge; for comet and beta, over a whole epoch, the partitions
loaded from the disk and copied (``megabatch_partitions_loaded``) against MariusGNN's I/O model, the plan's
``BufferPlan.io_partitions`` (the first state whole, then each swap's incoming partitions: linear in the
logical partitions l). Writes bench/results/link-throughput[-TAG].{md,json}.

    .venv/bin/python bench/link_throughput.py [--nodes 1000000] [--budget 384M] [--work DIR]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
    import harness  # noqa: F401
from bench.harness import (
    DAEMON_OVERHEAD,
    drop_caches,
    join_before_exec,
    machine_description,
    memory_cgroup,
    process_read_bytes,
    scrape,
    sh,
    stop_process,
    wait_for_socket,
    write_results,
)
from loader.format.dataset import open_dataset
from loader.sampling.buffer_order import buffer_plan, resolved_logical
from proto.client import ControlClient
from proto.messages import BatchReady, Credit, EpochEnd, Release, StartEpoch
from proto.sizes import format_size, parse_size

__all__ = ["MODES", "ModeResult", "parse_args", "serve_config", "model_partitions", "report", "main"]

PY = sys.executable
MODES = ("exact", "comet", "beta", "mmap", "inmemory")
INMEMORY_BUDGET = 16 << 30
"""Mode inmemory's budget (it runs without a cgroup limit: the bound the out-of-core modes are held to)."""


@dataclass
class ModeResult:
    mode: str
    batches: int = 0
    positives: int = 0
    seconds: float = 0.0
    disk_bytes: int = 0
    epoch_done: bool = False
    partitions_disk: float | None = None
    partitions_copied: float | None = None
    model_partitions: int | None = None
    """MariusGNN's I/O model for the epoch (comet, beta): ``BufferPlan.io_partitions``."""
    error: str | None = None

    @property
    def edges_per_s(self) -> float:
        return self.positives / self.seconds if self.seconds > 0 else 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=10)
    parser.add_argument("--feat-dim", type=int, default=128)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--fraction", type=float, default=0.0625,
                        help="comet, beta: the buffer's share of the partitions ([hierarchy] megabatch_fraction)")
    parser.add_argument("--budget", default="384M", help="[memory] budget of every mode")
    parser.add_argument("--batch-size", type=int, default=256, help="training positives per batch")
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--superbatch", type=int, default=8,
                        help="[fullgraph] superbatch of exact and mmap (a link batch's seeds are 3x a node batch's: 64 "
                             "link batches in flight take far more than the default budget's share)")
    parser.add_argument("--seconds", type=float, default=240, help="most seconds a mode's epoch is consumed")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--tag", default="")
    parser.add_argument("--work", type=Path, help="the graph and the logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    args.modes = args.modes.split(",")
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)} (choose from {', '.join(MODES)})")
    if not 0 < args.fraction < 1:
        parser.error(f"--fraction {args.fraction}: expected a share in (0, 1)")
    args.budget_bytes = parse_size(args.budget, name="--budget")
    return args


def link_dataset(work: Path, args: argparse.Namespace) -> Path:
    """``work/dataset``: the generated graph as a prepared link dataset (each step skipped where done)."""
    raw, source, link_raw, dataset = work / "raw", work / "input", work / "link-raw", work / "dataset"
    if not raw.exists():
        sh([PY, "-m", "loader.cli", "-q", "generate", str(raw), "--nodes", str(args.nodes), "--avg-degree",
            str(args.avg_degree), "--feat-dim", str(args.feat_dim), "--classes", "4"])
    if not source.exists():
        tmp = work / "input.tmp"
        tmp.mkdir(exist_ok=True)
        edges = np.stack((np.load(raw / "edge_src.npy", mmap_mode="r"), np.load(raw / "edge_dst.npy", mmap_mode="r")))
        np.save(tmp / "edge_index.npy", edges.astype(np.int64))
        np.save(tmp / "features.npy", np.load(raw / "features.npy", mmap_mode="r"))
        np.save(tmp / "labels.npy", np.load(raw / "labels.npy", mmap_mode="r"))
        tmp.rename(source)
    if not link_raw.exists():
        # 1% of the pairs held out each, 20 tails apiece: the held-out pairs stay resident in every mode's budget
        sh([PY, "-m", "loader.cli", "-q", "import", str(source), str(link_raw), "--format", "numpy", "--task", "link",
            "--undirected", "--edge-split", "0.98,0.01,0.01", "--eval-negatives", "20"])
    if not dataset.exists():
        sh([PY, "-m", "loader.cli", "-q", "prepare", str(link_raw), str(dataset), "--partitions",
            str(args.partitions), "--memory-budget", "4G"])
    return dataset


def serve_config(mode: str, dataset: Path, socket: Path, port: int, args: argparse.Namespace) -> str:
    """The TOML of one mode's daemon."""
    fanouts = ", ".join(args.fanouts.split(","))
    loader = "hierarchical" if mode in ("comet", "beta") else mode
    # inmemory, the upper bound, holds the whole graph: a budget that does, outside any cgroup
    budget = INMEMORY_BUDGET if mode == "inmemory" else args.budget_bytes
    lines = [f'[dataset]\npath = "{dataset}"', f'[loader]\nmode = "{loader}"',
             f'[memory]\nbudget = {budget}',
             f"[sampler]\nbatch_size = {args.batch_size}\nfanouts = [{fanouts}]\neval_fanouts = [{fanouts}]\n"
             f"eval_batch_size = {args.batch_size}",
             f'[server]\nsocket = "{socket}"\nmax_clients = 1', "[publisher]\nslots = 2", f"[metrics]\nport = {port}"]
    if loader == "hierarchical":
        lines += [f"[hierarchy]\nmegabatch_fraction = {args.fraction}", f'[link]\norder = "{mode}"']
    else:
        lines.append(f"[fullgraph]\nsuperbatch = {args.superbatch}")
    if mode == "mmap":
        lines.append("[io]\ncheck_reads = false")
    return "\n".join(lines) + "\n"


def model_partitions(mode: str, num_partitions: int, capacity: int, seed: int, epoch: int) -> int:
    """MariusGNN's reads for the epoch in partitions (``BufferPlan.io_partitions``) of a buffer of ``capacity``."""
    order = "beta" if mode == "beta" else "comet"
    logical = None if order == "beta" else resolved_logical(order, num_partitions, capacity, None)
    return buffer_plan(order, num_partitions, capacity, logical, seed, epoch).io_partitions


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def consume(sock: Path, seconds: float) -> tuple[int, int, float, bool]:
    """(batches, positives, seconds, whole epoch) of epoch 1, touching every feature byte."""
    client = ControlClient.connect(str(sock), client="link-throughput", timeout=None, task="link")
    try:
        client.send(Credit(count=client.welcome.slots.count))
        client.send(StartEpoch(epoch=1))
        batches = positives = 0
        started = time.perf_counter()
        while True:
            msg = client.recv()
            if isinstance(msg, EpochEnd):
                return batches, positives, time.perf_counter() - started, True
            assert isinstance(msg, BatchReady), msg
            arrays = client.read_batch(msg).arrays
            float(np.asarray(arrays["x"]).sum())  # every feature byte, as a trainer's copy would
            positives += int(np.count_nonzero(arrays["edge_label"]))
            batches += 1
            client.send(Release(slot=msg.slot, seq=msg.seq))
            if time.perf_counter() - started >= seconds:
                return batches, positives, time.perf_counter() - started, False
    finally:
        client.close("done")


def run_mode(mode: str, dataset: Path, work: Path, args: argparse.Namespace) -> ModeResult:
    result = ModeResult(mode)
    sock, port = work / f"{mode}.sock", _free_port()
    config = work / f"{mode}.toml"
    config.write_text(serve_config(mode, dataset, sock, port, args))
    limit = None if mode == "inmemory" else args.budget_bytes + DAEMON_OVERHEAD
    drop_caches()
    group = memory_cgroup(limit, "megabatch-link") if limit is not None else None
    log = work / f"{mode}.log"
    with log.open("w") as sink:
        daemon = subprocess.Popen([PY, "-m", "loader.cli", "serve", "--config", str(config)], stdout=sink,
                                  stderr=subprocess.STDOUT, preexec_fn=join_before_exec(group))
        try:
            wait_for_socket(sock, daemon)
            before = process_read_bytes(daemon.pid)
            result.batches, result.positives, result.seconds, result.epoch_done = consume(sock, args.seconds)
            result.disk_bytes = process_read_bytes(daemon.pid) - before
            if mode in ("comet", "beta"):
                samples = scrape(port)
                result.partitions_disk = samples.get('megabatch_partitions_loaded_total{source="disk"}')
                result.partitions_copied = samples.get('megabatch_partitions_loaded_total{source="previous"}')
                manifest = open_dataset(dataset).manifest
                capacity = max(2, int(args.fraction * manifest.num_partitions))
                result.model_partitions = model_partitions(mode, manifest.num_partitions, capacity, 0, 1)
        except (SystemExit, OSError, ConnectionError, AssertionError) as err:
            result.error = str(err).splitlines()[0] if str(err) else type(err).__name__
        finally:
            stop_process(daemon, 60)
            if group is not None:
                group.rmdir()
    return result


def report(results: list[ModeResult], args: argparse.Namespace, dataset_bytes: int, partitions: int) -> str:
    base = next((r for r in results if r.mode == "mmap" and r.error is None), None)
    per_partition = dataset_bytes / partitions
    lines = ["# Link prediction out of core: edges/s and disk reads per mode\n",
             f"{machine_description()}; {args.nodes:,} nodes, avg degree {args.avg_degree}, {args.feat_dim}-dim "
             f"float32 features, {partitions} METIS partitions ({format_size(dataset_bytes)} of features and edge "
             f"lists); budget {args.budget}, comet/beta buffer {args.fraction:g} of the partitions; batch "
             f"{args.batch_size} positives, 1 negative each, fanouts {args.fanouts}; one client with 2 slots; "
             f"[fullgraph] superbatch {args.superbatch}; epoch 1 for up to "
             f"{args.seconds:g} s per mode; `bench/link_throughput.py`.\n",
             "| mode | edges/s | vs mmap | batches/s | disk MB / 1k edges | whole epoch | partitions read (copied) "
             "| MariusGNN model | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = f"{r.edges_per_s / base.edges_per_s:.2f}x" if base is not None and base.edges_per_s else "-"
        per_k = f"{r.disk_bytes / 1e6 / max(1, r.positives) * 1000:.2f}" if r.positives else "-"
        read = "-" if r.partitions_disk is None else f"{r.partitions_disk:.0f} ({r.partitions_copied or 0:.0f})"
        model = "-" if r.model_partitions is None else (f"{r.model_partitions} "
                                                        f"({format_size(int(r.model_partitions * per_partition))})")
        lines.append(f"| {r.mode} | {r.edges_per_s:,.0f} | {ratio} | {r.batches / r.seconds if r.seconds else 0:.1f} "
                     f"| {per_k} | {'yes' if r.epoch_done else 'no'} | {read} | {model} | {r.error or ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mb-linkio-", dir=os.environ.get("TMPDIR")) as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        dataset = link_dataset(work, args)
        results = []
        for mode in args.modes:
            result = run_mode(mode, dataset, work, args)
            results.append(result)
            print(f"{mode}: {result.edges_per_s:,.0f} edges/s, {result.batches} batches in {result.seconds:.1f} s, "
                  f"{format_size(result.disk_bytes)} read{'; ' + result.error if result.error else ''}", flush=True)
        manifest = open_dataset(dataset).manifest
        data_bytes = sum((dataset / name).stat().st_size for name in ("features.bin", "indices.npy", "indptr.npy"))
        text = report(results, args, data_bytes, manifest.num_partitions)
        name = "link-throughput" + (f"-{args.tag}" if args.tag else "")
        write_results(name, argparse.Namespace(**{k: str(v) if isinstance(v, Path) else v
                                                  for k, v in vars(args).items()}),
                      {"results": [asdict(r) | {"edges_per_s": r.edges_per_s} for r in results]}, text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
