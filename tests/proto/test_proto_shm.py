"""proto.shm and proto.client: memfd segments shared across processes, fd passing, the client handshake."""

import ctypes
import dataclasses
import errno
import fcntl
import gc
import json
import mmap
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

import numpy as np
import pytest

from proto.client import ControlClient
from proto.codec import FrameDecoder, encode
from proto.errors import ConnectFailed, ConnectionClosed, ProtocolError, RemoteError, ShmError, SlotError
from proto.messages import (
    PROTOCOL_VERSION,
    BatchId,
    BatchReady,
    Bye,
    Credit,
    DatasetInfo,
    EpochEnd,
    Error,
    Hello,
    Message,
    Release,
    SlotLayout,
    Stats,
    StatsRequest,
    Welcome,
)
from proto.shm import SEALS, Segment, create_segment, map_segment, recv_with_fds, send_with_fds
from proto.slots import ArraySpec, SlotRing, place_arrays
from tests.paths import REPO_ROOT

SPECS = [ArraySpec("x", np.dtype("float32"), (50, 8), align=4096), ArraySpec("n_id", np.dtype("int64"), (50,))]
LAYOUT = SlotLayout(count=3, slot_bytes=16384, header_bytes=4096, segment_bytes=3 * 16384)
INFO = DatasetInfo("demo", 1000, 8, "float32", 4, 2, [10, 5], [-1, -1], 50, 600, 200, 200, "megabatch")
WELCOME = Welcome(PROTOCOL_VERSION, "0.1.0-test", 1, INFO, LAYOUT)


def open_fds() -> set[str]:
    # collect first: earlier tests' garbage (maps, sockets) would otherwise close fds mid-test
    gc.collect()
    return set(os.listdir("/proc/self/fd"))


def write_batch(ring: SlotRing, slot: int, seq: int) -> dict[str, np.ndarray]:
    plan = place_arrays(SPECS, ring.slot_bytes)
    arrays = ring.arrays_for(slot, plan)
    arrays["x"][...] = np.arange(400, dtype=np.float32).reshape(50, 8) + seq
    arrays["n_id"][...] = np.arange(50) * 3 + seq
    ring.commit(slot, BatchId("train", seq, 0, 0, seq, 2), plan)
    return {name: arr.copy() for name, arr in arrays.items()}


# --- segments and descriptors ----------------------------------------------------------------------


def test_memfd_segment_has_no_name_in_dev_shm():
    before = set(os.listdir("/dev/shm"))
    with create_segment(LAYOUT.segment_bytes) as seg:
        assert os.readlink(f"/proc/self/fd/{seg.fd}").startswith("/memfd:megabatch-slots")
        assert os.fstat(seg.fd).st_size == LAYOUT.segment_bytes
        assert not os.get_inheritable(seg.fd)
        assert set(os.listdir("/dev/shm")) == before
        assert seg.mapping[:] == bytes(LAYOUT.segment_bytes)


CHILD = r"""
import dataclasses, json, os, socket, sys
from proto.errors import ShmError
from proto.shm import map_segment, recv_with_fds
from proto.slots import SlotRing
sock = socket.socket(fileno=int(sys.argv[1]))
data, fds = recv_with_fds(sock, 4096, 1)
info = json.loads(data)
seg = map_segment(fds[0], info["nbytes"])
ring = SlotRing(seg.mapping, info["count"], info["slot_bytes"])
contents = ring.read(info["slot"], expect_seq=info["seq"])
try:
    contents.arrays["x"][0, 0] = -1
    readonly = False
except ValueError:
    readonly = True
try:
    map_segment(os.dup(seg.fd), info["nbytes"], writable=True).mapping[0:5] = b"child"
    map_error = None
except ShmError as err:
    map_error = str(err)
out = {"readonly": readonly, "map_error": map_error, "header": dataclasses.asdict(contents.batch_id),
       "fds": len(fds), "target": os.readlink(f"/proc/self/fd/{seg.fd}"),
       "arrays": {name: arr.tolist() for name, arr in contents.arrays.items()}}
sock.sendall(json.dumps(out).encode())
"""


