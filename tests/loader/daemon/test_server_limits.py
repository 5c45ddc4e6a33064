"""The daemon against hostile or broken clients: access control, stall and idle eviction, bounded output
buffers, the cap on connections waiting for their Hello, accept failures, sanitized log lines and a
non-fatal bad release. After each misbehaving client, a well-behaved one is shown to be served."""

import contextlib
import errno
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import loader.daemon.peers
import loader.daemon.server
from loader.daemon.config import config_from_mapping
from loader.daemon.server import Daemon
from loader.daemon.session import WRITE_BUFFER_HIGH, ControlProtocol, Session, loggable
from proto.client import ControlClient
from proto.codec import encode
from proto.errors import RemoteError, UserError
from proto.messages import (
    PROTOCOL_VERSION,
    BatchReady,
    EpochEnd,
    Error,
    EvalEnd,
    EvalRequest,
    Hello,
    Release,
    StartEpoch,
    Stats,
    StatsRequest,
)
from proto.shm import recv_with_fds
from tests.daemon_harness import connect, consume, daemon_config, read_message, running_daemon
from tests.paths import REPO_ROOT


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    value = daemon.metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def raw_socket(config) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(config.server.socket))
    return sock


def memfds() -> int:
    """memfds open in this process (the daemon runs in it): a session's segment is one."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
    return count


def group_not_held() -> int:
    held = {os.getgid(), os.getegid(), *os.getgroups()}
    return next(g for g in range(50000, 60000) if g not in held)


# --- configuration -----------------------------------------------------------------------------------

def test_server_limit_keys_default_parse_and_name_themselves_in_errors():
    d = config_from_mapping({"dataset": {"path": "/d"}}).server
    assert (d.allow_uids, d.allow_gids, d.stall_timeout, d.idle_timeout, d.max_pending) == ((), (), 30.0, 60.0, 16)
    s = config_from_mapping({"dataset": {"path": "/d"}, "server": {
        "allow_uids": [1001, 0, 1001], "allow_gids": [50], "stall_timeout": 2, "idle_timeout": 0.5,
        "max_pending": 3}}).server
    assert (s.allow_uids, s.allow_gids, s.stall_timeout, s.idle_timeout, s.max_pending) == ((0, 1001), (50,), 2.0,
                                                                                           0.5, 3)
    for key, value, expected in [("allow_uids", 1000, "[server] allow_uids: expected a list"),
                                 ("allow_uids", [-1], "[server] allow_uids: must be >= 0"),
                                 ("allow_gids", [True], "[server] allow_gids: expected an integer"),
                                 ("allow_gids", [2**32 - 1], "[server] allow_gids: must be <="),
                                 ("stall_timeout", 0, "[server] stall_timeout: expected a positive number"),
                                 ("idle_timeout", "60", "[server] idle_timeout: expected a positive number"),
                                 ("max_pending", 0, "[server] max_pending: must be >= 1")]:
        with pytest.raises(UserError) as err:
            config_from_mapping({"dataset": {"path": "/d"}, "server": {key: value}})
        assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)


def test_loggable_escapes_control_characters_and_caps_the_length():
    assert loggable("trainer pid 7") == "trainer pid 7"
    assert loggable("a\nb\x1b[31mc\\d\u2028") == "a\\x0ab\\x1b[31mc\\\\d\\u2028"
    long = loggable("x" * 10_000, limit=50)
    assert long.startswith("x" * 50) and long.endswith("(9950 more characters)") and len(long) < 80
    assert loggable("\n" * 100, limit=8) == "\\x0a\\x0a... (98 more characters)"


# --- 1. access control ----------------------------------------------------------------------------------

def test_peer_outside_the_allow_lists_is_refused_before_any_session(dataset_3k, tmp_path, caplog):
    config = daemon_config(dataset_3k, tmp_path / "s.sock",
                           server={"allow_uids": [os.geteuid() + 1], "allow_gids": [group_not_held()]})
    caplog.set_level(logging.WARNING, logger="megabatch")
    with running_daemon(config) as daemon:
        before = memfds()
        with raw_socket(config) as sock:
            reply = read_message(sock)  # sent before the daemon reads anything
            assert isinstance(reply, Error) and reply.fatal, reply
            assert reply.code == "forbidden" and f"uid {os.geteuid()}" in reply.message
            assert "allow_uids" in reply.message
            # a Hello sent after the refusal still goes through, so a client always reads the reason
            sock.sendall(encode(Hello(PROTOCOL_VERSION, "late", os.getpid())))
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1) == b""
        with pytest.raises(RemoteError) as err:
            ControlClient.connect(str(config.server.socket), client="refused", timeout=30)
        assert err.value.code == "forbidden"
        assert daemon.state.next_session == 1 and not daemon.state.sessions and not daemon.state.pending
        assert memfds() == before
        assert metric(daemon, "megabatch_refused_connections_total", reason="forbidden") == 2
    assert any("forbidden" in r.getMessage() for r in caplog.records)


def test_default_lists_admit_the_own_uid_and_a_listed_group_admits_too(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config) as daemon:
        assert daemon.allow_uids == {os.geteuid()}
        assert daemon.allow_gids == {os.stat(config.server.socket).st_gid}
        with connect(config) as client:
            client.send(StatsRequest())
            assert isinstance(client.recv(timeout=30), Stats)
    by_group = daemon_config(dataset_3k, tmp_path / "g.sock", server={"allow_uids": [os.geteuid() + 1],
                                                                   "allow_gids": [os.getegid()]})
    with running_daemon(by_group) as daemon, connect(by_group) as client:
        client.send(StatsRequest())
        assert isinstance(client.recv(timeout=30), Stats)
        assert metric(daemon, "megabatch_refused_connections_total", reason="forbidden") == 0


CHILD = """
import os, sys
from proto.client import ControlClient
from proto.errors import RemoteError
path, groups, gid = sys.argv[1], [int(g) for g in sys.argv[2].split(",") if g], int(sys.argv[3])
os.setgroups(groups)
os.setgid(gid)
try:
    ControlClient.connect(path, client="child", timeout=30).close()
    print("welcome")
