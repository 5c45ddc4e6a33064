"""argparse ``type=`` converters of the two command lines (``megabatch`` and ``megabatch train``).

Each turns an option's text into its value or raises ``argparse.ArgumentTypeError`` with the reason, which
argparse prints after the option's name: ``--epochs: must be positive, got 0``.
"""

import argparse
import math
from collections.abc import Callable

__all__ = ["positive_int", "non_negative_int", "port", "positive_seconds", "non_negative_seconds", "parse_fanouts"]

MAX_PORT = 65535


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _seconds(text: str, ok: Callable[[float], bool], requirement: str) -> float:
    """A finite number of seconds for which ``ok`` holds; ``requirement`` says which (the error's words)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {requirement} number of seconds, got {text}")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1 (counts, sizes)."""
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (seeds)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (what 0 means is the option's: off, or any free port)."""
    value = _int(text)
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to {MAX_PORT}, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (timeouts that must end)."""
    return _seconds(text, lambda value: value > 0, "a positive")


def non_negative_seconds(text: str) -> float:
    """A finite number of seconds of at least 0 (waits where 0 means not at all)."""
    return _seconds(text, lambda value: value >= 0, "a non-negative")


def parse_fanouts(text: str) -> tuple[int, ...]:
    """"10,5" -> (10, 5); each entry a positive integer or -1 (all neighbours)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 10,5, got {text!r}") from None
    if any(v == 0 or v < -1 for v in values):
        raise argparse.ArgumentTypeError(f"each fanout must be positive or -1 (all neighbours), got {text!r}")
    return values