def test_segment_passed_to_a_child_process_over_a_socketpair():
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with create_segment(LAYOUT.segment_bytes) as seg, parent_sock:
        ring = SlotRing.from_layout(seg.mapping, LAYOUT)
        expected = write_batch(ring, slot=2, seq=9)
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(child_sock.fileno())], cwd=REPO_ROOT,
                                pass_fds=[child_sock.fileno()], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        child_sock.close()
        info = {"nbytes": seg.nbytes, "count": LAYOUT.count, "slot_bytes": LAYOUT.slot_bytes, "slot": 2, "seq": 9}
        send_with_fds(parent_sock, json.dumps(info).encode(), [seg.reader_fd])  # as the daemon does
        reply = b""
        while chunk := parent_sock.recv(65536):
            reply += chunk
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr.decode()
        out = json.loads(reply)
        assert out["readonly"] and out["fds"] == 1 and out["target"].startswith("/memfd:megabatch-slots")
        assert out["header"] == {"kind": "train", "seq": 9, "epoch": 0, "pass_index": 0, "batch_index": 9,
                                 "num_batches": 2}
        for name, arr in expected.items():
            np.testing.assert_array_equal(np.array(out["arrays"][name], dtype=arr.dtype), arr)
        # the child got a read-only descriptor: it cannot write into the parent's memory at all
        assert out["map_error"] is not None and "cannot map" in out["map_error"]
        assert seg.mapping[0:5] != b"child"
        ring.close()


def test_map_segment_checks_the_size_and_closes_the_fd():
    with create_segment(8192) as seg:
        fd = os.dup(seg.fd)
        with pytest.raises(ShmError, match="has 8192 bytes, expected at least 16384"):
            map_segment(fd, 16384)
        with pytest.raises(OSError):
            os.fstat(fd)
        with map_segment(os.dup(seg.fd), 8192) as ro:
            seg.mapping[100:104] = b"abcd"
            assert ro.mapping[100:104] == b"abcd"
            with pytest.raises(TypeError):
                ro.mapping[0:1] = b"x"


def test_segment_size_errors():
    with pytest.raises(ShmError, match="at least 1 byte"):
        create_segment(0)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with pytest.raises(ShmError, match="needs .* of shared memory but this machine has"):
        create_segment(physical + mmap.PAGESIZE)


