"""The daemon's health: /healthz, /readyz and 404 beside /metrics on the metrics port, and systemd's STATUS= lines
(current while serving; a failed start's reason, not "draining")."""

import asyncio
import contextlib
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

import loader.daemon.health as health
from loader.daemon.config import LoaderConfig
from loader.daemon.server import Daemon
from loader.daemon.session import Session
from proto.errors import UserError
from proto.messages import EpochEnd, StartEpoch
from tests.daemon_harness import connect, consume, daemon_config, running_daemon

WAIT = 120.0
"""Seconds a test waits for an event before it fails (the events come in milliseconds)."""


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; the daemon binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path`` on the daemon's metrics port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=WAIT) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class HeldDaemon(Daemon):
    """A daemon whose start-up stops just before it listens, and whose drain stops before it waits, each until
    the test lets it go on: the moments between "the port answers" and "serving", and during the drain."""

    def __init__(self, config: LoaderConfig) -> None:
        super().__init__(config)
        self.before_listen, self.go_listen = threading.Event(), threading.Event()
        self.served = threading.Event()
        self.draining, self.go_drain = threading.Event(), threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup()
        self.served.set()

    def _listen(self, path: Path, mode: int) -> socket.socket:
        self.before_listen.set()
        assert self.go_listen.wait(WAIT)  # the loop is held here: /readyz is answered off the loop
        return super()._listen(path, mode)

    async def _drain(self, sessions: list[Session]) -> None:
        self.draining.set()
        # waits off the loop, which stays free to answer /healthz
        await asyncio.get_running_loop().run_in_executor(None, self.go_drain.wait, WAIT)
        await super()._drain(sessions)


def test_readyz_is_503_until_serving_and_while_draining_healthz_200_unknown_404(dataset_3k, tmp_path):
    port = free_port()
    config = daemon_config(dataset_3k, tmp_path / "s.sock", metrics={"address": "127.0.0.1", "port": port})
    daemon = HeldDaemon(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            uvloop.run(daemon.serve())
        except BaseException as err:  # surfaced below
            failure.append(err)

    thread = threading.Thread(target=run, name="test-daemon", daemon=True)
    thread.start()
    try:
        assert daemon.before_listen.wait(WAIT), failure
        status, body = get(port, "/readyz")
        assert status == 503 and body.startswith("starting"), (status, body)
        status, body = get(port, "/healthz")
        assert status == 200 and body.startswith("starting"), (status, body)
        assert get(port, "/metrics")[0] == 200  # scraped from the start
        daemon.go_listen.set()

        assert daemon.served.wait(WAIT), failure
        assert get(port, "/readyz") == (200, "ready: serving\n")
        assert get(port, "/healthz") == (200, "alive: serving\n")
        status, body = get(port, "/metrics")
        assert status == 200 and "megabatch_build_info{" in body and "megabatch_epoch 0.0" in body
        assert get(port, "/metrics?name[]=megabatch_epoch")[0] == 200
        for path in ("/", "/health", "/readyz/x", "/metricsx"):
            assert get(port, path)[0] == 404, path

        assert daemon.loop is not None
        daemon.loop.call_soon_threadsafe(daemon.should_exit.set)
        assert daemon.draining.wait(WAIT), failure
        status, body = get(port, "/readyz")
        assert status == 503 and body.startswith("draining"), (status, body)
        assert get(port, "/healthz") == (200, "alive: draining\n")  # the loop still answers
    finally:
        daemon.go_listen.set()
        daemon.go_drain.set()
        if daemon.loop is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # a daemon that stopped by itself has closed its loop
                daemon.loop.call_soon_threadsafe(daemon.should_exit.set)
        thread.join(WAIT)
    assert not failure, failure
    assert not thread.is_alive()
    with pytest.raises(urllib.error.URLError):  # the port is closed with the daemon
        get(port, "/healthz")


def test_a_metrics_port_in_use_fails_the_start_before_the_dataset_is_read(dataset_3k, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = daemon_config(tmp_path / "no-dataset", tmp_path / "s.sock", metrics={"address": "127.0.0.1",
                                                                                       "port": port})
        with pytest.raises(UserError, match=rf"\[metrics\] port: cannot serve metrics on 127.0.0.1:{port}"), \
                running_daemon(config):
            pass


class NotifyListener:
    """A datagram socket standing in for systemd's: collects what the daemon sends to ``$NOTIFY_SOCKET``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="test-notify", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:  # closed
                return
            with self._changed:
                self.messages.append(data.decode())
                self._changed.notify_all()

    def wait_for(self, found: Callable[[str], bool]) -> str:
        """The first message (collected so far or next) for which ``found`` holds."""
        with self._changed:
            assert self._changed.wait_for(lambda: any(map(found, self.messages)), timeout=WAIT), self.messages
            return next(m for m in self.messages if found(m))

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(WAIT)


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    listener = NotifyListener(tmp_path / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", listener.path)
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # a ping every 50 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setattr(health, "STATUS_INTERVAL", 0.05)
    try:
        yield listener
    finally:
        listener.close()


def statuses(messages: list[str]) -> list[str]:
    return [line.removeprefix("STATUS=") for m in messages for line in m.splitlines() if line.startswith("STATUS=")]


def test_status_tells_systemd_the_epoch_clients_and_rate_while_serving(dataset_3k, tmp_path, notify_socket):
    config = daemon_config(dataset_3k, tmp_path / "s.sock")
    with running_daemon(config):
        ready = notify_socket.wait_for(lambda m: "READY=1" in m)
        assert re.search(r"^STATUS=serving dataset: epoch 0, 0 clients, \d+\.\d batches/s$", ready, re.M), ready
        with connect(config) as client:
            consume(client, StartEpoch(epoch=3), EpochEnd)
            line = notify_socket.wait_for(lambda m: "epoch 3, 1 client," in m)
        assert re.fullmatch(r"WATCHDOG=1\nSTATUS=serving dataset: epoch 3, 1 client, \d+\.\d batches/s", line), line
    notify_socket.wait_for(lambda m: m.startswith("STOPPING=1"))
    assert statuses(notify_socket.messages)[0] == "starting: loading the dataset"
    assert statuses(notify_socket.messages)[-1] == "draining"


def test_a_failed_start_tells_systemd_why_not_draining(tmp_path, notify_socket):
    config = daemon_config(tmp_path / "none", tmp_path / "s.sock")
    with pytest.raises(UserError) as err, running_daemon(config):
        pass
    notify_socket.wait_for(lambda m: m == "STOPPING=1")
    said = statuses(notify_socket.messages)
    assert said == ["starting: loading the dataset", f"failed to start: {err.value}"], said
    assert "none: not a directory" in said[-1]
    assert not any("READY=1" in m for m in notify_socket.messages)
