"""The soak's hostile client: one abuse per fresh connection, in shuffled rounds, each answer checked
against proto/PROTOCOL.md (the error code, whether the daemon closes), and attacks on the sealed memfd."""

import collections
import contextlib
import ctypes
import mmap
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Callable

import msgpack

from bench.soak_settings import CLOSE_WAIT, FORGED_MARK, MAX_PENDING, STALL_TIMEOUT
from loader.daemon.server import HANDSHAKE_TIMEOUT
from proto.client import ControlClient
from proto.codec import FrameDecoder, encode
from proto.errors import ConnectionClosed, ProtocolError, RemoteError
from proto.messages import (
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
from proto.shm import recv_with_fds
from proto.sizes import format_size

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
ENDED = ("eof", "reset")
FATAL_CODES = frozenset({"bad_message", "unknown_message", "frame_too_large"})


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
