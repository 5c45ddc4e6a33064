"""Sampling the soak's daemon: its process from /proc/PID (RSS, descriptors, memfd descriptors and mappings,
threads) and its client count from its Prometheus endpoint, every SAMPLE_SECONDS, and settled samples (no
client connected, descriptors stable) for the start and the end of the soak."""

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness import scrape
from bench.soak_settings import PROGRESS_SECONDS, SAMPLE_SECONDS, SETTLE_SECONDS


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
