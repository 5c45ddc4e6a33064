"""Faults of the hardening issue: clients that die without a word, and a daemon that dies mid-epoch.

1. A client process is SIGKILLed in each state its session can be in. The kernel closes its socket and
   drops its mapping of the segment; nobody sends a Bye. The daemon must stay up, forget the session
   (slots, memfd, mapping, the training pipeline) and serve a fresh client a whole, correct epoch.
2. ``megabatch serve`` is SIGKILLed while a trainer is in its second epoch. The trainer must fail with
   one line, a daemon restarted over the stale socket file must serve ``--resume``, and the resumed run
   must end exactly where an uninterrupted run ends.

Every wait is on an event (a message, an output line, a change of the daemon's state, a process exit);
timeouts only turn a hang into a failure.
"""

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import tests.daemon_harness as harness
from loader.daemon.config import load_config
from loader.daemon.server import Daemon
from loader.daemon.session import Session
from proto.messages import EpochEnd, StartEpoch, Stats, StatsRequest
from tests.daemon_harness import connect, consume, daemon_config, running_daemon
from tests.paths import REPO_ROOT

T = TypeVar("T")


# --- 1. a client killed in every state -----------------------------------------------------------------

class ObservedDaemon(Daemon):
    """A daemon whose state a test reads on its own loop, and waits on: every change of who is
    connected sets ``changed``, and the tasks that finish the rest (dispose, pipeline stops) are awaited."""

    loop: asyncio.AbstractEventLoop
    changed: asyncio.Event
    stopped: threading.Event

    async def startup(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()
        self.stopped = threading.Event()
        # who holds the pipeline changes in callbacks no awaited task covers (a job emptied, a timer): without this
        # signal a waiter could sleep through the last change and time out on a daemon already settled
        set_owner = self.ownership._set_owner

        def observed_set_owner(owner: Any) -> None:
            set_owner(owner)
            self.changed.set()

        self.ownership._set_owner = observed_set_owner  # type: ignore[method-assign]
        await super().startup()

    async def shutdown(self) -> None:
        try:
            await super().shutdown()
        finally:
            self.stopped.set()

    def _admit(self, conn: socket.socket) -> None:
        super()._admit(conn)
        self.changed.set()

    async def _handshake(self, conn: socket.socket) -> None:
        try:
            await super()._handshake(conn)
        finally:
            self.changed.set()

    def _session_lost(self, session: Session) -> None:
        super()._session_lost(session)
        self.changed.set()

    def on_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the daemon's loop: a consistent view of its state from the test thread."""
        async def call() -> T:
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=60)

    def until(self, predicate: Callable[["ObservedDaemon"], bool], what: str, timeout: float = 60.0) -> None:
        """Block until ``predicate(self)`` holds on the loop; re-checked at every change, never by polling."""
        async def wait() -> None:
            while not predicate(self):
                self.changed.clear()
                busy = {t for t in self.state.tasks if t is not self._accepting} | set(self.ownership.stopping)
                busy |= {s._stream for s in self.state.sessions.values() if s._stream is not None
                         and not s._stream.done()}
                signal_ = asyncio.ensure_future(self.changed.wait())
                try:
                    await asyncio.wait({*busy, signal_}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    signal_.cancel()

        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(wait(), timeout), self.loop)
        try:
            future.result()
        except TimeoutError:
            raise AssertionError(f"the daemon never got to: {what} (state {self.on_loop(self.describe)})") from None

    def describe(self) -> dict[str, Any]:
        st, own = self.state, self.ownership
        return {"sessions": sorted(st.sessions), "pending": len(st.pending), "disposing": len(st.disposing),
                "stopping": len(own.stopping), "pipeline": own.pipeline is not None,
                "owner": own.owner.label if own.owner is not None else None}


def holds(daemon: ObservedDaemon, session: Any) -> bool:
    """Whether ``session``'s job (a lone trainer's own) holds the training pipeline."""
    return session.job is not None and daemon.ownership.owner is session.job.job


def settled(daemon: ObservedDaemon) -> bool:
    """No session, no connection owing its Hello, nothing left to unmap or stop, no training pipeline."""
    st, own = daemon.state, daemon.ownership
    return not (st.sessions or st.pending or st.disposing or own.stopping or own.pipeline is not None
                or own.owner is not None)


