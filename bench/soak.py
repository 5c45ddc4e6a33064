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

import argparse
import collections
import contextlib
import ctypes
import json
import mmap
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import msgpack
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import generated_dataset, machine_description, scrape, stop_process, wait_for_socket  # noqa: E402
from loader.daemon.server import HANDSHAKE_TIMEOUT  # noqa: E402
from loader.format.dataset import open_dataset  # noqa: E402
from loader.sampling.inmemory import InMemoryGraph, load_in_memory  # noqa: E402
from proto.client import ControlClient, DaemonShuttingDown  # noqa: E402
from proto.codec import FrameDecoder, encode  # noqa: E402
from proto.errors import ConnectFailed, ConnectionClosed, ProtocolError, RemoteError, SlotError  # noqa: E402
from proto.messages import (  # noqa: E402
    PROTOCOL_VERSION,
    BatchReady,
    Bye,
    Credit,
    EpochEnd,
    Error,
    EvalEnd,
    EvalRequest,
    Hello,
    Message,
    Release,
    Shutdown,
    StartEpoch,
    Stats,
    StatsRequest,
    Welcome,
)
from proto.shm import recv_with_fds  # noqa: E402
from proto.sizes import format_size  # noqa: E402

PY = sys.executable
RESULTS = ROOT / "bench" / "results"

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
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
ENDED = ("eof", "reset")
FATAL_CODES = frozenset({"bad_message", "unknown_message", "frame_too_large"})


# --- sampling the daemon ------------------------------------------------------------------------------------

@dataclass
class Sample:
    """The daemon's process at one moment: ``t`` seconds since the soak began (negative: warm-up)."""

    t: float
    rss: int
    rss_anon: int
    rss_file: int
    rss_shmem: int
    hwm: int
    fds: int
    memfd_fds: int
    memfd_maps: int
    threads: int
    clients: float | None


