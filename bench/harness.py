"""Run a command the way out-of-core benchmarks must: page cache dropped, under a cgroup v1
memory limit when one is available, timed by /usr/bin/time -v for wall time and peak RSS.

Where the cgroup or drop_caches is unavailable (not root, cgroup v2 only), the run goes on
with a warning: the numbers may then include the page cache quietly holding the dataset.

It also holds what every bench script shares: ``ROOT`` (the repository root, put on ``sys.path`` here, once) and
``RESULTS`` (``bench/results``). A script run as ``python bench/x.py`` has ``bench/`` on ``sys.path``, not the root,
so it imports this module by its bare name first, then everything else as ``bench.*``:

    if not __package__:  # run as python bench/x.py: bench/harness.py puts the repository root on sys.path
        import harness  # noqa: F401
    from bench.harness import RESULTS, ROOT, ...
"""

import json
import mmap
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# the one sys.path insertion of bench/: the repository root, so that scripts run as python bench/x.py import bench.*
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if __name__ == "harness":  # imported by its bare name from a script in bench/: the same module as bench.harness
    sys.modules.setdefault("bench.harness", sys.modules[__name__])

from loader.format.dataset import FORMAT_VERSION, Dataset, open_dataset
from loader.sampling.pilot import dataset_csc, first_epoch_batches
from loader.sampling.sampling import SampledPass
from trainer.provenance import source_commit

__all__ = ["ROOT", "RESULTS", "RunResult", "drop_caches", "run_measured", "cgroup_available", "memory_cgroup",
           "join_before_exec", "first_training_batches", "machine_description", "code_version", "write_results",
           "warn", "sh", "generated_dataset", "sequential_rate", "sequential_rates", "scrape", "wait_for_socket",
           "process_read_bytes", "process_cpu_seconds", "DAEMON_OVERHEAD", "stop_process"]

ROOT = Path(__file__).resolve().parent.parent
"""The repository root."""
RESULTS = ROOT / "bench" / "results"
"""Where benches write their reports (git ignores it)."""

DAEMON_OVERHEAD = 320 << 20
"""What a daemon holds beyond its [memory] budget: interpreter, numpy, numba/LLVM code and compile
arenas, thread stacks (measured: see docs/PERFORMANCE.md). cgroup limits are budget + this."""

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


@dataclass(frozen=True)
class RunResult:
    """One measured command: exit code, wall seconds, peak RSS bytes, cgroup peak (or None)."""

    returncode: int
    wall_seconds: float
    peak_rss_bytes: int
    cgroup_peak_bytes: int | None
    stdout: str
    stderr: str


def warn(message: str) -> None:
    print(f"bench: warning: {message}", file=sys.stderr)


def drop_caches() -> bool:
    """Flush dirty pages and drop the page cache; False (with a warning) when not permitted."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError as err:
        warn(f"cannot drop the page cache ({err.strerror}); reads may be served from RAM")
        return False


def cgroup_available() -> bool:
    return (CGROUP_ROOT / "cgroup.procs").exists() and os.access(CGROUP_ROOT, os.W_OK)


def memory_cgroup(limit: int, prefix: str) -> Path | None:
    """A fresh cgroup v1 limited to ``limit`` bytes, or None (with a warning) where unavailable."""
    if not cgroup_available():
        warn("cgroup v1 memory controller unavailable; running without a memory limit")
        return None
    group = CGROUP_ROOT / f"{prefix}-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    return group


def join_before_exec(group: Path | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that moves the child into ``group`` before exec, so every byte it maps is charged."""
    if group is None:
        return None

    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))
    return join


def run_measured(cmd: list[str], *, memory_limit: int | None = None, drop: bool = True,
                 env: dict[str, str] | None = None) -> RunResult:
    """Run ``cmd`` under /usr/bin/time -v (and a fresh cgroup limited to ``memory_limit``)."""
    if drop:
        drop_caches()
    group = memory_cgroup(memory_limit, "megabatch-bench") if memory_limit is not None else None
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        wrapped = ["/usr/bin/time", "-v", "-o", timing.name, *cmd]
        start = time.monotonic()
        proc = subprocess.run(wrapped, capture_output=True, text=True, env=env, preexec_fn=join_before_exec(group))
        wall = time.monotonic() - start
        report = Path(timing.name).read_text()
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)
    peak = int(match.group(1)) * 1024 if match else -1
    cgroup_peak = None
    if group is not None:
        cgroup_peak = int((group / "memory.max_usage_in_bytes").read_text())
        group.rmdir()
    return RunResult(proc.returncode, wall, peak, cgroup_peak, proc.stdout, proc.stderr)


def code_version(root: Path = ROOT) -> str:
    """The commit the benches run from (``trainer.provenance.source_commit``: short hash, "+dirty" where tracked
    files differ from it), so that a report can tell runs trained by different code apart; "unknown" outside a git
    checkout or without git."""
    commit = source_commit(root)
    return "unknown" if commit is None else commit