except RemoteError as err:
    print(err.code)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a process's groups needs root")
def test_a_supplementary_group_admits_a_peer(dataset_3k, tmp_path):
    granted, other = group_not_held(), group_not_held() + 1
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"allow_uids": [os.geteuid() + 1],
                                                                 "allow_gids": [granted]})

    def child(groups: list[int]) -> str:
        # another process: the kernel records credentials per connecting process (SO_PEERCRED, SO_PEERGROUPS)
        run = subprocess.run([sys.executable, "-c", CHILD, str(config.server.socket), ",".join(map(str, groups)),
                              str(other)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    with running_daemon(config):
        assert child([granted]) == "welcome"  # primary group `other`, supplementary `granted`
        assert child([]) == "forbidden"


# --- 2. stalled and idle owners of the training pipeline -----------------------------------------------------

def test_owner_holding_every_slot_is_evicted_and_the_next_trainer_trains(dataset_3k, tmp_path):
    # long enough that the well-behaved second trainer never waits that long to release a slot
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"stall_timeout": 2.0})
    with running_daemon(config) as daemon:
        first = connect(config)
        first.send(StartEpoch(epoch=0))
        held = [first.recv(timeout=60) for _ in range(first.welcome.slots.count)]
        assert all(isinstance(m, BatchReady) for m in held)
        with pytest.raises(RemoteError) as err:  # never releases any
            first.recv(timeout=60)
        assert err.value.code == "timeout" and err.value.fatal and "stall_timeout" in err.value.message
        first.close()
        with connect(config) as second:
            batches, end = consume(second, StartEpoch(epoch=0), EpochEnd)
            assert len(batches) == end.batches == held[0].num_batches
        assert metric(daemon, "megabatch_evictions_total", reason="stall") == 1


def test_owner_idle_after_its_epoch_loses_the_pipeline_to_the_next_trainer_and_stays_connected(dataset_3k,
                                                                                                tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"idle_timeout": 0.5})
    with running_daemon(config) as daemon:
        with connect(config) as first, connect(config) as second:
            consume(first, StartEpoch(epoch=0), EpochEnd)
            second.send(StartEpoch(epoch=0))  # while the first still holds the pipeline, not idle long enough
            with pytest.raises(RemoteError) as refused:
                second.recv(timeout=60)
            assert refused.value.code == "bad_request" and "one training stream" in refused.value.message
            # the first evaluates (which does not count as using the pipeline) and starts no epoch: once
            # idle_timeout has passed, the second's next StartEpoch takes the pipeline
            while True:
                consume(first, EvalRequest(split="val"), EvalEnd)
                batches, end = consume_or_refusal(second, StartEpoch(epoch=0))
                if batches is not None:
                    break
            assert batches and len(batches) == end.batches
            assert metric(daemon, "megabatch_training_pipeline_revoked_total") == 1
            # the first was not evicted: it waits its turn like anyone (it asked not to queue: refused now)
            first.send(StartEpoch(epoch=1))
            with pytest.raises(RemoteError) as busy:
                first.recv(timeout=60)
            assert busy.value.code == "bad_request" and "session 2 is training" in busy.value.message
            second.close()
            consume(first, StartEpoch(epoch=1), EpochEnd)
        assert metric(daemon, "megabatch_evictions_total", reason="stall") == 0