@pytest.fixture
def observed(monkeypatch):
    monkeypatch.setattr(harness, "Daemon", ObservedDaemon)


def fingerprint(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in ("n_id", "x", "y", "edge_index", "nodes_per_hop", "edges_per_hop"):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(arrays[name]).tobytes())
    return digest.hexdigest()


def train_epoch(config, epoch: int) -> list[str]:
    """A fresh client's whole training epoch ``epoch``: one fingerprint per batch, in order. Checks the
    stream itself: seq and batch_index 0..n-1 exactly once each (the client's first stream), n = EpochEnd."""
    with connect(config) as client:
        batches, end = consume(client, StartEpoch(epoch=epoch), EpochEnd)
    n = len(batches)
    assert n and end.batches == n and end.epoch == epoch
    assert [r.seq for r, _ in batches] == list(range(n))
    assert [r.batch_index for r, _ in batches] == list(range(n))
    assert {(r.kind, r.epoch, r.num_batches) for r, _ in batches} == {("train", epoch, n)}
    return [fingerprint(arrays) for _, arrays in batches]


@pytest.fixture(scope="module")
def reference_epochs(dataset_3k, tmp_path_factory):
    """Epochs 0 and 1 from a daemon no client ever died on (batches are a function of config and epoch)."""
    config = daemon_config(dataset_3k, tmp_path_factory.mktemp("reference") / "s.sock")
    with running_daemon(config):
        return {epoch: train_epoch(config, epoch) for epoch in (0, 1)}


def open_descriptors() -> list[str]:
    """What every descriptor of this process points to (sockets by inode, files by path)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return sorted(targets)


def memfd_links() -> list[str]:
    """The memfds open in this process (the daemon runs in it): a session segment's read-write and
    read-only descriptors, and the one its mapping keeps."""
    return [target for target in open_descriptors() if target.startswith("/memfd:")]


def session_memfds(session_id: int) -> list[str]:
    return [link for link in memfd_links() if link.startswith(f"/memfd:megabatch-session{session_id} ")]


def segment_mapped(session_id: int) -> bool:
    with open("/proc/self/maps") as maps:
        return f"/memfd:megabatch-session{session_id} " in maps.read()


# The doomed client runs in a process of its own so that SIGKILL gives the real thing: the kernel closes
# its socket and unmaps its segment. It imports only proto (no numba, no torch) to start fast, drives its
# session into STATE, prints "ready" and blocks until killed.
CLIENT = r"""
import select, socket, sys
from proto.client import ControlClient, DaemonShuttingDown
from proto.codec import encode
from proto.messages import (PROTOCOL_VERSION, BatchReady, Credit, EpochEnd, EvalRequest, Hello, Release, StartEpoch,
                            Stats, StatsRequest)

path, state = sys.argv[1], sys.argv[2]
held = []
if state in ("connected", "welcome_unread"):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    if state == "welcome_unread":
        sock.sendall(encode(Hello(PROTOCOL_VERSION, "doomed", 0)))
        # the Welcome and its descriptor wait, unread, in our socket: the kernel holds the fd in flight
        assert select.select([sock], [], [], 60)[0], "no Welcome"
else:
    # a client with a feature cache has the daemon plan every training batch for it (another path)
    cache = 1 << 20 if state == "training_cached" else 0
    client = ControlClient.connect(path, client="doomed " + state, timeout=60, feature_cache_bytes=cache)
    slots = client.welcome.slots.count
    if state != "hello":
        client.send(Credit(count=slots))
    if state == "credit":
        client.send(StatsRequest())  # answered in order: once it is, the daemon has the credit
        assert isinstance(client.recv(timeout=60), Stats)
    elif state == "training_unread":
        client.send(StartEpoch(epoch=0))
        # batches announced but never read: the daemon holds slots for a client that never saw them
        assert select.select([client._sock], [], [], 60)[0], "no BatchReady"
    elif state in ("training", "training_cached", "draining", "eval"):
        client.send(EvalRequest(split="val") if state == "eval" else StartEpoch(epoch=0))
        for _ in range(slots):
            ready = client.recv(timeout=60)
            assert isinstance(ready, BatchReady), ready
            held.append((ready, client.read_batch(ready).arrays))  # views into the mapping, never released
        print("held", held[0][0].num_batches, flush=True)
    elif state == "after_epoch_end":
        client.send(StartEpoch(epoch=0))
        while not isinstance(msg := client.recv(timeout=60), EpochEnd):
            client.send(Release(slot=msg.slot, seq=msg.seq))
    elif state == "stats_unread":
        client.send(StatsRequest())
        # the reply is in our socket, unread: dying now resets the daemon's end instead of a plain EOF
        assert select.select([client._sock], [], [], 60)[0], "no Stats"