def test_prefault_reserves_or_explains():
    with create_segment(64 * 1024) as seg:
        seg.prefault()  # the seals allow reserving pages inside the size, so this still works
        assert os.fstat(seg.fd).st_blocks * 512 >= 64 * 1024
    with create_segment(8192) as seg, map_segment(os.dup(seg.fd), 8192) as ro, \
            pytest.raises(ShmError, match="writable"):
        ro.prefault()
    # A memfd sealed against growth cannot be extended: stands in for a tmpfs or cgroup that is full.
    fd = os.memfd_create("sealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
    with Segment(fd, 8192, mmap.mmap(-1, 8192), writable=True) as seg, \
            pytest.raises(ShmError, match="cannot reserve 8.0 KiB of shared memory for the slot ring"):
        seg.prefault()


def _fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """fallocate(2), which Python's os module lacks: 0, or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return 0 if libc.fallocate(fd, mode, offset, length) == 0 else ctypes.get_errno()


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def test_segment_is_reserved_and_sealed():
    with create_segment(64 * 1024) as seg:
        assert os.fstat(seg.fd).st_blocks * 512 >= 64 * 1024  # reserved at creation, not at first write
        seals = fcntl.fcntl(seg.fd, fcntl.F_GET_SEALS)
        assert seals == SEALS
        for bit in (fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_GROW, fcntl.F_SEAL_SEAL):
            assert seals & bit
        # even the daemon's own read-write descriptor can no longer resize it or change the seals
        for size in (0, 4096, 128 * 1024):
            with pytest.raises(PermissionError):
                os.ftruncate(seg.fd, size)
        with pytest.raises(PermissionError):
            os.posix_fallocate(seg.fd, 0, 128 * 1024)
        with pytest.raises(PermissionError):
            fcntl.fcntl(seg.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        # F_SEAL_FUTURE_WRITE: no writer but the mapping made before sealing, and no hole punching
        with pytest.raises(PermissionError):
            os.pwrite(seg.fd, b"x", 0)
        with pytest.raises(PermissionError):
            mmap.mmap(seg.fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        assert _fallocate(seg.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == errno.EPERM
        seg.mapping[4096:4100] = b"ours"
        assert os.pread(seg.fd, 4, 4096) == b"ours"
        assert os.fstat(seg.fd).st_size == 64 * 1024


def test_reader_fd_is_a_read_only_view_of_the_same_memory():
    with create_segment(8192) as seg:
        reader = seg.reader_fd
        assert reader != seg.fd
        assert fcntl.fcntl(reader, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        assert not os.get_inheritable(reader)
        assert os.fstat(reader).st_ino == os.fstat(seg.fd).st_ino
        assert fcntl.fcntl(reader, fcntl.F_GET_SEALS) == SEALS  # seals belong to the memfd, not the descriptor
        for size in (0, 16384):
            with pytest.raises(OSError) as info:
                os.ftruncate(reader, size)
            assert info.value.errno in (errno.EINVAL, errno.EBADF)
        with pytest.raises(PermissionError):
            mmap.mmap(reader, 8192, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(ShmError, match="cannot map"):
            map_segment(os.dup(reader), 8192, writable=True)
        with map_segment(os.dup(reader), 8192) as ro:
            seg.mapping[0:4] = b"abcd"
            assert ro.mapping[0:4] == b"abcd"
            with pytest.raises(TypeError):
                ro.mapping[0:1] = b"x"
            with pytest.raises(ShmError, match="no read-only descriptor"):
                ro.reader_fd  # noqa: B018


def test_a_writable_reopen_of_the_reader_fd_meets_the_seals():
    with create_segment(8192) as seg:
        try:
            rw = os.open(f"/proc/self/fd/{seg.reader_fd}", os.O_RDWR)
        except PermissionError:
            return  # refused outright (another uid, a hardened /proc): nothing more to break
        try:
            for size in (0, 16384):
                with pytest.raises(PermissionError):
                    os.ftruncate(rw, size)
            with pytest.raises(PermissionError):
                os.pwrite(rw, b"x", 0)
            with pytest.raises(PermissionError):
                mmap.mmap(rw, 8192, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            assert _fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192) == errno.EPERM
        finally:
            os.close(rw)
        assert os.fstat(seg.fd).st_size == 8192


def test_create_segment_failures_are_clean_and_leak_nothing(monkeypatch):
    before = open_fds()

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(os, "posix_fallocate", full)
        with pytest.raises(ShmError, match=r"^cannot reserve 64\.0 KiB of shared memory for the slot ring: "
                                           r"No space left on device; use fewer or smaller slots"):
            create_segment(64 * 1024)
    assert not open_fds() - before

    real_open = os.open

    def no_proc(path: str, flags: int, *args: int) -> int:
        if str(path).startswith("/proc/self/fd/"):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
        return real_open(path, flags, *args)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", no_proc)
        with pytest.raises(ShmError, match=r"^cannot open a read-only descriptor of 8\.0 KiB of shared memory"):
            create_segment(8192)
    assert not open_fds() - before


def test_seals_without_future_write_on_an_old_kernel(monkeypatch):
    real_fcntl = fcntl.fcntl
    future_write = 0x0010
    calls = []

    def old_kernel(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_ADD_SEALS:
            calls.append(arg)
            if arg & future_write:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", old_kernel)
    with create_segment(8192) as seg:
        assert calls == [SEALS, SEALS & ~future_write]
        assert real_fcntl(seg.fd, fcntl.F_GET_SEALS) == fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def test_close_is_idempotent_and_keeps_live_views_valid():
    before = open_fds()
    seg = create_segment(8192)
    view = np.frombuffer(seg.mapping, dtype=np.uint8)
    view[:4] = [1, 2, 3, 4]
    seg.close()
    seg.close()
    assert seg.closed
    with pytest.raises(ShmError, match="closed"):
        seg.mapping  # noqa: B018
    assert view[:4].tolist() == [1, 2, 3, 4]  # unmapped only once the last view is gone
    del view
    assert not open_fds() - before


def test_recv_with_fds_never_leaks_extra_descriptors():
    a, b = socket.socketpair()
    with a, b, create_segment(4096) as seg:
        before = open_fds()
        send_with_fds(a, b"hello", [seg.fd, seg.fd, seg.fd])
        data, fds = recv_with_fds(b, 100, 1)
        assert data == b"hello" and len(fds) == 1
        os.close(fds[0])
        assert not open_fds() - before
        a.sendall(b"plain")
        assert recv_with_fds(b, 100, 1) == (b"plain", [])
        a.close()
        assert recv_with_fds(b, 100, 1) == (b"", [])


# --- the control client against a fake daemon --------------------------------------------------------


class Peer:
    """The daemon's end of one connection, driven by a test script in a thread."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.decoder = FrameDecoder()
        self.pending: list[Message] = []

    def next(self) -> Message:
        while not self.pending:
            data = self.conn.recv(65536)
            if not data:
                raise ConnectionClosed("client went away")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def until_eof(self) -> list[Message]:
        out = []
        while True:
            try:
                out.append(self.next())
            except ConnectionClosed:
                return out

    def send(self, *msgs: Message) -> None:
        self.conn.sendall(b"".join(encode(m) for m in msgs))


class FakeDaemon:
    """Listens on ``path``, accepts one connection and runs ``script(peer)`` on it in a thread."""

    def __init__(self, path: str, script: Callable[[Peer], None]) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.listener.settimeout(30)  # a safety net against a hung test, not synchronization
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(script,))
        self.thread.start()

    def _run(self, script: Callable[[Peer], None]) -> None:
        try:
            conn, _ = self.listener.accept()
            with conn:
                conn.settimeout(30)
                script(Peer(conn))
        except BaseException as err:  # re-raised in the test by join()
            self.error = err

    def join(self) -> None:
        self.thread.join()
        self.listener.close()
        if self.error is not None:
            raise self.error


