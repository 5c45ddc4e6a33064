"""How Prometheus finds the trainer and sees its end: ``--metrics-port``, ``--metrics-file-sd``,
``--metrics-label`` and ``--metrics-linger``.

A trainer is a job that ends, unlike the daemon: its last epoch's gauges are set moments before the
process exits, and a scrape every 15 s would miss them. So after training the metrics server stays up
for ``--metrics-linger`` seconds (two scrape intervals by default), cut short by SIGTERM or Ctrl-C.

With ``--metrics-port 0`` the kernel picks a free port (several trainers on one machine need no port
plan), and ``--metrics-file-sd`` tells Prometheus which: a file_sd target file, written atomically once
the server listens and removed at exit, holding the real ``host:port`` and the ``--metrics-label``s.
"""

import argparse
import contextlib
import json
import logging
import os
import re
import select
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from proto.atomic import atomic_file, io_error
from proto.cli_types import non_negative_seconds, port
from proto.errors import UserError
from trainer.metrics import TrainerMetrics

__all__ = ["add_arguments", "check_arguments", "metrics_label", "served", "FileSdTarget", "target_host",
           "linger", "linger_after_training", "DEFAULT_LINGER_S", "MAX_LABELS"]

log = logging.getLogger("megabatch.trainer")

DEFAULT_LINGER_S = 30.0
"""Two scrapes at Prometheus's default 15 s interval (deploy/prometheus/prometheus.yml scrapes every 5 s)."""

MAX_LABELS = 8
"""Every label multiplies into each series of the target: a handful identifies a job, more is a mistake."""

MAX_LABEL_VALUE = 256
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED = ("job",)
"""The dashboard and the alerts select the trainer by ``job="megabatch-trainer"``; a file_sd label would
override the scrape job's name."""


def metrics_label(text: str) -> tuple[str, str]:
    """``--metrics-label key=value``: a Prometheus label name (not ``__``-prefixed, not ``job``) and a value
    of at most 256 printable characters."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if not _LABEL_NAME.fullmatch(key):
        raise argparse.ArgumentTypeError(f"{key!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    if key.startswith("__"):
        raise argparse.ArgumentTypeError(f"{key!r}: names starting with __ are reserved for Prometheus")
    if key in _RESERVED:
        raise argparse.ArgumentTypeError(f"{key!r}: the scrape config names the job (dashboards and alerts select "
                                         "job=\"megabatch-trainer\")")
    if not value or len(value) > MAX_LABEL_VALUE or not value.isprintable():
        raise argparse.ArgumentTypeError(f"the value of {key!r} must be 1 to {MAX_LABEL_VALUE} printable characters")
    return key, value


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """The ``--metrics-*`` options, in ``megabatch train``'s "output" group."""
    group.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                       help="serve Prometheus metrics on this port; 0: a free port the kernel picks (tell Prometheus "
                            "with --metrics-file-sd) (default: not served)")
    group.add_argument("--metrics-address", default="127.0.0.1", help="(default 127.0.0.1)")
    group.add_argument("--metrics-linger", type=non_negative_seconds, default=DEFAULT_LINGER_S, metavar="SECONDS",
                       help="after training, keep serving metrics this long so that Prometheus scrapes the last "
                            "epoch; SIGTERM or Ctrl-C ends the wait (0: exit at once; default "
                            f"{DEFAULT_LINGER_S:g})")
    group.add_argument("--metrics-file-sd", metavar="PATH",
                       help="write a Prometheus file_sd target file here (the real host:port and --metrics-label "
                            "labels) once metrics are served; removed at exit")
    group.add_argument("--metrics-label", type=metrics_label, action="append", default=[], metavar="KEY=VALUE",
                       help=f"a label of the --metrics-file-sd target (repeatable, at most {MAX_LABELS})")


