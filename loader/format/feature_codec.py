"""8-bit feature codes (``prepare --feat-dtype uint8``; docs/FORMAT.md, "Feature codes").

Each column j is mapped affinely onto the 256 codes 0..255 over its range [low_j, high_j] (measured over every
node at prepare): code = round((x - low_j) / (high_j - low_j) * 255), decoded as low_j + (high_j - low_j) *
(code / 255). A row takes a quarter of float32's bytes, so a mega-batch holds four times the partitions at the
same budget (issue 28's per-column int8 remedy; unsigned codes, so a column's range uses all 256 of them).
The error of a value is at most (high_j - low_j) / 510; a column of two values (0/1 bag-of-words features, as
in every shared graph) decodes exactly: code 0 gives low_j, and code 255 gives low_j + (high_j - low_j),
which is high_j exactly where low_j is 0. A constant column (high_j = low_j) is all code 0.

The loader keeps and reads the codes; what crosses a slot is float32 (``DecodedRows`` in the daemon decodes
a batch's rows as it writes them), so trainers and the wire are unchanged.
"""

from dataclasses import dataclass

import numpy as np

from loader.format.codec_kernels import decode_codes
from proto.errors import UserError

__all__ = ["RANGE_FILE", "LEVELS", "FeatureCodec", "ColumnRange"]

RANGE_FILE = "feature_range.npy"
"""float32 (2, D): each column's low (row 0) and high (row 1)."""
LEVELS = 255
"""The largest code: a column's range is cut into this many steps."""


@dataclass(frozen=True)
class FeatureCodec:
    """Per-column affine 8-bit codes; ``low`` and ``high`` are float32 (D,), high >= low, finite."""

    low: np.ndarray
    high: np.ndarray

    def __post_init__(self) -> None:
        low = np.ascontiguousarray(self.low, dtype=np.float32)
        high = np.ascontiguousarray(self.high, dtype=np.float32)
        if low.ndim != 1 or low.shape != high.shape:
            raise ValueError(f"feature range: low {low.shape} and high {high.shape} must be equal 1-D shapes")
        if not (np.isfinite(low).all() and np.isfinite(high).all()) or (high < low).any():
            raise ValueError("feature range: every column needs finite low <= high")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @classmethod
    def from_table(cls, table: np.ndarray) -> "FeatureCodec":
        """From ``RANGE_FILE``'s (2, D) array."""
        if table.ndim != 2 or table.shape[0] != 2:
            raise ValueError(f"feature range: shape {table.shape}, expected (2, D)")
        return cls(table[0], table[1])

    def table(self) -> np.ndarray:
        """float32 (2, D), as ``RANGE_FILE`` stores it."""
        return np.stack([self.low, self.high])

    @property
    def dim(self) -> int:
        return len(self.low)

    @property
    def max_error(self) -> np.ndarray:
        """float32 (D,): the most a decoded value can differ from the value encoded (half a step)."""
        return (self.high - self.low) / (2 * LEVELS)

    def encode(self, rows: np.ndarray) -> np.ndarray:
        """uint8 (n, D) codes of float rows (n, D); values outside a column's range are clipped to it."""
        rows = np.asarray(rows, dtype=np.float32)
        span = self.high - self.low
        # a share of the span first (at most 1 inside the range), so a tiny span cannot overflow a scale
        share = np.divide(rows - self.low, span, out=np.zeros(rows.shape, dtype=np.float32), where=span > 0)
        return np.clip(np.rint(share * np.float32(LEVELS)), 0, LEVELS).astype(np.uint8)

    def decode(self, codes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """float32 (n, D) values of uint8 codes (n, D), into ``out`` where given (a slot's ``x``)."""
        if out is None:
            out = np.empty(codes.shape, dtype=np.float32)
        # code / 255 first: 255 / 255 is exactly 1, so a column's high decodes to low + (high - low)
        decode_codes(np.ascontiguousarray(codes, dtype=np.uint8), self.low, self.high - self.low, np.float32(LEVELS),
                     out)
        return out


class ColumnRange:
    """Each column's low and high over rows seen in chunks (prepare's first pass over the raw features)."""

    def __init__(self, dim: int) -> None:
        self.low = np.full(dim, np.inf, dtype=np.float32)
        self.high = np.full(dim, -np.inf, dtype=np.float32)
        self.rows = 0

    def add(self, rows: np.ndarray, first_row: int) -> None:
        """Fold in ``rows`` (the raw file's rows from ``first_row``: named in the error for a non-finite value)."""
        if len(rows) == 0:
            return
        values = np.asarray(rows, dtype=np.float32)
        if not np.isfinite(values).all():
            bad = int(np.argwhere(~np.isfinite(values))[0][0])
            raise UserError(f"features.npy row {first_row + bad} holds a NaN or infinity: 8-bit codes need "
                            f"finite features")
        np.minimum(self.low, values.min(axis=0), out=self.low)
        np.maximum(self.high, values.max(axis=0), out=self.high)
        self.rows += len(values)

    def codec(self) -> FeatureCodec:
        if self.rows == 0:
            return FeatureCodec(np.zeros_like(self.low), np.zeros_like(self.high))
        with np.errstate(over="ignore"):
            wide = np.flatnonzero(~np.isfinite(self.high - self.low))
        if len(wide):
            raise UserError(f"feature column {int(wide[0])} spans more than float32 holds: 8-bit codes cannot "
                            f"represent it; prepare with --feat-dtype float32")
        return FeatureCodec(self.low, self.high)