print("ready", flush=True)
if state == "draining":
    try:
        client.recv(timeout=60)
    except DaemonShuttingDown:
        print("shutdown", flush=True)
sys.stdin.read()
"""

STATES = ["connected", "welcome_unread", "hello", "credit", "training", "training_cached", "training_unread", "eval",
          "after_epoch_end", "stats_unread"]


def doomed_client(config, state: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CLIENT, str(config.server.socket), state],
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def next_line(child: subprocess.Popen[str]) -> str:
    """The client's next report; its error output if it died instead."""
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline()
    assert line, f"the client died: {child.stderr.read()}"
    return line.rstrip("\n")


def state_reached(state: str, slots: int) -> Callable[[ObservedDaemon], bool]:
    """What the daemon shows once the client is in ``state``: proof that the kill lands where it should."""

    def check(daemon: ObservedDaemon) -> bool:
        st = daemon.state
        if state == "connected":
            return len(st.pending) == 1 and not st.sessions
        if len(st.sessions) != 1 or st.pending:
            return False
        (session,) = st.sessions.values()
        stream = session._stream
        running = stream is not None and not stream.done()
        credit = session.flow._credit
        if state in ("welcome_unread", "hello"):
            return credit == 0 and stream is None
        if state in ("credit", "stats_unread"):
            return credit == slots and stream is None
        if state in ("training", "training_cached"):
            cached = session.trainer_cache is not None
            return (running and session.flow.in_use == slots and holds(daemon, session)
                    and cached == (state == "training_cached"))
        if state == "training_unread":
            return running and session.flow.in_use >= 1 and holds(daemon, session)
        if state == "eval":
            return running and session.flow.in_use == slots and daemon.ownership.owner is None
        assert state == "after_epoch_end"
        # the epoch is over, the pipeline runs ahead into epoch 1 for this session alone
        return (stream is not None and stream.done() and session.flow.in_use == 0 and holds(daemon, session)
                and daemon.ownership.pipeline is not None)

    return check


@pytest.mark.parametrize("state", STATES)
def test_client_killed_in_any_state_leaves_nothing_behind(state, dataset_3k, reference_epochs, tmp_path, observed,
                                                           caplog):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config) as daemon:
        assert isinstance(daemon, ObservedDaemon)
        # libuv opens a reserve descriptor (/dev/null, for EMFILE) at the loop's first connection: a session
        # before the baseline keeps it out of the comparison
        with connect(config) as warm_up:
            warm_up.send(StatsRequest())
            assert isinstance(warm_up.recv(timeout=60), Stats)
        daemon.until(settled, "the warm-up client gone")
        baseline_fds, baseline_memfds = open_descriptors(), memfd_links()
        with doomed_client(config, state) as child:
            if state in ("training", "training_cached", "eval"):
                # the stream must really be mid-way: more batches to come than the client holds
                held = next_line(child).split()
                assert held[0] == "held" and int(held[1]) > daemon.sessions.slots, held
            assert next_line(child) == "ready"
            daemon.until(state_reached(state, daemon.sessions.slots), f"the client's state {state}")
            doomed: Session | None = daemon.on_loop(lambda: next(iter(daemon.state.sessions.values()), None))
            assert (doomed is None) == (state == "connected")
            if doomed is not None:
                assert segment_mapped(doomed.id) and session_memfds(doomed.id)
            child.kill()
            assert child.wait() == -signal.SIGKILL

        daemon.until(settled, "no session, no pipeline, nothing left to dispose")
        assert daemon.metrics.registry.get_sample_value("megabatch_clients") == 0
        assert daemon.metrics.registry.get_sample_value("megabatch_slots_in_use") == 0
        if doomed is not None:
            assert doomed.closed and doomed.segment.closed and doomed.flow.closed
            assert not segment_mapped(doomed.id)  # no view of a slot kept the daemon's mapping alive
            assert not session_memfds(doomed.id)
        assert memfd_links() == baseline_memfds

        # the daemon is up, the training pipeline is free, and a fresh client gets whole, correct epochs;
        # epoch 1 too, which the pipeline had run ahead into for a client killed after its epoch
        assert train_epoch(config, 0) == reference_epochs[0]
        assert train_epoch(config, 1) == reference_epochs[1]
        daemon.until(settled, "the fresh clients gone too")
        assert memfd_links() == baseline_memfds
        assert open_descriptors() == baseline_fds
        assert not daemon.should_exit.is_set()
    # a dead client is an ordinary disconnect: no stream failure, no task exception left unretrieved
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures


