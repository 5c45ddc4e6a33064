"""Stopping cleanly: the daemon's drain and ``Shutdown``, ``serve``'s config-error exit code, the trainer's
SIGTERM at a step boundary, and the journald priority prefix of log lines."""

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import tests.daemon_harness as harness
from loader.cli import EX_CONFIG
from loader.daemon.server import Daemon
from proto.client import ControlClient, DaemonShuttingDown
from proto.errors import RemoteError
from proto.logs import JournalFormatter, syslog_priority, to_journal
from proto.messages import BatchReady, Credit, Release, StartEpoch, Stats, StatsRequest
from tests.daemon_harness import daemon_config, running_daemon
from trainer.cli import checkpoint_note
from trainer.loop import StopControl


class LoopDaemon(Daemon):
    """A daemon that remembers its event loop, so a test can run its signal handler there."""

    loop: asyncio.AbstractEventLoop

    async def startup(self) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.loop.call_soon_threadsafe(self.handle_exit, sig)


@pytest.fixture
def loop_daemon(monkeypatch):
    monkeypatch.setattr(harness, "Daemon", LoopDaemon)


def until_shutdown(client) -> tuple[list[BatchReady], DaemonShuttingDown]:
    """The BatchReady messages that arrive before the Shutdown, and the error the Shutdown raised."""
    batches = []
    while True:
        try:
            msg = client.recv(timeout=60)
        except DaemonShuttingDown as err:
            return batches, err
        assert isinstance(msg, BatchReady), msg
        batches.append(msg)


def first_batch_then_sigterm(daemon, client) -> list[BatchReady]:
    """Start epoch 0, take its first batch, SIGTERM the daemon: the batches held when ``Shutdown`` came."""
    assert isinstance(daemon, LoopDaemon)
    client.send(StartEpoch(epoch=0))
    first = client.recv(timeout=60)
    assert isinstance(first, BatchReady)
    daemon.signal(signal.SIGTERM)
    return [first, *until_shutdown(client)[0]]


def test_drain_sends_shutdown_and_published_batches_stay_valid(dataset_3k, tmp_path, loop_daemon):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"drain_timeout": 600.0})
    with running_daemon(config) as daemon:
        assert isinstance(daemon, LoopDaemon)
        with ControlClient.connect(str(config.server.socket), client="test", timeout=30) as client:
            client.send(Credit(count=2))
            client.send(StartEpoch(epoch=0))
            first = client.recv(timeout=60)
            assert isinstance(first, BatchReady)
            before = {k: np.array(v) for k, v in client.read_batch(first).arrays.items()}
            daemon.signal(signal.SIGTERM)
            more, err = until_shutdown(client)
            assert str(err) == "the loader daemon is shutting down: SIGTERM received" and err.reason == \
                "SIGTERM received"
            held = [first, *more]
            assert len(held) <= 2  # two credits: no batch beyond them, none after the Shutdown
            # the session is still served: the published batches read back intact and a request is answered
            for ready in held:
                arrays = client.read_batch(ready).arrays
                if ready is first:
                    assert all(np.array_equal(arrays[k], v) for k, v in before.items())
            client.send(StatsRequest())
            stats = client.recv(timeout=60)
            assert isinstance(stats, Stats) and stats.values["batches_sent"] == len(held)
            for ready in held:
                client.send(Release(slot=ready.slot, seq=ready.seq))
            # the last release ends the drain: the daemon closes, and says why again
            with pytest.raises(DaemonShuttingDown, match="SIGTERM received"):
                client.recv(timeout=60)
    assert not config.server.socket.exists()


def test_second_signal_cuts_the_drain(dataset_3k, tmp_path, loop_daemon):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"drain_timeout": 3600.0})
    with running_daemon(config) as daemon, harness.connect(config) as client:
        first_batch_then_sigterm(daemon, client)
        # the batches stay held: only the second signal ends the hour-long drain
        daemon.signal(signal.SIGINT)
        with pytest.raises(DaemonShuttingDown):
            client.recv(timeout=60)
        assert daemon.force_exit
    assert not config.server.socket.exists()