def check_arguments(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """Usage errors among the ``--metrics-*`` options (``error``: the parser's, one line, exit 2)."""
    if args.metrics_file_sd is not None and args.metrics_port is None:
        error("--metrics-file-sd needs --metrics-port (0: a free port)")
    if args.metrics_label and args.metrics_file_sd is None:
        error("--metrics-label labels the --metrics-file-sd target: give --metrics-file-sd PATH")
    if len(args.metrics_label) > MAX_LABELS:
        error(f"--metrics-label: at most {MAX_LABELS} labels, got {len(args.metrics_label)}")
    keys = [key for key, _ in args.metrics_label]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        error(f"--metrics-label: {', '.join(repeated)} given more than once")


def target_host(address: str) -> str:
    """The host part of the target for a server listening on ``address``: a wildcard address stands for
    every interface, which a scraper cannot connect to, so it becomes this machine's name."""
    host = socket.gethostname() if address in ("", "0.0.0.0", "::") else address
    return f"[{host}]" if ":" in host else host  # an IPv6 literal in host:port form


class FileSdTarget:
    """A file_sd target file at ``path``: ``[{"targets": ["host:port"], "labels": {...}}]``.

    Written atomically (temporary file, fsync, rename: Prometheus re-reads the file on change and must
    never see half of it) with mode 0644, since Prometheus runs as another user and the file holds no
    secret. ``remove`` deletes it unless it was replaced meanwhile (another job given the same path).
    """

    def __init__(self, path: Path, host: str, port: int, labels: dict[str, str]) -> None:
        self.path = path
        self.text = json.dumps([{"targets": [f"{host}:{port}"], "labels": labels}], indent=2) + "\n"
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise UserError(f"--metrics-file-sd: directory {parent} does not exist")
        try:
            with atomic_file(path, "w") as out:
                os.fchmod(out.fileno(), 0o644)
                out.write(self.text)
        except OSError as err:
            raise io_error(err, f"writing {path}") from err

    def remove(self) -> None:
        try:
            if self.path.read_text() == self.text:
                self.path.unlink()
        except (OSError, UnicodeDecodeError) as err:
            if not isinstance(err, FileNotFoundError):
                log.warning("--metrics-file-sd: could not remove %s (%s): Prometheus keeps a target that is gone",
                            self.path, getattr(err, "strerror", None) or err)


@contextlib.contextmanager
def served(metrics: TrainerMetrics, args: argparse.Namespace) -> Iterator[int | None]:
    """Serve ``metrics`` as the options say and publish the file_sd target; yields the port (None: not
    served). On the way out the target file goes first (Prometheus stops looking), then the server."""
    target: FileSdTarget | None = None
    try:
        try:
            bound = metrics.serve(args.metrics_port, args.metrics_address)
        except OSError as err:
            raise UserError(f"--metrics-port {args.metrics_port}: cannot listen on {args.metrics_address} "
                            f"({err.strerror or err})") from None
        if bound is not None:
            log.info("metrics: http://%s:%d/metrics", target_host(args.metrics_address), bound)
            if args.metrics_file_sd is not None:
                target = FileSdTarget(Path(args.metrics_file_sd), target_host(args.metrics_address), bound,
                                      dict(args.metrics_label))
        yield bound
    finally:
        if target is not None:
            target.remove()
        metrics.close()


def linger(seconds: float, skip: Callable[[], bool] = lambda: False) -> str | None:
    """Wait up to ``seconds``, returning early on SIGTERM or SIGINT; the name of the signal that ended the
    wait, or None when the time ran out (or ``skip()`` was true once the handlers were in place: a
    signal taken by the handlers before them). Main thread only (it installs signal handlers).

    The handlers only note the signal: one that raised could fire in the middle of anything, cleanup
    included. The wait is a ``select`` on the interpreter's signal wakeup fd, which the C-level handler
    writes to whichever thread the kernel delivers the signal to (the metrics server's thread too).
    """
    received: list[int] = []

    def note(signum: int, frame: object) -> None:
        received.append(signum)

    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if skip():
            return None
        deadline = time.monotonic() + seconds
        while not received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            select.select([reader], [], [], remaining)
            with contextlib.suppress(BlockingIOError):
                reader.recv(256)  # another signal woke it: drain, and wait on (the loop checks ``received``)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        reader.close()
        writer.close()
    return signal.Signals(received[0]).name if received else None


def linger_after_training(metrics: TrainerMetrics, seconds: float, skip: Callable[[], bool]) -> None:
    """Keep ``metrics`` served ``seconds`` after training (nothing when not served or 0), saying so first."""
    bound = metrics.port
    if bound is None or seconds <= 0:
        return

    def announce() -> bool:
        if skip():
            return True
        # logged once the handlers are in place: a signal sent on reading this line ends the wait
        log.info("metrics: serving the final values on port %d for %g s more, for Prometheus's last scrapes "
                 "(--metrics-linger; SIGTERM or Ctrl-C ends the wait)", bound, seconds)
        return False

    ended_by = linger(seconds, announce)
    if ended_by is not None:
        log.info("metrics: %s ended the wait", ended_by)