def test_client_killed_while_the_daemon_drains_ends_the_drain(dataset_3k, tmp_path, observed, caplog):
    caplog.set_level(logging.INFO, logger="megabatch.server")
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"drain_timeout": 600.0})
    with running_daemon(config) as daemon:
        assert isinstance(daemon, ObservedDaemon)
        baseline_memfds = memfd_links()
        with doomed_client(config, "draining") as child:
            assert next_line(child).startswith("held ") and next_line(child) == "ready"
            daemon.until(state_reached("training", daemon.sessions.slots), "the client holding every slot")
            daemon.loop.call_soon_threadsafe(daemon.handle_exit, signal.SIGTERM)
            assert next_line(child) == "shutdown"
            # the drain waits for the slots the client holds (for drain_timeout, ten minutes) ...
            assert not daemon.stopped.is_set()
            child.kill()
            assert child.wait() == -signal.SIGKILL
            # ... and a client that dies gives them all back at once
            assert daemon.stopped.wait(60), "the daemon still waits for a dead client's slots"
    messages = [r.getMessage() for r in caplog.records]
    assert "drained: every published batch released, the pipeline stopped" in messages, messages
    assert not [m for m in messages if "drain cut short" in m]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert memfd_links() == baseline_memfds
    assert not config.server.socket.exists()


# --- 2. the daemon killed mid-epoch, restarted, and the trainer resumed ------------------------------------

SERVE_TABLES: dict[str, dict[str, Any]] = {
    "memory": {"budget": "256M"}, "hierarchy": {"megabatch_fraction": 0.25, "passes": 1},
    "sampler": {"batch_size": 64, "fanouts": [5, 3], "eval_batch_size": 256, "seed": 0},
    "publisher": {"slots": 3}, "server": {"max_clients": 2}, "metrics": {"port": 0},
}


def write_config(path: Path, dataset: Path, socket_path: Path) -> Path:
    """The TOML ``megabatch serve`` reads (JSON's strings, numbers and lists are valid TOML values)."""
    tables = {"dataset": {"path": str(dataset)}, **SERVE_TABLES,
              "server": {**SERVE_TABLES["server"], "socket": str(socket_path)}}
    path.write_text("".join(f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())
                            for name, values in tables.items()))
    return path


def plain_env() -> dict[str, str]:
    # a journald stream would prefix the error lines with their priority; one torch thread per trainer, as
    # two of them share two cores here (spinning OpenMP workers would triple the time)
    return {**{key: value for key, value in os.environ.items() if key != "JOURNAL_STREAM"}, "OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def serving(config_path: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``megabatch serve`` in a process of its own; killed on the way out if it is still running. Nobody
    waits for it to be ready: the trainers' ``--connect-timeout`` does, as it would in production."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "loader.cli", "serve", "--config", str(config_path)],
                                stdout=log, stderr=subprocess.STDOUT, env=plain_env())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


TRAIN_ARGS = ["--connect-timeout", "120", "--hidden", "16", "--epochs", "3", "--seed", "3", "--device", "cpu",
              "--no-progress"]
DETERMINED = ("epoch", "loss", "train_acc", "val_acc", "test_acc", "val_score", "test_score", "batches", "samples")
"""Fields of an epoch record fixed by the config, the seeds and the epoch (not the clock)."""