def machine_description() -> str:
    """CPU model, core count and RAM, for result files."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except OSError:
        mem_kb = 0
    return f"{cpu}, {os.cpu_count()} cores, {mem_kb / 2**20:.0f} GiB RAM"


def write_results(name: str, args: object, payload: dict[str, object], text: str) -> None:
    """``bench/results/<name>.json`` (the machine, the arguments and ``payload``) and ``<name>.md`` (``text``)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine_description(), "args": vars(args), **payload},
                                                     indent=2))
    (RESULTS / f"{name}.md").write_text(text + "\n")


def sh(cmd: list[str]) -> None:
    """Echo and run a setup command; a failure stops the bench."""
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def generated_dataset(work: Path, nodes: int, avg_degree: float, feat_dim: int, partitions: int, *,
                      generate_budget: str | None = "2G", prepare_budget: str = "4G") -> Path:
    """``work/dataset``: a generated graph (16 classes) prepared with METIS, each step skipped when its
    output is already there (benches reuse ``--work``)."""
    raw, dataset = work / "raw", work / "dataset"
    if not raw.exists():
        budget = ["--memory-budget", generate_budget] if generate_budget else []
        sh([sys.executable, "-m", "loader.cli", "-q", "generate", str(raw), "--nodes", str(nodes), "--avg-degree",
            str(avg_degree), "--feat-dim", str(feat_dim), "--classes", "16", *budget])
    if dataset.exists() and open_dataset(dataset).manifest.version != FORMAT_VERSION:
        warn(f"{dataset} is format {open_dataset(dataset).manifest.version}, not {FORMAT_VERSION}; preparing it again")
        shutil.rmtree(dataset)
    if not dataset.exists():
        sh([sys.executable, "-m", "loader.cli", "-q", "prepare", str(raw), str(dataset), "--partitions",
            str(partitions), "--partitioner", "metis", "--memory-budget", prepare_budget])
    manifest = open_dataset(dataset).manifest
    held = (manifest.num_nodes, manifest.feat_dim, manifest.num_partitions)
    if held != (nodes, feat_dim, partitions):
        # a report must describe the graph it measured, not the arguments of another one
        raise SystemExit(f"bench: {work} holds a graph of {held[0]:,} nodes, {held[1]} features, {held[2]} partitions, "
                         f"not the {nodes:,}, {feat_dim}, {partitions} asked for: give those arguments or another "
                         f"--work")
    return dataset


def first_training_batches(dataset: Dataset, batches: int, batch_size: int, fanouts: list[int], seed: int
                           ) -> tuple[SampledPass, int]:
    """(the first ``batches`` training batches of epoch 0, how many there are): the exact mode's seeds, keys
    and sampler, over an in-RAM copy of the graph (planning simulations, not a timed read path)."""
    graph = dataset_csc(dataset, mapped=False)
    t0 = time.perf_counter()
    sampled, count = first_epoch_batches(dataset, graph, batches, batch_size, fanouts, seed)
    if sampled is None:
        raise SystemExit(f"bench: {dataset.path} has no training batch to sample")
    print(f"sampled {count} batches ({len(sampled.nodes) / count:,.0f} rows each) in {time.perf_counter() - t0:.1f} s",
          flush=True)
    return sampled, count


def sequential_rates(path: Path, limit: int = 512 << 20, repeats: int = 3) -> list[float]:
    """MB/s of 1 MiB O_DIRECT reads at depth 1, ``repeats`` times over distinct ``limit``-byte regions
    of ``path`` (page cache dropped before each): a virtual disk whose host caches the file reads
    a region it has seen faster, so one figure can be off by a third."""
    size = path.stat().st_size
    buf = mmap.mmap(-1, 1 << 20)
    rates = []
    for i in range(repeats):
        begin = (i * limit) % max(1, size - limit) // (1 << 20) * (1 << 20) if size > limit else 0
        drop_caches()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            warn("O_DIRECT refused; sequential rate measured through the page cache")
            fd = os.open(path, os.O_RDONLY)
        done, t0 = 0, time.perf_counter()
        try:
            while done < limit:
                got = os.preadv(fd, [buf], begin + done)
                if got <= 0:
                    break
                done += got
        finally:
            os.close(fd)
        rates.append(done / (time.perf_counter() - t0) / 1e6)
    return rates


def sequential_rate(path: Path, limit: int = 512 << 20, repeats: int = 3) -> float:
    """The median of ``sequential_rates``."""
    return float(statistics.median(sequential_rates(path, limit, repeats)))


def scrape(port: int) -> dict[str, float]:
    """Every sample of a Prometheus endpoint: ``{'name{labels}': value}``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def wait_for_socket(sock: Path, process: subprocess.Popen[bytes], timeout: float = 900) -> None:
    """A daemon creates its socket once ready; a bench may poll for it (tests never do)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"bench: the daemon exited with {process.returncode}")
        if sock.exists():
            return
        time.sleep(0.2)
    raise SystemExit(f"bench: no socket at {sock} after {timeout:.0f} s")


def process_read_bytes(pid: int) -> int:
    """Bytes the process has caused to be read from storage (/proc/PID/io read_bytes)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process and its threads so far (/proc/PID/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_process(process: "subprocess.Popen[bytes]", timeout: float) -> int:
    """SIGTERM ``process`` (a daemon drains on it), wait up to ``timeout`` seconds, then kill; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
