"""``megabatch top``: what ``megabatch status --json`` reports, redrawn in the terminal every few seconds.

Each frame is one scrape of the daemon's metrics endpoint turned into ``status_fields`` and laid out in plain lines
cut to the terminal's width and height, so it works over ssh and in any terminal: no curses, no dependency, only
"cursor home", "clear to end of line" and "clear below" (ANSI, which every terminal emulator speaks). The first
frame's rates are over the daemon's uptime, every later frame's between it and the frame before (live rates, as a
PromQL ``rate`` over the interval). ``--once`` prints one frame and exits; piped (not a terminal), frames are
printed one after the other with no escape codes.

Rendering (``render_top``) is a pure function of the fields and the size, which is what the tests check.
"""

import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from loader.daemon.status import PURPOSES, Samples, scrape, status_fields
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["render_top", "run_top"]

HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
UNLIMITED = 1 << 20
"""Width and height of a frame written where no terminal bounds it (a pipe, a file)."""


def _printable(text: str) -> str:
    """Label values come from the endpoint (a client's name among them): no control character reaches the
    terminal, where it could move the cursor or repaint the frame."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _or_dash(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f} us"
    if value < 1.0:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.2f} s"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    text = f"{rest // 3600}:{rest // 60 % 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


def _size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


def _purpose_line(fields: dict[str, Any], purpose: str) -> str:
    rates, latency = fields["rates"], fields["read_latency_seconds"][purpose]
    head = f"{purpose:<8} "
    if purpose in rates["batches_per_second"]:
        head += (f"{_or_dash(rates['batches_per_second'][purpose], ',.1f')} batches/s, "
                 f"{_or_dash(rates['samples_per_second'][purpose], ',.0f')} samples/s, ")
    amplification = fields["read_amplification"].get(purpose)
    return (head + f"disk {_mb(rates['disk_read_bytes_per_second'][purpose])} MB/s"
            + (f", amplification {amplification:,.2f}x" if amplification is not None else "")
            + f"; reads {latency['requests']:,}, p50 {_seconds(latency['p50'])}, p99 {_seconds(latency['p99'])}")


def render_top(fields: dict[str, Any], width: int, height: int, clock: str = "") -> str:
    """One frame of ``fields`` (``status_fields``), at most ``height`` lines of at most ``width`` characters."""
    window = fields["window"]
    memory = fields["memory"]
    over = memory["resident_over_budget_bytes"]
    lines = [
        f"megabatch {fields['version'] or '?'}: dataset {fields['dataset'] or '?'}, mode {fields['mode'] or '?'}, "
        f"epoch {_or_dash(fields['epoch'], 'd')}, up {_duration(fields['uptime_seconds'])}"
        + (f"  [{clock}]" if clock else ""),
        f"memory   resident {_size(memory['resident_bytes'])} of budget {_size(memory['budget_bytes'])} "
        f"(plan {_size(memory['plan_bytes'])}"
        + (f"; {format_size(abs(over))} {'over' if over >= 0 else 'under'} the budget)" if over is not None else ")"),
        "rates    " + ("since the daemon started" if window["basis"] == "uptime" else
                       f"over the last {window['seconds']:.1f} s"),
    ]
    lines += [_purpose_line(fields, purpose) for purpose in PURPOSES
              if purpose != "startup" or fields["read_latency_seconds"][purpose]["requests"]
              or fields["rates"]["disk_read_bytes_per_second"][purpose]]
    hits = fields["cache_hit_ratios"]
    slots, queues = fields["slots"], fields["queues"]
    lines += [
        f"disk     {_mb(fields['rates']['disk_read_bytes_per_second']['total'])} MB/s read in all",
        f"caches   hit ratio: features {_or_dash(hits['features'], '.3f')}, neighbour lists "
        f"{_or_dash(hits['neighbour_lists'], '.3f')}, client caches {_or_dash(hits['client_caches'], '.3f')}",
        f"slots    {_or_dash(slots['in_use'], 'd')} of {_or_dash(slots['capacity'], 'd')} in use; queues: "
        + (", ".join(f"{name} {q['depth']}/{q['capacity']}" for name, q in sorted(queues.items())) or "-"),
    ]
    training = fields["training"]
    if training["holder"] is not None or training["waiting"]:
        waiting = ", ".join(f"{w['trainer']} ({w['place']})" for w in training["waiting"])
        lines.append(f"training {training['holder'] or 'nobody'}" + (f"; waiting: {waiting}" if waiting else ""))
    clients = fields["clients"]
    lines.append(f"clients  {len(clients)} connected")
    rows = [f"  {'SESSION':>7}  {'PID':>8}  {'UID':>6}  {'JOB':<16}  {'RANK':>4}  CLIENT"] if clients else []
    rows += [f"  {c['session']:>7}  {c['pid']:>8}  {c['uid']:>6}  {(c['job'] or '-'):<16}  {c['rank']:>4}  "
             f"{c['client']}" for c in clients]
    room = height - len(lines)
    if len(rows) > room:  # the frame's last line says how many clients it left out
        shown = max(0, room - 1)
        rows = rows[:shown] + [f"  ... {len(rows) - shown} more"] if room > 0 else []
    lines += rows
    return "\n".join(_printable(line)[:width] for line in lines[:height])


def run_top(url: str, *, interval: float, once: bool, out: TextIO = sys.stdout,
            read: Callable[[str], Samples] = scrape) -> int:
    """Draw frames until interrupted (``once``: one frame). A daemon that cannot be read at the first frame is an
    error (``UserError``); later, the frame says so and ``top`` keeps trying (a daemon restarting comes back)."""
    tty = out.isatty()
    terminal = tty and not once  # redrawn in place; else frame after frame, uncut where no terminal limits them
    previous: tuple[Samples, float] | None = None
    samples: Samples | None = read(url)
    try:
        while True:
            now = time.time()
            size = shutil.get_terminal_size()
            clock = time.strftime("%H:%M:%S", time.localtime(now))
            if samples is None:
                frame = f"megabatch top: cannot read {url} (retrying every {interval:g} s)"
            else:
                frame = render_top(status_fields(samples, now=now, previous=previous),
                                   size.columns if tty else UNLIMITED, size.lines - 1 if terminal else UNLIMITED, clock)
                previous = (samples, now)
            if terminal:
                out.write(HOME + frame.replace("\n", CLEAR_LINE + "\n") + CLEAR_LINE + "\n" + CLEAR_BELOW)
            else:
                out.write(frame + "\n" + ("" if once else "\n"))
            out.flush()
            if once:
                return 0
            time.sleep(interval)
            try:
                samples = read(url)
            except UserError:
                samples = None
    except KeyboardInterrupt:  # the way to leave top: not an error
        if terminal:
            out.write("\n")
        return 0
