"""A client that attacks its shared-memory segment cannot take the daemon (or another session) down.

Before the segment was sealed and passed read-only, ``ftruncate(fd, 0)`` followed by ``Credit`` and
``StartEpoch`` killed the daemon with SIGBUS at its next write into a slot (exit 135, nothing logged).
The daemon runs in this test process, so a regression here does not fail politely: pytest itself
dies of SIGBUS.
"""

import ctypes
import errno
import fcntl
import mmap
import os

import numpy as np
import pytest

from proto.client import ControlClient
from proto.messages import BatchReady, Credit, EpochEnd, EvalEnd, EvalRequest, Release, StartEpoch, Stats, StatsRequest
from proto.shm import SEALS
from tests.daemon_harness import connect, consume, daemon_config, running_daemon

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def punch_hole(fd: int, length: int) -> int:
    """fallocate(PUNCH_HOLE) over the first ``length`` bytes (Python's os has no fallocate): 0 or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    ok = libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, length) == 0
    return 0 if ok else ctypes.get_errno()


def attack_writable(path: str, size: int) -> list[str]:
    """Open ``path`` (a /proc/PID/fd link to the segment) read-write and try to break the segment.

    Returns what succeeded (empty: the seals held). A refused open counts as held too.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except PermissionError:
        return []
    broke = []
    try:
        for new_size in (0, size // 2, size + mmap.PAGESIZE):
            try:
                os.ftruncate(fd, new_size)
                broke.append(f"ftruncate to {new_size}")
            except PermissionError:
                pass
        try:
            os.pwrite(fd, b"\xff" * 8, 0)
            broke.append("pwrite")
        except PermissionError:
            pass
        try:
            mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE).close()
            broke.append("writable shared mmap")
        except PermissionError:
            pass
        if punch_hole(fd, size) != errno.EPERM:
            broke.append("hole punch")
    finally:
        os.close(fd)
    return broke


def check_batch(arrays, ref):
    n_id = arrays["n_id"]
    seeds = int(arrays["nodes_per_hop"][0])
    np.testing.assert_array_equal(arrays["x"], ref.features[n_id])
    np.testing.assert_array_equal(arrays["y"], ref.labels[n_id[:seeds]])


def test_truncating_client_cannot_crash_the_daemon_or_starve_another(dataset_3k, reference_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"max_clients": 2})
    with running_daemon(config) as daemon, connect(config) as good, \
            ControlClient.connect(str(config.server.socket), client="hostile", timeout=30) as bad:
        fd, size = bad.segment.fd, bad.welcome.slots.segment_bytes
        for new_size in (0, size + mmap.PAGESIZE):
            with pytest.raises(OSError) as info:
                os.ftruncate(fd, new_size)
            assert info.value.errno in (errno.EINVAL, errno.EBADF)
        assert attack_writable(f"/proc/self/fd/{fd}", size) == []
        # a same-uid process can open the daemon's own read-write descriptor through /proc/<daemon pid>/fd
        daemon_fd = daemon.state.sessions[bad.welcome.session].segment.fd
        assert attack_writable(f"/proc/{os.getpid()}/fd/{daemon_fd}", size) == []
        assert os.fstat(fd).st_size == size

        # the moment the attack used to kill the daemon: its next write into one of these slots
        bad.send(Credit(count=bad.welcome.slots.count))
        bad.send(StartEpoch(epoch=0))
        first = bad.recv(timeout=60)
        assert isinstance(first, BatchReady) and first.seq == 0
        check_batch(bad.read_batch(first).arrays, reference_3k)

        # the other session is served a whole, correct evaluation stream meanwhile
        batches, end = consume(good, EvalRequest(split="val"), EvalEnd)
        assert end.split == "val" and batches
        seeds = np.concatenate([a["n_id"][:int(a["nodes_per_hop"][0])] for _, a in batches])
        np.testing.assert_array_equal(np.sort(seeds), np.sort(reference_3k.splits["val"]))
        for _, arrays in batches:
            check_batch(arrays, reference_3k)

        # and the attacker's own session goes on as if nothing happened
        bad.send(Release(slot=first.slot, seq=first.seq))
        rest, epoch_end = [], None
        while epoch_end is None:
            msg = bad.recv(timeout=60)
            if isinstance(msg, BatchReady):
                check_batch(bad.read_batch(msg).arrays, reference_3k)
                rest.append(msg.seq)
                bad.send(Release(slot=msg.slot, seq=msg.seq))
            else:
                assert isinstance(msg, EpochEnd), msg
                epoch_end = msg
        assert rest == list(range(1, epoch_end.batches))
        good.send(StatsRequest())
        assert isinstance(good.recv(timeout=30), Stats)


def test_the_client_receives_a_read_only_sealed_descriptor(dataset_3k, tmp_path):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config), connect(config) as client:
        fd, size = client.segment.fd, client.welcome.slots.segment_bytes
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) == SEALS
        with pytest.raises(PermissionError):
            mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(TypeError):
            client.segment.mapping[0:1] = b"x"  # the client's own mapping is read-only too
        client.send(EvalRequest(split="test"))
        msg = client.recv(timeout=60)
        assert isinstance(msg, BatchReady)
        with pytest.raises(ValueError, match="read-only"):
            client.read_batch(msg).arrays["x"][0] = 0
