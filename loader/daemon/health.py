"""Where the daemon is in its life, told to probes (``/healthz``, ``/readyz``) and to systemd (``STATUS=``).

``Health`` moves through starting -> serving -> draining (or starting -> failed) as ``Daemon`` calls it,
and sends systemd the matching notification itself, so the HTTP answers and ``systemctl status`` never
disagree. ``report_to_systemd`` is the event-loop task that keeps ``STATUS=`` current while serving,
and pings the watchdog from the same loop. docs/DEPLOY.md, "Health probes and systemd's status", is the operator's view.
"""

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from loader.daemon.sdnotify import notify, notify_socket, watchdog_interval
from proto.errors import UserError
from proto.sizes import counted

__all__ = ["Health", "StatusLine", "report_to_systemd", "start_failure", "LOOP_ANSWER_TIMEOUT", "STATUS_INTERVAL"]

LOOP_ANSWER_TIMEOUT = 2.0
"""Seconds ``/healthz`` waits for the event loop to run a no-op: far more than a healthy loop ever needs (its
callbacks are short; CPU work runs on pools), far less than the watchdog's 15 s ping interval."""

STATUS_INTERVAL = 5.0
"""Seconds between two ``STATUS=`` lines while serving (read at each tick: tests shorten it)."""

KINDS = ("train", "val", "test")
"""The ``kind`` labels of ``megabatch_batches_published_total``."""


def start_failure(err: BaseException) -> str:
    """The reason a start-up failed, in one line for ``STATUS=`` (the CLI prints the same error)."""
    if isinstance(err, UserError):
        text = str(err)
    elif isinstance(err, KeyboardInterrupt | asyncio.CancelledError):
        text = "interrupted"
    else:
        text = f"internal error: {type(err).__name__}: {err}"
    return " ".join(text.split())  # one line: a newline would end the STATUS= assignment


class Health:
    """The daemon's phase, read by the HTTP server's threads (a str swap is atomic under the GIL)."""

    def __init__(self) -> None:
        self.phase = "starting"
        self.detail = "starting: loading the dataset"
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- transitions (on the event loop) ---------------------------------------------------------------
    def starting(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        notify(f"STATUS={self.detail}")

    def serving(self, status: str) -> None:
        self.phase, self.detail = "serving", status
        notify(f"READY=1\nSTATUS={status}\nMAINPID={os.getpid()}")

    def draining(self) -> None:
        if self.phase == "failed":
            # a start that failed keeps its reason as the status: "draining" would hide why the unit failed
            notify("STOPPING=1")
            return
        self.phase, self.detail = "draining", "draining: stopping the streams and waiting for the clients"
        notify("STOPPING=1\nSTATUS=draining")

    def failed(self, reason: str) -> None:
        self.phase, self.detail = "failed", f"failed to start: {reason}"
        notify(f"STATUS={self.detail}")

    # -- probes (on the HTTP server's threads) --------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if self.phase == "serving":
            return True, "ready: serving"
        return False, self.detail

    def alive(self) -> tuple[bool, str]:
        """Whether the event loop runs a callback within ``LOOP_ANSWER_TIMEOUT``. Start-up runs on the loop
        (reading the dataset), which answers no one meanwhile: until then the answer is the phase's, and
        systemd's ``TimeoutStartSec=`` bounds a start that hangs, as it does before the watchdog starts."""
        loop = self._loop
        if self.phase in ("starting", "failed") or loop is None:
            return self.phase == "starting", self.detail
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop is closed: the daemon has stopped
            return False, "the event loop has stopped"
        if answered.wait(LOOP_ANSWER_TIMEOUT):
            return True, f"alive: {self.phase}"
        return False, f"the event loop did not answer within {LOOP_ANSWER_TIMEOUT:g} s"


class StatusLine:
    """``serving DATASET: epoch E, N clients, X batches/s`` from the daemon's own metrics registry; the rate is
    over the time since the previous line (batches of every kind published to slots)."""

    def __init__(self, dataset: str, registry: CollectorRegistry, clients: Callable[[], int]) -> None:
        self._dataset = dataset
        self._registry = registry
        self._clients = clients
        self._last = (time.monotonic(), self._published())

    def _published(self) -> float:
        return sum(self._registry.get_sample_value("megabatch_batches_published_total", {"kind": kind}) or 0.0
                   for kind in KINDS)

    def __call__(self) -> str:
        now, published = time.monotonic(), self._published()
        then, before = self._last
        self._last = (now, published)
        rate = (published - before) / (now - then) if now > then else 0.0
        epoch = int(self._registry.get_sample_value("megabatch_epoch") or 0)
        return f"serving {self._dataset}: epoch {epoch}, {counted(self._clients(), 'client')}, {rate:.1f} batches/s"


async def report_to_systemd(stop: asyncio.Event, status: Callable[[], str]) -> None:
    """Until ``stop``: ``WATCHDOG=1`` every half ``WatchdogSec=`` and ``STATUS=`` every ``STATUS_INTERVAL``
    seconds, both sent from this loop task, so that both prove the loop alive and not only the process."""
    watchdog = watchdog_interval()
    informed = notify_socket() is not None
    while not stop.is_set():
        ticks = [t for t in (watchdog, STATUS_INTERVAL if informed else None) if t]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=min(ticks, default=3600))
        if stop.is_set():
            return
        lines = (["WATCHDOG=1"] if watchdog else []) + ([f"STATUS={status()}"] if informed else [])
        if lines:
            notify("\n".join(lines))