def test_a_start_request_after_shutdown_is_refused_not_fatal(dataset_3k, tmp_path, loop_daemon):
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"drain_timeout": 600.0})
    with running_daemon(config) as daemon, harness.connect(config) as client:
        held = first_batch_then_sigterm(daemon, client)
        client.send(StartEpoch(epoch=1))
        with pytest.raises(RemoteError, match="shutting down") as err:
            client.recv(timeout=60)
        assert not err.value.fatal
        for r in held:
            client.send(Release(slot=r.slot, seq=r.seq))
        with pytest.raises(DaemonShuttingDown):
            client.recv(timeout=60)


def test_trainer_source_reports_the_shutdown_not_a_broken_pipe(dataset_3k, tmp_path, loop_daemon):
    from trainer.daemon_source import DaemonError, DaemonSource

    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"drain_timeout": 600.0})
    with running_daemon(config) as daemon:
        assert isinstance(daemon, LoopDaemon)
        source = DaemonSource(str(config.server.socket))
        try:
            batches = source.train_batches(0)
            first = next(batches)
            daemon.signal(signal.SIGTERM)
            with pytest.raises(DaemonError) as err:
                for batch in batches:
                    batch.release()
            assert str(err.value) == "the loader daemon is shutting down: SIGTERM received"
            first.release()  # still accepted: the daemon waits for it before closing
        finally:
            source.close()
    assert not config.server.socket.exists()


# --- serve: configuration errors --------------------------------------------------------------------

