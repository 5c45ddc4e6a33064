"""The soak's settings: its fixed daemon configuration, timings and bounds, its command-line arguments
(``SoakArgs``), and the daemon's TOML config written from them."""

import argparse
from dataclasses import dataclass
from pathlib import Path

STALL_TIMEOUT = 5.0
IDLE_TIMEOUT = 5.0
MAX_CLIENTS = 4
"""good + hog + one hostile session, plus one whose close the daemon has not processed yet."""
MAX_PENDING = 16
"""The default; the hostile burst opens two more connections than this."""
SLOTS = 3
BATCH_SIZE = 256
FANOUTS = (10, 5)
FEAT_DIM = 32
AVG_DEGREE = 10.0
BUDGET = "256M"

SAMPLE_SECONDS = 2.0
PROGRESS_SECONDS = 30.0
SETTLE_SECONDS = 60.0
"""How long the end sample waits for every session to close and the descriptors to stop changing
(a refused connection may linger up to HANDSHAKE_TIMEOUT, a closing one the daemon's CLOSE_GRACE)."""
NO_PROGRESS_SECONDS = 120.0
"""A stream that sends nothing this long counts as a stuck daemon (on 2 busy cores an epoch step takes ms)."""
EPOCHS_PER_SESSION = 2
HOG_PAUSE = 2.0
"""Seconds the hog waits after each eviction before it reconnects."""
CLOSE_WAIT = 15.0
"""Seconds a hostile connection waits for the daemon to close it after an answer (its CLOSE_GRACE is 5 s)."""

RSS_BOUND = 64 << 20
"""RSS may grow this much from start to end: allocator fragmentation and caches that fill up over a few
minutes, far below what a per-connection leak reaches over thousands of hostile connections."""
THREAD_SLACK = 4
"""Thread pools grow on demand up to their size; a few more threads at the end than after the warm-up is
a pool the warm-up did not fill, not a leak (which grows with the number of sessions, into the hundreds)."""
CHECK_FEATURE_BYTES = 1 << 30
"""Batches are checked against the dataset loaded in this process only up to this size of features."""
FORGED_MARK = "SOAK-FORGED"
"""What the hostile client's forged log lines start with; the report counts the daemon log's lines that do."""


@dataclass(frozen=True)
class SoakArgs:
    """The command line: ``--minutes``, ``--nodes``, ``--seed``, ``--work``."""

    minutes: float = 5.0
    nodes: int = 100_000
    seed: int = 0
    work: str | None = None


def parse_args(description: str, argv: list[str] | None = None) -> SoakArgs:
    """``argv`` (default ``sys.argv[1:]``) as ``SoakArgs``; ``description`` is what ``--help`` prints first."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=5.0, help="soak duration after the warm-up (default 5)")
    p.add_argument("--nodes", type=int, default=100_000, help="nodes of the generated graph (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed and the clients' random choices")
    p.add_argument("--work", default=None, help="keep the generated data and the daemon log here (reused)")
    args = p.parse_args(argv)
    return SoakArgs(minutes=args.minutes, nodes=args.nodes, seed=args.seed, work=args.work)


def write_config(path: Path, dataset: Path, sock: Path, port: int, seed: int) -> None:
    path.write_text(f"""[dataset]
path = "{dataset}"
[memory]
budget = "{BUDGET}"
[hierarchy]
megabatch_fraction = 0.25
passes = 1
[sampler]
batch_size = {BATCH_SIZE}
fanouts = {list(FANOUTS)}
eval_fanouts = {list(FANOUTS)}
eval_batch_size = {BATCH_SIZE}
seed = {seed}
[publisher]
slots = {SLOTS}
[server]
socket = "{sock}"
max_clients = {MAX_CLIENTS}
max_pending = {MAX_PENDING}
stall_timeout = {STALL_TIMEOUT}
idle_timeout = {IDLE_TIMEOUT}
[metrics]
port = {port}
""")
