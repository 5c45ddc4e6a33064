"""``megabatch train --nproc-per-node N``: N ranks on this machine, without torchrun.

The launcher starts N copies of ``python -m trainer`` with this run's arguments, each with the
environment torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT): a launched rank runs exactly the code a torchrun rank runs, and prints its own one-line
errors. The launcher hosts the rendezvous store itself, on a loopback port the kernel picks, so there
is no window in which another program can take a "free" port; TORCHELASTIC_USE_AGENT_STORE tells
the ranks' ``env://`` rendezvous to connect to it rather than start one, as torchrun's agent does.

Threads: each rank gets ``OMP_NUM_THREADS`` = the cores this process may run on divided among the ranks (at
least 1), as torchrun sets it to 1 for several ranks, unless the environment already sets it. Torch's intra-op
pool otherwise starts a thread per core in every rank, and ranks that spin-wait for each other's cores
oversubscribe them: three trainers of 2 threads on 2 cores (a test run beside them) took 10-13x one
trainer's epoch seconds, where fair shares would cost about 4x (docs/DEPLOY.md).

Re-executing under torchrun would need nothing of this, but torchrun reports a failed rank with a
multi-line traceback of its own and keeps log directories; these hundred lines keep one line per
failure and nothing on disk.

Watching: the launcher waits on the ranks' pidfds (no polling). When a rank fails, it says so in one
line, sends the others SIGTERM (a rank whose peer is gone fails at its next collective anyway) and
kills those still running ``STOP_GRACE_S`` later; its exit status is the first failed rank's (128 +
the signal for a rank killed by one). Signals: the ranks run in a process group of their own, so a
terminal's Ctrl-C or a SIGTERM reaches the launcher alone, which passes each on to every rank once
(a first SIGTERM stops all ranks at the same step boundary). Under systemd, use ``KillMode=mixed`` so
that the stop signal goes to the launcher only. A launcher that dies without passing anything on
(SIGKILL, the OOM killer) takes its ranks with it: each asks the kernel for SIGTERM when its parent
dies (``PR_SET_PDEATHSIG``), and a rank stopped so mid-run fails its peers in one line as usual.
"""

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from torch.distributed import TCPStore

__all__ = ["STOP_GRACE_S", "launch", "exit_status", "rank_threads"]

STOP_GRACE_S = 30.0
"""After a rank failed: how long the others have to exit after SIGTERM before SIGKILL (torchrun's default)."""

PROG = "megabatch train"


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when its parent dies."""


def die_with_parent() -> None:
    """In a rank, between fork and exec: have the kernel send it SIGTERM when the launcher dies, however it
    dies (SIGKILL included, which the launcher cannot forward), so no rank outlives its launcher."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def exit_status(returncode: int) -> int:
    """A child's ``returncode`` as a shell exit status: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def rank_threads(environ: dict[str, str], nproc: int, cores: int) -> dict[str, str]:
    """The ``OMP_NUM_THREADS`` a rank of ``nproc`` gets on ``cores`` cores: {} where ``environ`` sets it already
    (the user's choice stands), else the cores shared evenly, at least one thread a rank."""
    if "OMP_NUM_THREADS" in environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cores // nproc))}


def launch(argv: Sequence[str], nproc: int, *, grace_s: float = STOP_GRACE_S) -> int:
    """Run ``python -m trainer *argv`` as ``nproc`` ranks and wait for them all; the exit status of the job
    (0 when every rank exited 0, else the first failed rank's)."""
    store = TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False)
    env = dict(os.environ, WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True",
               **rank_threads(dict(os.environ), nproc, len(os.sched_getaffinity(0))))
    # argparse keeps the last value of a repeated flag: each child is a rank of this job, not a launcher
    command = [sys.executable, "-m", "trainer", *argv, "--nproc-per-node", "1"]
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for rank in range(nproc):
            children.append(subprocess.Popen(command, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                             process_group=0, preexec_fn=die_with_parent))
        return _watch(children, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for child in children:
            if child.poll() is None:  # only when the launcher itself failed: leave no rank behind
                child.kill()
                child.wait()
        del store


def _watch(children: list[subprocess.Popen[bytes]], grace_s: float) -> int:
    nproc = len(children)
    running = {os.pidfd_open(child.pid): rank for rank, child in enumerate(children)}
    first_failure: int | None = None
    deadline: float | None = None
    try:
        while running:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(list(running), [], [], timeout)  # retried after a signal (PEP 475)
            if not ready:
                for rank in running.values():
                    children[rank].kill()
                deadline = None
                continue
            for fd in ready:
                rank = running.pop(fd)
                os.close(fd)
                code = children[rank].wait()
                if code == 0 or first_failure is not None:
                    continue
                first_failure = code
                others = f"; stopping the other {len(running)}" if running else ""
                print(f"{PROG}: rank {rank}/{nproc} {_how(code)}{others}", file=sys.stderr, flush=True)
                for other in running.values():
                    if children[other].poll() is None:
                        children[other].send_signal(signal.SIGTERM)
                deadline = time.monotonic() + grace_s
    finally:
        for fd in running:
            os.close(fd)
    return 0 if first_failure is None else exit_status(first_failure)