def serve(config_path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    return subprocess.run([sys.executable, "-m", "loader.cli", "serve", "--config", str(config_path)],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("body, fragment", [
    ('[dataset]\npath = "{tmp}/none"\n[server]\nsocket = "{tmp}/s.sock"\n[metrics]\nport = 0\n', "none"),
    ('[dataset]\npath = "{tmp}"\n[server]\nmax_clients = 0\n', "max_clients"),
    ("[dataset\n", "bad.toml"),
])
def test_serve_exits_ex_config_on_a_bad_config_or_dataset(tmp_path, body, fragment):
    bad = tmp_path / "bad.toml"
    bad.write_text(body.format(tmp=tmp_path))
    run = serve(bad)
    assert run.returncode == EX_CONFIG == 78, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("megabatch: error:") and fragment in errors[0], run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "s.sock").exists()


# --- megabatch train: SIGTERM -------------------------------------------------------------------------

FIRST_EPOCH = re.compile(r"^epoch 1/\d+ ")


def train_until_sigterm(*args) -> tuple[int, list[str]]:
    """Run the trainer, SIGTERM it once it has logged its first epoch: (exit code, every output line)."""
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--mode", "inmemory", "--no-progress", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if FIRST_EPOCH.match(line):
                proc.send_signal(signal.SIGTERM)
                break
        lines.extend(line.rstrip("\n") for line in proc.stdout)
        return proc.wait(timeout=300), lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_train_sigterm_stops_at_a_step_boundary_and_resumes(dataset_1500, tmp_path):
    ckpt = tmp_path / "ck.pt"
    common = ["--dataset", dataset_1500, "--hidden", 16, "--batch-size", 50, "--fanouts", "5,5",
              "--eval-batch-size", 1000, "--checkpoint", ckpt]
    code, lines = train_until_sigterm(*common, "--epochs", 10000)
    assert code == 0, lines
    assert not any("Traceback" in line for line in lines), lines
    stopped = [line for line in lines if line.startswith("megabatch train: stopped;")]
    assert len(stopped) == 1 and stopped[0] == lines[-1], lines
    match = re.fullmatch(rf"megabatch train: stopped; the checkpoint {re.escape(str(ckpt))} holds epoch (\d+); "
                         r"resume with --resume", stopped[0])
    assert match is not None, stopped
    done = int(match.group(1))
    epochs = [int(m.group(1)) for m in map(re.compile(r"^epoch (\d+)/").match, lines) if m]
    assert done >= 1 and epochs == list(range(1, done + 1)), lines  # no cut epoch is reported as done

    resumed = subprocess.run([sys.executable, "-m", "trainer", "--mode", "inmemory", "--no-progress", *map(str, common),
                              "--epochs", str(done + 1), "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    out = resumed.stdout.strip().splitlines()
    assert out[0] == f"resumed from {ckpt} after epoch {done}", out
    assert [line.split("  ")[0] for line in out[1:-1]] == [f"epoch {done + 1}/{done + 1}"], out
    assert out[-1].startswith("best val"), out


def test_train_sigterm_without_checkpoint_says_none_was_written(dataset_1500):
    code, lines = train_until_sigterm("--dataset", dataset_1500, "--hidden", 16, "--batch-size", 50,
                                      "--fanouts", "5,5", "--eval-batch-size", 1000, "--epochs", 10000)
    assert code == 0, lines
    assert lines[-1] == "megabatch train: stopped; no checkpoint was written (no --checkpoint)", lines


@pytest.mark.parametrize("sig, code, last", [
    (signal.SIGTERM, 0, "megabatch train: stopped while queued for the loader daemon's training pipeline; "
                        "no checkpoint was written (no --checkpoint)"),
    (signal.SIGINT, 130, "megabatch train: interrupted; no checkpoint was written (no --checkpoint)"),
], ids=["SIGTERM", "SIGINT"])
def test_a_queued_trainer_stops_at_the_first_signal_in_one_line(dataset_3k, tmp_path, sig, code, last):
    """A trainer waiting in the daemon's training queue has no step to finish: the first SIGTERM ends it (it
    used to be ignored until a second one), as Ctrl-C does."""
    config = daemon_config(dataset_3k, tmp_path / "s.sock", server={"stall_timeout": 600, "idle_timeout": 600})
    with running_daemon(config), harness.connect(config) as holder:
        holder.send(StartEpoch(epoch=0))
        assert isinstance(holder.recv(timeout=60), BatchReady)  # it holds the pipeline and releases nothing
        # SIGINT as a terminal delivers it: a runner that started this suite in the background (a shell without job
        # control) passes SIGINT down ignored, and Python then installs no KeyboardInterrupt handler at all
        proc = subprocess.Popen([sys.executable, "-m", "trainer", "--socket", str(config.server.socket),
                                 "--no-progress", "--hidden", "16", "--epochs", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if "waiting for the loader daemon's training pipeline: place 1" in line:
                    break
            assert "place 1" in lines[-1], lines
            proc.send_signal(sig)
            rest, _ = proc.communicate(timeout=60)  # the trainer ignoring it would wait for the holder forever
            after = rest.splitlines()
            assert proc.returncode == code, lines + after
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert after == [last], after


def test_checkpoint_note_never_claims_more_than_was_written():
    control = StopControl()
    assert checkpoint_note(None, control) == "no checkpoint was written (no --checkpoint)"
    assert checkpoint_note("ck.pt", None) == "no checkpoint was written (training had not started)"
    assert checkpoint_note("ck.pt", control) == "no checkpoint was written (no epoch completed)"
    control.writing = 1
    assert checkpoint_note("ck.pt", control) == ("the checkpoint ck.pt was being written for epoch 1: it holds "
                                                 "that epoch or what it held before; resume with --resume")
    control.checkpoint_epoch, control.writing = 1, None
    assert checkpoint_note("ck.pt", control) == "the checkpoint ck.pt holds epoch 1; resume with --resume"
    control.writing = 2
    assert "it holds that epoch or epoch 1" in checkpoint_note("ck.pt", control)


# --- journald -------------------------------------------------------------------------------------

def record(level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord("megabatch", level, __file__, 1, msg, None, None)


def test_journal_formatter_prefixes_every_line_with_the_syslog_priority():
    journal = JournalFormatter(journal=True)
    assert [journal.format(record(level, "x")) for level in (logging.ERROR, logging.WARNING, logging.INFO,
                                                               logging.DEBUG)] == \
        ["<3>megabatch: x", "<4>megabatch: x", "<6>megabatch: x", "<7>megabatch: x"]
    assert journal.format(record(logging.WARNING, "two\nlines")) == "<4>megabatch: two\n<4>lines"
    assert JournalFormatter(journal=False).format(record(logging.ERROR, "x")) == "megabatch: x"
    assert [syslog_priority(level) for level in (logging.CRITICAL, 45, 35, 25, 15)] == [2, 3, 4, 6, 7]


def test_journal_stream_must_name_the_stream(tmp_path, monkeypatch):
    with open(tmp_path / "log", "w") as stream, open(tmp_path / "other", "w") as other:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert to_journal(stream) and not to_journal(other)
        monkeypatch.delenv("JOURNAL_STREAM")
        assert not to_journal(stream)
