"""Progress for long work (offline steps, training epochs): a bar on a terminal, periodic log lines otherwise.

No dependency: a carriage-return bar is a dozen lines, and log lines keep systemd journals
and CI logs readable.
"""

import logging
import resource
import sys
import time
from types import TracebackType
from typing import TextIO

__all__ = ["Progress", "peak_rss_bytes"]

log = logging.getLogger("megabatch")

_LOG_INTERVAL_S = 10.0
_BAR_INTERVAL_S = 0.2


def peak_rss_bytes() -> int:
    """This process's peak resident set size.

    VmHWM belongs to the current address space; ``ru_maxrss`` would also count a large parent
    that forked this process, because Linux carries it across ``exec``.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Progress:
    """Track ``done`` out of ``total`` units of one named step.

    ``stream`` defaults to stderr; a bar is drawn only when it is a terminal and ``enabled``.
    """

    def __init__(self, step: str, total: int, unit: str = "", *, enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.step = step
        self.total = max(0, int(total))
        self.unit = unit
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._tty = enabled and self._stream.isatty()
        self._start = time.monotonic()
        # the first periodic log line comes one interval in: short steps log only start and end
        self._last = self._start if not self._tty else 0.0
        if enabled and not self._tty:
            log.info("%s: started (%d %s)", step, self.total, unit)

    def update(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if not self._enabled:
            return
        if self._tty and now - self._last >= _BAR_INTERVAL_S:
            self._draw(now)
        elif not self._tty and now - self._last >= _LOG_INTERVAL_S:
            log.info("%s: %d/%d %s (%.0f%%)", self.step, self.done, self.total, self.unit, self._percent())
        else:
            return
        self._last = now

    def _percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    def _draw(self, now: float) -> None:
        width = 30
        filled = int(width * min(1.0, self.done / self.total)) if self.total else width
        elapsed = now - self._start
        self._stream.write(f"\r{self.step:<24} [{'#' * filled}{'.' * (width - filled)}] "
                           f"{self._percent():5.1f}% {elapsed:6.1f}s")
        self._stream.flush()

    def close(self) -> None:
        if not self._enabled:
            return
        elapsed = time.monotonic() - self._start
        if self._tty:
            self._draw(time.monotonic())
            self._stream.write("\n")
            self._stream.flush()
        else:
            # shows which step sets the process's high-water mark
            log.info("%s: done in %.1f s (peak RSS so far %.0f MiB)", self.step, elapsed, peak_rss_bytes() / 2**20)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        elif self._tty:
            self._stream.write("\n")