@pytest.fixture
def sock_path(tmp_path):
    path = tmp_path / "d.sock"
    assert len(str(path)) < 100  # AF_UNIX path limit
    return str(path)


def test_handshake_batch_and_session(sock_path):
    received: list[Message] = []

    def script(peer: Peer) -> None:
        assert peer.next() == Hello(PROTOCOL_VERSION, "test-trainer", os.getpid())
        with create_segment(LAYOUT.segment_bytes) as seg:
            ring = SlotRing.from_layout(seg.mapping, LAYOUT)
            write_batch(ring, slot=1, seq=0)
            ring.close()
            # The first BatchReady shares the Welcome's chunk: the client must keep it for recv().
            send_with_fds(peer.conn, encode(WELCOME) + encode(BatchReady(1, 0, "train", 0, 0, 0, 2)),
                          [seg.reader_fd])
        # The daemon's own descriptor and mapping are gone now; the client's keep the memory alive.
        for _ in range(3):
            received.append(peer.next())
        peer.send(Stats({"batches_total": 1}))
        received.extend(peer.until_eof())

    before = open_fds()
    daemon = FakeDaemon(sock_path, script)
    client = ControlClient.connect(sock_path, client="test-trainer", timeout=30)
    assert client.welcome == WELCOME
    assert (client.ring.count, client.ring.slot_bytes) == (LAYOUT.count, LAYOUT.slot_bytes)
    ready = client.recv(timeout=30)
    assert ready == BatchReady(1, 0, "train", 0, 0, 0, 2)
    contents = client.read_batch(ready)
    np.testing.assert_array_equal(contents.arrays["n_id"], np.arange(50) * 3)
    with pytest.raises(ValueError):
        contents.arrays["x"][0, 0] = 1.0  # the client's mapping is read-only
    with pytest.raises(SlotError, match="does not match its BatchReady"):
        client.read_batch(dataclasses.replace(ready, batch_index=1))
    client.send(Credit(2))
    client.send(Release(1, 0))
    client.send(StatsRequest())
    assert client.recv(timeout=30) == Stats({"batches_total": 1.0})
    client.close(reason="done")
    client.close()
    daemon.join()
    assert received == [Credit(2), Release(1, 0), StatsRequest(), Bye("done")]
    assert contents.arrays["x"][1, 0] == 8.0  # views outlive the client
    del contents
    assert not open_fds() - before


def _expect_handshake_failure(sock_path: str, script: Callable[[Peer], None], exc: type[BaseException],
                              match: str) -> BaseException:
    before = open_fds()
    daemon = FakeDaemon(sock_path, script)
    with pytest.raises(exc, match=match) as info:
        ControlClient.connect(sock_path, client="t", timeout=30)
    daemon.join()
    assert not open_fds() - before  # socket and any received descriptor closed
    return info.value


def _send_welcome(peer: Peer, welcome: Welcome = WELCOME, nbytes: int = LAYOUT.segment_bytes) -> None:
    peer.next()
    with create_segment(nbytes) as seg:
        send_with_fds(peer.conn, encode(welcome), [seg.reader_fd])


def test_daemon_replies_error(sock_path):
    def script(peer: Peer) -> None:
        peer.next()
        peer.send(Error("busy", "2 sessions already"))

    err = _expect_handshake_failure(sock_path, script, RemoteError, "busy: 2 sessions already")
    assert isinstance(err, RemoteError) and err.code == "busy" and err.fatal


def test_daemon_closes_early(sock_path):
    _expect_handshake_failure(sock_path, lambda peer: None, ConnectionClosed, "during the handshake")


def test_daemon_sends_garbage(sock_path):
    def script(peer: Peer) -> None:
        peer.next()
        peer.conn.sendall(b"\xc1garbage")

    err = _expect_handshake_failure(sock_path, script, ProtocolError, "invalid msgpack")
    assert isinstance(err, ProtocolError) and err.code == "bad_message"