def consume_or_refusal(client, start: StartEpoch):
    """The epoch's batches and EpochEnd, or (None, None) if the daemon refused the StartEpoch as busy."""
    try:
        return consume(client, start, EpochEnd)
    except RemoteError as err:
        assert err.code == "bad_request" and "one training stream" in err.message, err
        return None, None


# --- 3. a client that never reads its replies ---------------------------------------------------------------

@pytest.fixture
def paused_protocols(monkeypatch):
    """ControlProtocols whose output went over the high-water mark, and an event set at the first."""
    seen: list[ControlProtocol] = []
    event = threading.Event()
    original = ControlProtocol.pause_writing

    def pause_writing(self: ControlProtocol) -> None:
        original(self)
        seen.append(self)
        event.set()

    monkeypatch.setattr(ControlProtocol, "pause_writing", pause_writing)
    return seen, event


def hello_only(config, name: str) -> socket.socket:
    """A raw session: Hello sent, Welcome and the segment descriptor received and dropped."""
    sock = raw_socket(config)
    sock.sendall(encode(Hello(PROTOCOL_VERSION, name, os.getpid())))
    data, fds = recv_with_fds(sock, 65536, 1)
    for fd in fds:
        os.close(fd)
    assert data and len(fds) == 1
    return sock


def flood_until_paused(sock: socket.socket, paused: threading.Event, limit: int = 64 << 20) -> int:
    """Send StatsRequests without reading a reply until our socket buffer is full, then wait for the daemon
    to pause the session; fails if the daemon took ``limit`` bytes without ever filling our buffer.

    A full buffer is enough: its requests (16 bytes each) ask for about ten times their size in replies,
    far more than the daemon's socket buffer and its write-buffer mark together, so a daemon that goes on
    reading them must pause."""
    chunk = encode(StatsRequest()) * 4096
    sock.setblocking(False)
    sent = 0
    while sent < limit:
        try:
            sent += sock.send(chunk)
        except BlockingIOError:
            assert paused.wait(60), f"{sent} bytes of requests sent and the daemon has not paused the session"
            return sent
        except (BrokenPipeError, ConnectionResetError):
            return sent
    raise AssertionError(f"the daemon took {sent} bytes of requests without pausing the session")


def test_unread_replies_pause_reading_with_a_bounded_buffer(dataset_3k, tmp_path, paused_protocols):
    seen, paused = paused_protocols
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config), hello_only(config, "flooder") as flooder:
        sent = flood_until_paused(flooder, paused)
        protocol = seen[0]
        session = protocol.session
        frame = len(encode(Stats(session.stats())))
        assert sent > 100 * frame  # far more replies asked for than the buffer may hold
        assert session.output_paused and session.output_pauses == 1 and not session.closed
        # the daemon stopped at the first reply past the mark: its socket buffer is full, so nothing moves
        assert protocol.write_buffer_size() <= WRITE_BUFFER_HIGH + frame
        with connect(config) as good:
            good.send(StatsRequest())
            assert isinstance(good.recv(timeout=30), Stats)
            batches, _ = consume(good, StartEpoch(epoch=0), EpochEnd)
            assert batches
        assert protocol.write_buffer_size() <= WRITE_BUFFER_HIGH + frame


def test_client_leaving_replies_unread_is_evicted(dataset_3k, tmp_path, paused_protocols, monkeypatch):
    seen, paused = paused_protocols
    evicted: list[str] = []
    done = threading.Event()
    original = Session.evict

    def evict(self: Session, reason: str, message: str) -> None:
        original(self, reason, message)
        evicted.append(reason)
        done.set()

    monkeypatch.setattr(Session, "evict", evict)
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"stall_timeout": 0.5})
    with running_daemon(config) as daemon, hello_only(config, "flooder") as flooder:
        flood_until_paused(flooder, paused)
        assert done.wait(60)
        assert evicted == ["unread"] and seen[0].session.closed
        flooder.settimeout(30)
        with contextlib.suppress(ConnectionResetError):  # an abort, or end of stream; a timeout fails
            while flooder.recv(1 << 20):  # the replies still in our socket buffer
                pass
        assert metric(daemon, "megabatch_evictions_total", reason="unread") == 1
        with connect(config) as good:
            good.send(StatsRequest())
            assert isinstance(good.recv(timeout=30), Stats)