def trainer(socket_path: Path, *args: str | Path) -> list[str]:
    return [sys.executable, "-m", "trainer", "--socket", str(socket_path), *TRAIN_ARGS, *map(str, args)]


def outcome(json_path: Path) -> dict[str, Any]:
    result = json.loads(json_path.read_text())
    return {"epochs": [{key: record[key] for key in DETERMINED} for record in result["epochs"]],
            **{key: result[key] for key in ("best_epoch", "best_val_acc", "test_acc_at_best", "best_val_score",
                                            "test_score_at_best", "metric")}}


@pytest.mark.slow
def test_daemon_killed_mid_epoch_then_restarted_and_resumed_matches_an_uninterrupted_run(dataset_3k, tmp_path):
    from proto.client import ControlClient
    from proto.errors import ConnectFailed

    sock, ckpt, log = tmp_path / "s.sock", tmp_path / "ckpt.pt", tmp_path / "serve.log"
    config = write_config(tmp_path / "loader.toml", dataset_3k, sock)
    # the uninterrupted reference runs beside the cut run, on a daemon of its own in this process: the same
    # configuration but for the socket (one process fewer to start on two cores)
    ref_config = daemon_config(dataset_3k, tmp_path / "ref.sock", **SERVE_TABLES)
    assert replace(load_config(config), server=ref_config.server) == ref_config
    with running_daemon(ref_config), serving(config, log) as daemon:
        straight = subprocess.Popen(trainer(ref_config.server.socket, "--json-out", tmp_path / "straight.json"),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plain_env())
        cut = subprocess.Popen(trainer(sock, "--checkpoint", ckpt), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=plain_env())
        try:
            assert cut.stdout is not None and cut.stderr is not None
            lines = []
            for line in cut.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith("epoch 1/3 "):
                    # the trainer checkpoints epoch 1 right after this line, then starts epoch 2: the kill
                    # lands at that boundary or in epoch 2, or, where this process is not scheduled within
                    # the quarter second epoch 2 takes, in epoch 3: the assertions below take either
                    daemon.kill()
                    break
            else:
                raise AssertionError(f"the trainer ended before its first epoch: {lines} {cut.stderr.read()}")
            assert daemon.wait() == -signal.SIGKILL, (lines, log.read_text())
            rest, err = cut.communicate(timeout=300)
            lines += rest.splitlines()
            straight_out, straight_err = straight.communicate(timeout=300)
        finally:
            for proc in (cut, straight):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert straight.returncode == 0, straight_err
        reference = outcome(tmp_path / "straight.json")
        assert [r["epoch"] for r in reference["epochs"]] == [1, 2, 3]

    assert cut.returncode == 1, (lines, err)
    done = len(lines)  # epochs completed (and checkpointed) before the kill
    assert done in (1, 2) and [line.split("  ")[0] for line in lines] == [f"epoch {e}/3" for e in range(1, done + 1)], \
        lines
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1], err
    assert errors[0].startswith("megabatch train: error: the loader daemon closed the connection"), err
    assert errors[0].endswith(f"holds epoch {done}; resume with --resume"), err  # what the user does next

    # SIGKILL left the socket file behind: a client is told it looks stale, and serve replaces it
    assert sock.is_socket()
    with pytest.raises(ConnectFailed, match="connection refused \\(stale socket file"):
        ControlClient.connect(str(sock), client="probe", timeout=30)
    with serving(config, log) as daemon:
        resumed = subprocess.run(trainer(sock, "--checkpoint", ckpt, "--resume",
                                         "--json-out", tmp_path / "resumed.json"),
                                 capture_output=True, text=True, timeout=300, env=plain_env())
        assert resumed.returncode == 0, (resumed.stderr, log.read_text())
        out = resumed.stdout.splitlines()
        assert out[0] == f"resumed from {ckpt} after epoch {done}", out
        assert [line.split("  ")[0] for line in out[1:-1]] == [f"epoch {e}/3" for e in range(done + 1, 4)], out
        assert out[-1] == straight_out.splitlines()[-1], (out, straight_out)
        # bit for bit: the epochs before the kill from the checkpoint of the cut run, the rest trained after
        # the restart
        assert outcome(tmp_path / "resumed.json") == reference
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=120) == 0, log.read_text()
    assert not sock.exists()