def sample_process(pid: int, port: int, t: float) -> Sample:
    """Raises OSError when the process is gone."""
    status: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            status[key] = int(parts[0]) * (1024 if parts[-1] == "kB" else 1)
    fds = memfd_fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        with contextlib.suppress(OSError):  # closed since the listing
            memfd_fds += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:")
    memfd_maps = sum("memfd:" in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    # /proc first, then the scrape: a scrape's handler thread and socket must not be counted
    try:
        clients: float | None = scrape(port).get("megabatch_clients")
    except OSError:
        clients = None
    return Sample(t, status.get("VmRSS", 0), status.get("RssAnon", 0), status.get("RssFile", 0),
                  status.get("RssShmem", 0), status.get("VmHWM", 0), fds, memfd_fds, memfd_maps,
                  status.get("Threads", 0), clients)


class Sampler(threading.Thread):
    """Samples the daemon every SAMPLE_SECONDS until ``stop``; sets ``stop`` itself if the daemon dies."""

    def __init__(self, daemon: "subprocess.Popen[bytes]", port: int, t0: float, stop: threading.Event,
                 progress: Callable[[Sample], None]) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.daemon_process, self.port, self.t0, self.stop, self.progress = daemon, port, t0, stop, progress
        self.samples: list[Sample] = []
        self.died_at: float | None = None

    def run(self) -> None:
        last_progress = 0.0
        while not self.stop.wait(SAMPLE_SECONDS):
            t = time.monotonic() - self.t0
            try:
                if self.daemon_process.poll() is not None:
                    raise OSError("exited")
                sample = sample_process(self.daemon_process.pid, self.port, t)
            except OSError:
                self.died_at = t
                self.stop.set()
                return
            self.samples.append(sample)
            if t - last_progress >= PROGRESS_SECONDS:
                last_progress = t
                self.progress(sample)


def settled_sample(daemon: "subprocess.Popen[bytes]", port: int, t0: float) -> tuple[Sample | None, bool]:
    """A sample with no client connected and the same descriptors as the one before: (sample, settled)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    previous: Sample | None = None
    while True:
        if daemon.poll() is not None:
            return previous, False
        try:
            sample = sample_process(daemon.pid, port, time.monotonic() - t0)
        except OSError:
            return previous, False
        if previous is not None and sample.clients == 0 and \
                (sample.fds, sample.memfd_fds, sample.memfd_maps) == \
                (previous.fds, previous.memfd_fds, previous.memfd_maps):
            return sample, True
        if time.monotonic() > deadline:
            return sample, False
        previous = sample
        time.sleep(1.0)


# --- the well-behaved trainer --------------------------------------------------------------------------------

class Tally:
    """What a client saw: expected ``events`` and unexpected ``errors``, a few examples of each error."""

    def __init__(self) -> None:
        self.events: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, str] = {}

    def error(self, kind: str, detail: object) -> None:
        self.errors[kind] += 1
        self.examples.setdefault(kind, str(detail)[:300])


def connect(path: str, name: str, tally: Tally) -> ControlClient | None:
    try:
        return ControlClient.connect(path, client=name, timeout=30)
    except RemoteError as err:
        # busy: max_clients or max_pending is full (the hostile client's burst does that on purpose)
        tally.events[f"connect refused: {err.code}"] += 1
    except (ConnectFailed, ConnectionClosed, TimeoutError, ProtocolError, OSError) as err:
        tally.error(f"connect: {type(err).__name__}", err)
    return None


class GoodClient(threading.Thread):
    """Trains and evaluates as a trainer does, checking every batch, reconnecting when refused."""

    def __init__(self, path: str, reference: InMemoryGraph | None, stop: threading.Event, seed: int) -> None:
        super().__init__(name="soak-good", daemon=True)
        self.path, self.reference, self.stop = path, reference, stop
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.batches: collections.Counter[str] = collections.Counter()
        self.epoch = 0
        self._next_seq = 0

    def run(self) -> None:
        while not self.stop.is_set():
            client = connect(self.path, "soak-good", self.tally)
            if client is None:
                self.stop.wait(0.3)
                continue
            self.tally.events["sessions"] += 1
            try:
                self.session(client, EPOCHS_PER_SESSION)
            except RemoteError as err:
                # a fatal error for a client that reads and releases everything: evicted, internal, corrupt
                self.tally.error(f"daemon error {err.code}", err)
            except DaemonShuttingDown as err:
                self.tally.error("daemon shutting down", err)
            except (ConnectionClosed, ProtocolError, SlotError, TimeoutError, OSError) as err:
                self.tally.error(type(err).__name__, err)
            except Exception as err:  # a bug of this script must not end the soak unnoticed: it is reported
                self.tally.error(f"soak bug: {type(err).__name__}", err)
            finally:
                client.close("soak: session done")

    def session(self, client: ControlClient, epochs: int, evals: tuple[str, ...] = ()) -> None:
        """Train ``epochs`` epochs (evaluating after each, and while another session trains) then the ``evals``."""
        self._next_seq = 0
        client.send(Credit(count=client.welcome.slots.count))
        trained = 0
        while trained < epochs and not self.stop.is_set():
            result = self.stream(client, StartEpoch(epoch=self.epoch))
            if result == "done":
                self.epoch += 1
                trained += 1
                self.tally.events["epochs"] += 1
            elif result == "refused":
                self.tally.events["StartEpoch refused: another session trains"] += 1
            if self.stream(client, EvalRequest(split=self.rng.choice(("val", "test")))) == "done":
                self.tally.events["evaluations"] += 1
        for split in evals:
            if self.stream(client, EvalRequest(split=split)) == "done":
                self.tally.events["evaluations"] += 1

    def stream(self, client: ControlClient, request: StartEpoch | EvalRequest) -> str:
        """One stream to its end: "done", "refused" (a non-fatal bad_request) or "stopped"."""
        client.send(request)
        end_type = EpochEnd if isinstance(request, StartEpoch) else EvalEnd
        count, last = 0, time.monotonic()
        while True:
            if self.stop.is_set():
                return "stopped"
            try:
                msg = client.recv(timeout=1.0)
            except TimeoutError:
                if time.monotonic() - last > NO_PROGRESS_SECONDS:
                    raise TimeoutError(f"no message for {NO_PROGRESS_SECONDS:g} s in a {request.TAG} stream") \
                        from None
                continue
            except RemoteError as err:
                if err.fatal:
                    raise
                if "is training" not in err.message:
                    self.tally.error("unexpected bad_request", err)
                return "refused"
            last = time.monotonic()
            if isinstance(msg, BatchReady):
                if msg.seq != self._next_seq:
                    self.tally.error("seq gap", f"BatchReady seq {msg.seq}, expected {self._next_seq}")
                self._next_seq = msg.seq + 1
                self.check(client, msg)
                client.send(Release(slot=msg.slot, seq=msg.seq))
                count += 1
                self.batches[msg.kind] += 1
            elif isinstance(msg, end_type):
                if msg.batches != count:
                    self.tally.error("end count", f"{msg} after {count} batches")
                return "done"
            else:
                self.tally.error("unexpected message", msg)

    def check(self, client: ControlClient, msg: BatchReady) -> None:
        """The batch against the dataset; views are dropped before the caller releases the slot."""
        arrays = client.read_batch(msg).arrays
        n_id, x, y, edges = arrays["n_id"], arrays["x"], arrays["y"], arrays["edge_index"]
        seeds = int(arrays["nodes_per_hop"][0])
        if edges.size and (int(edges.min()) < 0 or int(edges.max()) >= n_id.shape[0]):
            self.tally.error("wrong batch", f"seq {msg.seq}: edge_index outside [0, {n_id.shape[0]})")
        if self.reference is not None and not (np.array_equal(x, self.reference.features[n_id])
                                               and np.array_equal(y, self.reference.labels[n_id[:seeds]])):
            self.tally.error("wrong batch", f"seq {msg.seq} ({msg.kind}): x or y differ from the dataset")


# --- the hog ---------------------------------------------------------------------------------------------------

class Hog(threading.Thread):
    """Takes the training pipeline and never gives it back by itself: stalls, or idles after an epoch."""

    def __init__(self, path: str, stop: threading.Event) -> None:
        super().__init__(name="soak-hog", daemon=True)
        self.path, self.stop = path, stop
        self.tally = Tally()
        self.latency: dict[str, list[float]] = {"stall": [], "idle": []}
        """Seconds from the hog's last sign of life (last batch received or EpochEnd) to its eviction."""
        self.epoch = 1_000_000  # other epochs than the good client's: every handover restarts the pipeline

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            client = connect(self.path, "soak-hog", self.tally)
            if client is None:
                self.stop.wait(0.3)
                continue
            variant = ("stall", "idle")[turn % 2]
            turn += 1
            try:
                self.hog(client, variant)
            except RemoteError as err:
                self.tally.error(f"daemon error {err.code}", err)
            except (ConnectionClosed, ProtocolError, SlotError, TimeoutError, OSError) as err:
                self.tally.error(type(err).__name__, err)
            except Exception as err:  # a bug of this script must not end the soak unnoticed: it is reported
                self.tally.error(f"soak bug: {type(err).__name__}", err)
            finally:
                client.close()
            # a trainer restarting after a crash; without it the hog re-takes the pipeline before the good
            # client's next StartEpoch nearly every time (the daemon hands it to whoever asks first)
            self.stop.wait(HOG_PAUSE)

    def recv(self, client: ControlClient, limit: float) -> Message | None:
        """The next message within ``limit`` seconds; None when stopping. Errors raise ``RemoteError``."""
        deadline = time.monotonic() + limit
        while not self.stop.is_set():
            try:
                return client.recv(timeout=1.0)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing from the daemon for {limit:g} s") from None
        return None

    def hog(self, client: ControlClient, variant: str) -> None:
        client.send(Credit(count=client.welcome.slots.count))
        first: Message | None = None
        while first is None:
            if self.stop.is_set():
                return
            client.send(StartEpoch(epoch=self.epoch))
            try:
                first = self.recv(client, NO_PROGRESS_SECONDS)
            except RemoteError as err:
                if err.fatal:
                    raise
                self.tally.events["StartEpoch refused: another session trains"] += 1
                self.stop.wait(0.5)
                first = None
        self.epoch += 1
        self.tally.events[f"owned the pipeline ({variant})"] += 1
        msg: Message | None = first
        last = time.monotonic()
        limit = STALL_TIMEOUT + IDLE_TIMEOUT + NO_PROGRESS_SECONDS
        try:
            while msg is not None:
                if isinstance(msg, BatchReady):
                    self.tally.events["batches taken"] += 1
                    if variant == "idle":
                        client.send(Release(slot=msg.slot, seq=msg.seq))
                elif isinstance(msg, EpochEnd):
                    self.tally.events["epochs finished"] += 1
                else:
                    self.tally.error("unexpected message", msg)
                last = time.monotonic()
                msg = self.recv(client, limit)
        except RemoteError as err:
            latency = time.monotonic() - last
            if err.code != "timeout":
                raise
            reason = "stall" if "stall_timeout" in err.message else "idle" if "idle_timeout" in err.message else None
            if reason != variant:
                self.tally.error(f"evicted for {reason} while {variant}ing", err)
            if reason is not None:
                self.latency[reason].append(latency)
            self.tally.events[f"evicted ({reason})"] += 1


# --- the hostile client ----------------------------------------------------------------------------------------

def punch_hole(fd: int, length: int) -> bool:
    """fallocate(PUNCH_HOLE) over ``length`` bytes (Python's os has no fallocate): whether it worked."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return bool(libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, length) == 0)


def attack_writable(path: str, size: int) -> list[str]:
    """Reopen ``path`` (a /proc/PID/fd link to a segment) read-write and try to break it: what worked."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return []
    broke = []
    try:
        for new_size in (0, size // 2, size + mmap.PAGESIZE):
            with contextlib.suppress(OSError):
                os.ftruncate(fd, new_size)
                broke.append(f"ftruncate to {new_size}")
        with contextlib.suppress(OSError):
            os.pwrite(fd, b"\xff" * 8, 0)
            broke.append("pwrite")
        with contextlib.suppress(OSError):
            mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE).close()
            broke.append("writable shared mmap")
        if punch_hole(fd, size):
            broke.append("hole punch")
    finally:
        os.close(fd)
    return broke


class Raw:
    """A bare connection to the control socket: bytes out, decoded messages (or how it ended) in."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.decoder = FrameDecoder()
        self.pending: collections.deque[Message] = collections.deque()
        self.fds: list[int] = []

    def send(self, data: bytes) -> bool:
        """False when the daemon has already closed (it may stop reading at the first bad byte)."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def recv(self, timeout: float) -> Message | str:
        """The next message, or how the wait ended: "eof", "reset", "timeout", "garbled" (the daemon's bytes)."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            self.sock.settimeout(remaining)
            try:
                data, fds = recv_with_fds(self.sock, 65536, 1)
            except TimeoutError:
                return "timeout"
            except ConnectionResetError:
                return "reset"
            self.fds.extend(fds)
            if not data:
                return "eof"
            try:
                self.pending.extend(self.decoder.feed(data))
            except ProtocolError:
                return "garbled"
        return self.pending.popleft()

    def hello(self, name: str = "soak-hostile", version: int = PROTOCOL_VERSION) -> Message | str:
        self.send(encode(Hello(version, name, os.getpid())))
        return self.recv(30)

    def until_closed(self, timeout: float) -> tuple[str | None, int, str]:
        """Read until the daemon closes: (first error code or None, messages read, how it ended)."""
        first_error, count = None, 0
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv(deadline - time.monotonic())
            if isinstance(msg, str):
                return first_error, count, msg
            count += 1
            if isinstance(msg, Error) and first_error is None:
                first_error = msg.code

    def close(self, abort: bool = False) -> None:
        if abort:
            # RST instead of FIN: a client that crashed with data unread
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


Outcome = tuple[str, bool]
"""What the daemon did (for the report) and whether that is what proto/PROTOCOL.md says it does."""


def describe(msg: Message | str) -> str:
    if isinstance(msg, Error):
        return f"error {msg.code}"
    return msg if isinstance(msg, str) else msg.TAG


def pack(obj: object) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


WRONG_SHAPES: dict[str, bytes] = {
    "array": pack([1, 2, 3]), "integer": pack(5), "string": pack("credit"), "nil": pack(None),
    "map without tag": pack({"count": 1}), "integer tag": pack({"t": 5}), "bytes tag": pack({"t": b"credit"}),
    "integer key": pack({1: 2}), "credit of a string": pack({"t": "credit", "count": "x"}),
    "negative credit": pack({"t": "credit", "count": -1}), "boolean credit": pack({"t": "credit", "count": True}),
    "float credit": pack({"t": "credit", "count": 1.5}), "credit without count": pack({"t": "credit"}),
    "release past int64": pack({"t": "release", "slot": 2**64 - 1, "seq": 0}),
    "NaN seq": pack({"t": "release", "slot": 0, "seq": float("nan")}),
    "epoch past u32": pack({"t": "start_epoch", "epoch": 2**32}),
    "eval of the train split": pack({"t": "eval_request", "split": "train"}),
    "unknown tag": pack({"t": "cancel", "epoch": 0}),
    "field nested 1000 deep": b"\x82\xa1t\xa6credit\xa5count" + b"\x91" * 1000 + b"\x00",
    "map of 1025 entries": pack({"t": "credit", **{f"k{i}": i for i in range(1025)}}),
}
HUGE_CLAIMS: dict[str, bytes] = {
    "str32 of 4 GiB": b"\xdb\xff\xff\xff\xff" + b"a" * 64,
    "bin32 of 4 GiB": b"\xc6\xff\xff\xff\xff" + b"a" * 64,
    "array32 of 2^32-1": b"\xdd\xff\xff\xff\xff" + b"\x00" * 64,
    "map32 of 2^32-1": b"\xdf\xff\xff\xff\xff" + b"\xa1t" * 32,
    "ext32 of 4 GiB": b"\xc9\xff\xff\xff\xff\x01" + b"a" * 64,
    "tag of 4 GiB": b"\x81\xa1t\xdb\xff\xff\xff\xff" + b"a" * 64,
    "1 MiB string, 100 KB sent": b"\x81\xa1t\xdb\x00\x10\x00\x00" + b"a" * 100_000,
}
WRONG_SENDER: dict[str, Message] = {
    "batch_ready": BatchReady(slot=0, seq=0, kind="train", epoch=0, pass_index=0, batch_index=0, num_batches=1),
    "stats": Stats(values={"x": 1.0}), "epoch_end": EpochEnd(epoch=0, batches=0, passes=1),
    "eval_end": EvalEnd(split="val", batches=0), "shutdown": Shutdown(reason="soak"),
    "hello again": Hello(PROTOCOL_VERSION, "again", 1),
}


class Hostile(threading.Thread):
    """One abuse per fresh connection, in shuffled rounds of ``abuses``; checks and counts the answers."""

    def __init__(self, path: str, daemon_pid: int, stop: threading.Event, seed: int) -> None:
        super().__init__(name="soak-hostile", daemon=True)
        self.path, self.daemon_pid, self.stop = path, daemon_pid, stop
        self.rng = random.Random(seed)
        self.connections = 0
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.unexpected: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, str] = {}
        self.breaches: list[str] = []
        self.abuses: list[tuple[str, int, Callable[[], Outcome]]] = [
            ("random bytes before Hello", 3, self.garbage_before_hello),
            ("random bytes after Hello", 3, self.garbage_after_hello),
            ("huge declared length", 3, self.huge_claim),
            ("valid msgpack, wrong shape", 4, self.wrong_shape),
            ("request before Hello", 1, self.request_before_hello),
            ("message only the daemon sends", 2, self.wrong_sender),
            ("client's own Error", 1, self.client_error),
            ("Bye, then more", 1, self.bye_then_more),
            ("second stream while one runs", 2, self.second_stream),
            ("release of garbage", 2, self.release_garbage),
            ("credit past int64", 1, self.credit_overflow),
            ("StatsRequest flood, replies unread", 1, self.stats_flood),
            ("connect, no Hello, close", 2, self.no_hello_close),
            ("no Hello until the handshake timeout", 1, self.no_hello_timeout),
            ("burst past max_pending", 1, self.pending_burst),
            ("attack the sealed memfd", 2, self.memfd_attack),
            ("abrupt close (RST) mid-stream", 3, self.abrupt_close),
            ("Hello of another version", 1, self.wrong_version),
            ("forged client name", 1, self.forged_name),
        ]

    def run(self) -> None:
        actions = {name: action for name, _, action in self.abuses}
        deck: list[str] = []
        while not self.stop.is_set():
            if not deck:
                # rounds of a shuffled deck, each abuse ``weight`` times: a short soak still runs every one
                deck = [name for name, weight, _ in self.abuses for _ in range(weight)]
                self.rng.shuffle(deck)
            name = deck.pop()
            try:
                outcome, ok = actions[name]()
            except RemoteError as err:
                # a handshake refused with busy: max_clients is full of the other clients' sessions
                outcome, ok = f"refused {err.code}", err.code == "busy"
            except Exception as err:  # OSError: the daemon misbehaved; anything else: a bug here. Both reported
                outcome, ok = f"{type(err).__name__}: {err}", False
            self.outcomes[name][outcome] += 1
            if not ok:
                self.unexpected[name] += 1
                self.examples.setdefault(name, outcome)
            self.stop.wait(0.05)  # leave the two cores some room for the trainers

    # -- helpers ------------------------------------------------------------------------------------------
    def open(self) -> Raw:
        self.connections += 1
        return Raw(self.path)

    def session(self) -> tuple[Raw, Welcome]:
        """A connection past its handshake; RemoteError when refused (busy)."""
        raw = self.open()
        reply = raw.hello()
        if isinstance(reply, Welcome):
            return raw, reply
        raw.close()
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        raise OSError(f"handshake ended with {describe(reply)}")

    def fatal(self, raw: Raw, data: bytes, codes: frozenset[str], required: bool = True) -> Outcome:
        """Send ``data``, half-close, read to the end: the daemon must answer one of ``codes`` and close."""
        raw.send(data)
        with contextlib.suppress(OSError):
            raw.sock.shutdown(socket.SHUT_WR)
        code, _, end = raw.until_closed(CLOSE_WAIT)
        raw.close()
        ok = end in ENDED and (code in codes or (code is None and not required))
        return f"{code or 'no error'}, then {end}", ok

    # -- abuses -------------------------------------------------------------------------------------------
    def garbage_before_hello(self) -> Outcome:
        # an unfinished frame at our EOF is closed without a word; a bad first byte is answered
        return self.fatal(self.open(), self.rng.randbytes(self.rng.randint(1, 4096)), FATAL_CODES, required=False)

    def garbage_after_hello(self) -> Outcome:
        raw, _ = self.session()
        return self.fatal(raw, self.rng.randbytes(self.rng.randint(1, 4096)), FATAL_CODES, required=False)

    def huge_claim(self) -> Outcome:
        label = self.rng.choice(sorted(HUGE_CLAIMS))
        raw = self.session()[0] if self.rng.random() < 0.5 else self.open()
        outcome, ok = self.fatal(raw, HUGE_CLAIMS[label], frozenset({"frame_too_large", "bad_message"}))
        return f"{label}: {outcome}", ok

    def wrong_shape(self) -> Outcome:
        label = self.rng.choice(sorted(WRONG_SHAPES))
        raw, _ = self.session()
        outcome, ok = self.fatal(raw, WRONG_SHAPES[label], FATAL_CODES)
        return f"{label}: {outcome}", ok

    def request_before_hello(self) -> Outcome:
        request = self.rng.choice([StartEpoch(epoch=0), StatsRequest(), Credit(count=4), Bye("")])
        outcome, ok = self.fatal(self.open(), encode(request), frozenset({"bad_message"}))
        return f"{request.TAG}: {outcome}", ok

    def wrong_sender(self) -> Outcome:
        raw, welcome = self.session()
        label = self.rng.choice([*sorted(WRONG_SENDER), "welcome"])
        msg = welcome if label == "welcome" else WRONG_SENDER[label]
        outcome, ok = self.fatal(raw, encode(msg), frozenset({"bad_message"}))
        return f"{label}: {outcome}", ok

    def client_error(self) -> Outcome:
        raw, _ = self.session()
        forged = f"x\n<3>megabatch: {FORGED_MARK} client error\x1b[2J" + "z" * 3000
        # a fatal Error from the client ends the session without an answer
        return self.fatal(raw, encode(Error("internal", forged)), frozenset(), required=False)

    def bye_then_more(self) -> Outcome:
        raw, _ = self.session()
        return self.fatal(raw, encode(Bye("soak")) + encode(StatsRequest()) * 10, frozenset(), required=False)

    def second_stream(self) -> Outcome:
        """Credit 1, two evaluations at once: the second is a non-fatal bad_request, the first goes on."""
        raw, _ = self.session()
        raw.send(encode(Credit(count=1)) + encode(EvalRequest(split="val")) + encode(EvalRequest(split="test")))
        seen: list[str] = []
        while "error bad_request" not in seen or "batch_ready" not in seen:
            msg = raw.recv(30)
            seen.append(describe(msg))
            if isinstance(msg, str) or (isinstance(msg, Error) and msg.fatal):
                break
        raw.close(abort=True)
        ok = "error bad_request" in seen and "batch_ready" in seen and not any(
            s in ("eof", "reset", "timeout", "garbled") or (s.startswith("error ") and s != "error bad_request")
            for s in seen)
        return ", ".join(dict.fromkeys(seen)), ok

    def release_garbage(self) -> Outcome:
        raw, _ = self.session()
        slot, seq = self.rng.randrange(2**63), self.rng.randrange(2**63)
        raw.send(encode(Release(slot=slot, seq=seq)) + encode(StatsRequest()))
        first, second = describe(raw.recv(30)), describe(raw.recv(30))
        raw.send(encode(Bye("soak")))
        code, _, end = raw.until_closed(CLOSE_WAIT)
        raw.close()
        return f"{first}, {second}, then {end}", (first, second) == ("error bad_request", "stats") and end in ENDED

    def credit_overflow(self) -> Outcome:
        """Credits summing past 2^64, then an evaluation: two batches must come, nothing must break."""
        raw, _ = self.session()
        raw.send(encode(Credit(count=2**63 - 1)) * 3 + encode(EvalRequest(split="val")))
        seen = []
        for _ in range(2):
            msg = raw.recv(60)
            seen.append(describe(msg))
            if not isinstance(msg, BatchReady):
                break
            raw.send(encode(Release(slot=msg.slot, seq=msg.seq)))
        raw.close(abort=True)
        return ", ".join(seen), seen == ["batch_ready", "batch_ready"]

    def stats_flood(self) -> Outcome:
        """StatsRequests unread until our socket is full; the daemon must stop reading and evict us."""
        raw, _ = self.session()
        chunk = encode(StatsRequest()) * 4096
        raw.sock.setblocking(False)
        sent = 0
        with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
            while sent < 64 << 20:
                sent += raw.sock.send(chunk)
        raw.sock.setblocking(True)
        if sent >= 64 << 20:
            raw.close()
            return f"the daemon took {format_size(sent)} of requests without pausing", False
        # eviction aborts the connection: reading afterwards finds what was queued, then the end
        self.stop.wait(STALL_TIMEOUT + 3)
        code, count, end = raw.until_closed(STALL_TIMEOUT + CLOSE_WAIT)
        raw.close()
        return f"{format_size(sent)} sent, {count} replies read, {code or 'no error'}, then {end}", end in ENDED

    def no_hello_close(self) -> Outcome:
        raw = self.open()
        self.stop.wait(self.rng.random() * 0.5)
        raw.close(abort=self.rng.random() < 0.5)
        return "closed", True

    def no_hello_timeout(self) -> Outcome:
        raw = self.open()
        code, _, end = raw.until_closed(HANDSHAKE_TIMEOUT + CLOSE_WAIT)
        raw.close()
        return f"{code or 'no error'}, then {end}", code == "bad_message" and end in ENDED

    def pending_burst(self) -> Outcome:
        """MAX_PENDING + 2 connections without a Hello: those past the cap get busy at once."""
        raws: list[Raw] = []
        try:
            for _ in range(MAX_PENDING + 2):
                raws.append(self.open())
            self.stop.wait(1.0)  # the daemon refuses at accept: by then every answer is in our buffers
            answers = collections.Counter(describe(raw.recv(0.05)) for raw in raws)
        finally:
            for raw in raws:
                raw.close()
        return ", ".join(f"{n} {what}" for what, n in sorted(answers.items())), answers["error busy"] >= 1

    def memfd_attack(self) -> Outcome:
        """Resize, write, map writable, punch: our descriptor, a reopen of it, and the daemon's own one."""
        client = ControlClient.connect(self.path, client="soak-hostile-memfd", timeout=30)
        self.connections += 1
        try:
            fd, size = client.segment.fd, client.welcome.slots.segment_bytes
            broke = []
            for new_size in (0, size + mmap.PAGESIZE):
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, new_size)
                    broke.append(f"ftruncate of the received descriptor to {new_size}")
            broke += [f"reopened: {b}" for b in attack_writable(f"/proc/self/fd/{fd}", size)]
            ours = os.fstat(fd).st_ino
            for entry in os.listdir(f"/proc/{self.daemon_pid}/fd"):
                link = f"/proc/{self.daemon_pid}/fd/{entry}"
                with contextlib.suppress(OSError):
                    if os.readlink(link).startswith("/memfd:") and os.stat(link).st_ino == ours:
                        broke += [f"daemon's descriptor: {b}" for b in attack_writable(link, size)]
            if broke:
                self.breaches.extend(broke)
            # the moment a broken segment kills the daemon: its next write into one of these slots
            client.send(Credit(count=1))
            client.send(EvalRequest(split="test"))
            try:
                msg = client.recv(timeout=60)
                after = describe(msg)
                ok = isinstance(msg, BatchReady) and not broke
            except (RemoteError, ConnectionClosed, TimeoutError) as err:
                after, ok = f"{type(err).__name__}: {err}", False
        finally:
            client.close()
        return f"{'; '.join(broke) or 'seals held'}; then {after}", ok

    def abrupt_close(self) -> Outcome:
        raw, welcome = self.session()
        request = self.rng.choice([StartEpoch(epoch=self.rng.randrange(4)), EvalRequest(split="val"),
                                   EvalRequest(split="test")])
        raw.send(encode(Credit(count=welcome.slots.count)) + encode(request))
        msg = raw.recv(self.rng.random() * 2)  # mid-stream, or before the first batch
        raw.close(abort=True)
        what = describe(msg)
        # StartEpoch may be refused (another session trains) and the wait may end first: both fine
        return f"{request.TAG}: {what}", what in ("batch_ready", "timeout", "error bad_request")

    def wrong_version(self) -> Outcome:
        raw = self.open()
        return self.fatal(raw, encode(Hello(PROTOCOL_VERSION + 1 + self.rng.randrange(1000), "soak", 1)),
                          frozenset({"unsupported_version"}))

    def forged_name(self) -> Outcome:
        raw = self.open()
        reply = raw.hello(f"soak\n<3>megabatch: {FORGED_MARK} session 1: root connected\x1b[2J" + "y" * 5000)
        raw.close()
        return describe(reply), isinstance(reply, Welcome)


# --- the daemon, its log, the report ----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=5.0, help="soak duration after the warm-up (default 5)")
    p.add_argument("--nodes", type=int, default=100_000, help="nodes of the generated graph (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed and the clients' random choices")
    p.add_argument("--work", default=None, help="keep the generated data and the daemon log here (reused)")
    args = p.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
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
    result: dict[str, object] = {"machine": machine_description(), "args": vars(args), "dataset": str(dataset),
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
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=2, default=str))
    (RESULTS / "soak.md").write_text(report + "\n")
    failed = [c for c, s, _ in checks if s == "FAIL"]
    print(f"soak: {'FAILED: ' + '; '.join(failed) if failed else 'passed'} (log: {log_path})")
    return 1 if failed else 0


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


if __name__ == "__main__":
    sys.exit(main())