# --- 4. connections waiting for their Hello, and accept failures ----------------------------------------------

def test_connections_past_max_pending_are_closed_at_once(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"max_pending": 2})
    with running_daemon(config) as daemon:
        waiting = [raw_socket(config), raw_socket(config)]  # connected, no Hello yet
        with raw_socket(config) as third:
            reply = read_message(third)
            assert isinstance(reply, Error) and reply.code == "busy" and "max_pending" in reply.message
            third.shutdown(socket.SHUT_WR)
            assert third.recv(1) == b""
        assert metric(daemon, "megabatch_refused_connections_total", reason="pending") == 1
        # the two waiting ones are still served, and past their Hello they leave room for others
        clients = [ControlClient.handshake(sock, client="late", timeout=30) for sock in waiting]
        with connect(config) as fourth:
            fourth.send(StatsRequest())
            assert isinstance(fourth.recv(timeout=30), Stats)
        for client in clients:
            client.close()
        assert daemon.state.next_session == 4


def test_accept_failures_back_off_log_a_bounded_number_of_lines_and_recover(dataset_3k, tmp_path, monkeypatch,
                                                                            caplog):
    failures = 5
    calls = []
    original = Daemon._accept

    async def failing_accept(self: Daemon) -> socket.socket:
        calls.append(1)
        if len(calls) <= failures:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return await original(self)

    monkeypatch.setattr(Daemon, "_accept", failing_accept)
    monkeypatch.setattr(loader.daemon.server, "ACCEPT_BACKOFF", 0.01)
    caplog.set_level(logging.WARNING, logger="megabatch")
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    t0 = time.monotonic()
    with running_daemon(config) as daemon, connect(config) as client:
        elapsed = time.monotonic() - t0
        client.send(StatsRequest())
        assert isinstance(client.recv(timeout=30), Stats)
        assert metric(daemon, "megabatch_accept_errors_total") == failures
    lines = [r.getMessage() for r in caplog.records if "accept failed" in r.getMessage()]
    assert lines and "Too many open files" in lines[0]
    # one line per LOG_INTERVAL, however fast accept fails (unthrottled: one per failure, 32,918 in 5 s)
    assert len(lines) <= 1 + int(elapsed // loader.daemon.peers.LOG_INTERVAL)


# --- 5. client strings in the log ------------------------------------------------------------------------------

def test_client_name_is_escaped_and_capped_in_the_log(dataset_3k, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="megabatch")
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    forged = "x\n2026-01-01 INFO megabatch.server: session 9: root connected\x1b[2J" + "y" * 5000
    with running_daemon(config):
        client = ControlClient.connect(str(config.server.socket), client=forged, timeout=30)
        client.close()
    lines = [r.getMessage() for r in caplog.records if "connected (" in r.getMessage()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "\n" not in line and "\x1b" not in line
    assert "x\\x0a2026-01-01" in line and "\\x1b[2J" in line and "more characters" in line
    assert len(line) < 400


# --- 6. a release of a slot the client does not hold ------------------------------------------------------------

def test_release_of_a_slot_not_held_is_a_non_fatal_bad_request(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config) as daemon, connect(config) as client:
        client.send(Release(slot=0, seq=99))
        with pytest.raises(RemoteError) as err:
            client.recv(timeout=30)
        assert err.value.code == "bad_request" and not err.value.fatal and "does not hold" in err.value.message
        client.send(StatsRequest())  # the session goes on
        assert isinstance(client.recv(timeout=30), Stats)
        batches, end = consume(client, StartEpoch(epoch=0), EpochEnd)
        first = batches[0][0]
        client.send(Release(slot=first.slot, seq=first.seq))  # released already: not held any more
        with pytest.raises(RemoteError) as again:
            client.recv(timeout=30)
        assert not again.value.fatal
        assert len(daemon.state.sessions) == 1
        assert daemon.metrics.registry.get_sample_value("megabatch_protocol_errors_total",
                                                        {"code": "bad_message"}) is None  # never counted
