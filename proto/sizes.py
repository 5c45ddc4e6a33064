"""Human sizes and counts: parse ``--memory-budget 512M``, print ``1.5 GiB`` and ``1 mega-batch``."""

import re

from proto.errors import UserError

__all__ = ["parse_size", "format_size", "counted"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, *, name: str = "size") -> int:
    """Parse ``"256M"``, ``"2GiB"``, ``"1.5G"`` or a plain byte count (binary units)."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        if match is None:
            raise UserError(f"{name}: cannot parse {text!r} as a size (examples: 512M, 2G, 1073741824)")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise UserError(f"{name}: must be positive, got {text!r}")
    return value


def format_size(nbytes: float) -> str:
    """Format a byte count with binary units, three significant digits."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        # from 999.5 of a unit ".3g" writes "1e+03": whole numbers there, and the next unit once they round to 1024
        text = f"{value:.0f}" if unit == "B" or abs(value) >= 999.5 else f"{value:.3g}"
        if abs(float(text)) < 1024 or unit == "TiB":
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, in the plural unless it is 1: "1 client", "3 clients", "1 mega-batch",
    "2 mega-batches" (``plural`` default: the noun + "es" after s, x, ch or sh, else + "s")."""
    if count == 1:
        return f"1 {noun}"
    if plural is None:
        plural = noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{count:,} {plural}"