def test_welcome_without_descriptor(sock_path):
    def script(peer: Peer) -> None:
        peer.next()
        peer.send(WELCOME)

    _expect_handshake_failure(sock_path, script, ProtocolError, "carried 0 descriptors")


def test_first_message_is_not_a_welcome(sock_path):
    def script(peer: Peer) -> None:
        peer.next()
        peer.send(Bye("shutting down"))

    _expect_handshake_failure(sock_path, script, ProtocolError, "expected a Welcome, got Bye")


def test_welcome_of_another_version(sock_path):
    welcome = dataclasses.replace(WELCOME, protocol_version=PROTOCOL_VERSION + 1)
    err = _expect_handshake_failure(sock_path, lambda peer: _send_welcome(peer, welcome), ProtocolError,
                                    f"speaks protocol version {PROTOCOL_VERSION + 1}")
    assert isinstance(err, ProtocolError) and err.code == "unsupported_version"


def test_welcome_larger_than_its_segment(sock_path):
    _expect_handshake_failure(sock_path, lambda peer: _send_welcome(peer, nbytes=4096), ShmError,
                              f"has 4096 bytes, expected at least {LAYOUT.segment_bytes}")


def test_welcome_with_invalid_slot_geometry(sock_path):
    layout = SlotLayout(count=2, slot_bytes=6000, header_bytes=4096, segment_bytes=12000)
    welcome = dataclasses.replace(WELCOME, slots=layout)
    _expect_handshake_failure(sock_path, lambda peer: _send_welcome(peer, welcome, 12000), ProtocolError,
                              "Welcome.slots: slot_bytes must be a multiple of 4096")


def test_missing_socket_is_a_one_line_error(tmp_path):
    path = str(tmp_path / "nothing.sock")
    with pytest.raises(ConnectFailed) as info:
        ControlClient.connect(path, client="t", timeout=30)
    assert str(info.value) == (f"cannot connect to loader daemon at {path}: no such file "
                               f"(is `megabatch serve` running?)")


def test_refused_connection_is_a_one_line_error(sock_path):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with stale:
        stale.bind(sock_path)  # bound but not listening, like the file a crashed daemon left behind
        with pytest.raises(ConnectFailed, match=f"^cannot connect to loader daemon at {sock_path}: "
                                                f"connection refused"):
            ControlClient.connect(sock_path, client="t", timeout=30)


def test_session_errors_timeouts_and_disconnect(sock_path):
    def script(peer: Peer) -> None:
        _send_welcome(peer)
        assert peer.next() == Credit(1)  # sent by the client only after its recv timed out
        peer.send(Error("bad_request", "no stream is active"), EpochEnd(0, 0, 1))

    daemon = FakeDaemon(sock_path, script)
    with ControlClient.connect(sock_path, client="t", timeout=30) as client:
        with pytest.raises(TimeoutError, match="no message"):
            client.recv(timeout=0.01)
        client.send(Credit(1))
        with pytest.raises(RemoteError, match="bad_request") as info:
            client.recv(timeout=30)
        assert not info.value.fatal
        assert client.recv(timeout=30) == EpochEnd(0, 0, 1)
        daemon.join()  # the daemon has closed the connection
        with pytest.raises(ConnectionClosed):
            client.recv(timeout=30)
        with pytest.raises(ConnectionClosed):
            client.send(Credit(1))


def test_handshake_over_a_socketpair_and_garbage_mid_session():
    ours, theirs = socket.socketpair()
    peer = Peer(ours)

    def script() -> None:
        _send_welcome(peer)
        peer.conn.sendall(b"\xc1 not msgpack")

    thread = threading.Thread(target=script)
    thread.start()
    client = ControlClient.handshake(theirs, client="t", timeout=30)
    thread.join()
    with client, ours:
        assert client.welcome == WELCOME
        with pytest.raises(ProtocolError, match="invalid msgpack") as info:
            client.recv(timeout=30)
        assert info.value.code == "bad_message"
        with pytest.raises(ProtocolError):  # the stream position is lost: the caller must disconnect
            client.recv(timeout=30)


def test_truncated_frame_then_close(sock_path):
    def script(peer: Peer) -> None:
        _send_welcome(peer)
        peer.conn.sendall(encode(Credit(1)) + encode(EpochEnd(0, 5, 1))[:-1])

    daemon = FakeDaemon(sock_path, script)
    with ControlClient.connect(sock_path, client="t", timeout=30) as client:
        daemon.join()
        assert client.recv(timeout=30) == Credit(1)
        with pytest.raises(ConnectionClosed):
            client.recv(timeout=30)
