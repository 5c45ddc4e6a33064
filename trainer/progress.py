"""What a training epoch shows while it runs: a bar on a terminal, a log line every few seconds elsewhere.

Under systemd, in CI or with stderr redirected to a file nobody sees a carriage-return bar, and a
trainer silent for a whole epoch looks hung; so without a terminal the same numbers go to the log
(``epoch 3/10: step 450/600 (75%), 1,234 samples/s, data-wait 4.1%, ETA 0:12``).

The total is the stream's own batch count (``Batch.stream_batches``, what the daemon says it will
publish), never an estimate from the seed count: a hierarchical epoch publishes one short batch per
mega-batch and pass, more than ``train_nodes / batch_size``, and a bar counted against the estimate
ended at 101.7%. Where the stream does not say (the hierarchical mode with ``passes = "auto"``) no
total, percentage or ETA is shown; a total smaller than the steps already taken grows to them, so
neither form ever passes 100%.
"""

import logging
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from trainer.records import TrainResult

__all__ = ["EpochProgress", "DEFAULT_INTERVAL_S", "format_duration", "finished_line"]

log = logging.getLogger("megabatch.trainer")

DEFAULT_INTERVAL_S = 10.0
"""Seconds between progress log lines (``--progress-interval``)."""

_BAR_INTERVAL_S = 0.2
"""Redraws of the terminal bar: often enough to look live, rarely enough to cost nothing."""


def format_duration(seconds: float) -> str:
    """``0:07``, ``12:34``, ``1:02:03``: the clock form, which stays short and sorts by eye."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class EpochProgress:
    """Progress of one training epoch: ``update`` after every step, ``close`` (or the ``with`` block) at its end.

    enabled: show anything at all (rank 0 of a run with progress on). tty (default: whether
    ``stream`` is a terminal): a bar on ``stream`` (default stderr), else log lines on the
    "megabatch.trainer" logger every ``interval_s`` seconds (0: after every step). clock: seconds,
    monotonic (default ``time.monotonic``; tests pass their own).
    """

    def __init__(self, epoch: int, epochs: int, *, enabled: bool = True, interval_s: float = DEFAULT_INTERVAL_S,
                 stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must not be negative, got {interval_s}")
        self.label = f"epoch {epoch}/{epochs}"
        self.enabled = enabled
        self.interval_s = interval_s
        self._stream = stream if stream is not None else sys.stderr
        self.tty = enabled and (self._stream.isatty() if tty is None else tty)
        self._clock = clock
        self._start = clock()
        # the first line comes one interval in: an epoch shorter than that logs none
        self._last = self._start
        self._drawn = 0  # width of the bar last drawn, to blank what a shorter redraw leaves behind
        self.total: int | None = None
        self.done = 0
        self.samples = 0
        self.wait_s = 0.0
        self.step_s = 0.0

    def update(self, total: int | None, samples: int, wait_s: float, step_s: float) -> None:
        """One step done: ``total`` the stream's batch count as its batches say (None: not known),
        ``samples`` its seeds, ``wait_s``/``step_s`` its wait for data and its step."""
        self.done += 1
        self.samples += samples
        self.wait_s += wait_s
        self.step_s += step_s
        if total is not None:
            self.total = max(total, self.done)
        if not self.enabled:
            return
        now = self._clock()
        if self.tty:
            if now - self._last >= _BAR_INTERVAL_S:
                self._draw(now)
                self._last = now
        elif now - self._last >= self.interval_s:
            log.info("%s: %s", self.label, self.describe(now))
            self._last = now

    def percent(self) -> float | None:
        """Share of the stream done, in percent (never above 100); None without a total."""
        return None if self.total is None else 100.0 * self.done / max(1, self.total)

    def describe(self, now: float | None = None) -> str:
        """``step 450/600 (75%), 1,234 samples/s, data-wait 4.1%, ETA 0:12`` (no total, share or ETA
        where the stream does not say how long it is)."""
        elapsed = (self._clock() if now is None else now) - self._start
        rate = self.samples / elapsed if elapsed > 0 else 0.0
        busy = self.wait_s + self.step_s
        wait = f"data-wait {100 * self.wait_s / busy:.1f}%" if busy > 0 else "data-wait -"
        if self.total is None:
            return f"step {self.done}, {rate:,.0f} samples/s, {wait}"
        eta = (self.total - self.done) * elapsed / self.done if self.done else 0.0
        return (f"step {self.done}/{self.total} ({self.percent():.0f}%), {rate:,.0f} samples/s, {wait}, "
                f"ETA {format_duration(eta)}")

    def _draw(self, now: float) -> None:
        percent = self.percent()
        if percent is None:
            text = f"{self.label} {self.describe(now)}"
        else:
            width = 24
            filled = int(width * percent / 100)
            text = f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.describe(now)}"
        self._stream.write("\r" + text + " " * max(0, self._drawn - len(text)))
        self._stream.flush()
        self._drawn = len(text)

    def close(self) -> None:
        """End the bar's line (the epoch line follows on its own); nothing to do for log lines."""
        if self.tty and self.done:
            self._draw(self._clock())
        if self.tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = 0

    def __enter__(self) -> "EpochProgress":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()  # an error ends the bar's line too, so that its message starts on a line of its own


def finished_line(result: TrainResult) -> str:
    """The run's totals over the epochs it trained (not those a resumed checkpoint holds):
    ``training finished: 2 epochs, 2,400 samples in 3.1 s of training (774 samples/s), data-wait 4.1%``."""
    first = (result.resumed_from_epoch or 0) + 1
    epochs = [record for record in result.epochs if record.epoch >= first]
    samples = sum(record.samples for record in epochs)
    train_s = sum(record.train_s for record in epochs)
    wait_s = sum(record.wait_s for record in epochs)
    busy = wait_s + sum(record.step_s for record in epochs)
    rate = samples / train_s if train_s > 0 else 0.0
    share = 100 * wait_s / busy if busy > 0 else 0.0
    last = f" (last epoch {epochs[-1].epoch})" if epochs else ""
    return (f"training finished: {len(epochs)} epoch{'s' if len(epochs) != 1 else ''}{last}, {samples:,} samples "
            f"in {train_s:.1f} s of training ({rate:,.0f} samples/s), data-wait {share:.1f}%")
