"""The shared-memory slot ring: a segment of ``count`` slots that each carry one batch.

Slot ``i`` occupies bytes ``[i * slot_bytes, (i + 1) * slot_bytes)`` of the segment; ``slot_bytes`` is a
multiple of ``PAGE_BYTES`` (4096), so every slot starts on a page. A slot begins with a
``header_bytes``-byte header (default ``HEADER_BYTES`` = 4096), followed by the batch's arrays, each at an
offset that is a multiple of its ``ArraySpec.align`` (default 64). The binary header layout is specified
in proto/PROTOCOL.md ("Slot header").

The producer (the daemon) places a batch with ``place_arrays``, fills the arrays in place through
``SlotRing.arrays_for`` and publishes them with ``SlotRing.commit``, which writes the header last and its
magic last of all. The consumer (the trainer) gets zero-copy views with ``SlotRing.read``, which checks
every header field and bound first, so a corrupt or stale header raises ``SlotError`` instead of reading
outside the slot.
"""

import enum
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from proto.errors import SlotError, SlotOverflow
from proto.messages import KINDS, BatchId, SlotLayout

__all__ = [
    "PAGE_BYTES", "HEADER_BYTES", "MIN_HEADER_BYTES", "ARRAY_ALIGNMENT", "MAGIC", "LAYOUT_VERSION", "MAX_ARRAYS",
    "NAME_BYTES", "MAX_NDIM", "DType", "KIND_CODES", "ArraySpec", "PlacedArray", "SlotPlacement",
    "SlotContents", "SlotRing", "place_arrays", "slot_bytes_for",
]

PAGE_BYTES = 4096
"""Slot sizes are multiples of this, so every slot starts on a page of the mapping."""
HEADER_BYTES = 4096
"""Default header size of a slot (one page; the array table needs ``MIN_HEADER_BYTES``)."""
ARRAY_ALIGNMENT = 64
"""Minimum alignment of every array's offset (a cache line; enough for every supported dtype)."""
MAGIC = b"MBSLOT01"
LAYOUT_VERSION = 1
MAX_ARRAYS = 32
NAME_BYTES = 16
MAX_NDIM = 4

_FIXED = struct.Struct("<8sHBB4xQIIIiQ16x")
"""magic, version, kind, num_arrays, (pad), seq, epoch, pass_index, batch_index, num_batches, payload_bytes."""
_ENTRY = struct.Struct(f"<{NAME_BYTES}sBB6x{MAX_NDIM}QQQ")
"""name, dtype code, ndim, (pad), shape[4], offset, nbytes."""
_TABLE_OFFSET = _FIXED.size
MIN_HEADER_BYTES = _TABLE_OFFSET + MAX_ARRAYS * _ENTRY.size
"""Smallest valid header: the fixed part and a full array table (2368 bytes)."""
assert _FIXED.size == 64 and _ENTRY.size == 72 and MIN_HEADER_BYTES % ARRAY_ALIGNMENT == 0


class DType(enum.IntEnum):
    """Dtype codes of the array table; 0 is never valid, so a zeroed entry is rejected."""

    INT32 = 1
    INT64 = 2
    FLOAT32 = 3
    FLOAT16 = 4
    UINT8 = 5
    BOOL = 6

    @property
    def numpy(self) -> np.dtype[Any]:
        return _NUMPY_DTYPES[self]


_NUMPY_DTYPES: dict[DType, np.dtype[Any]] = {
    DType.INT32: np.dtype("<i4"), DType.INT64: np.dtype("<i8"), DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT16: np.dtype("<f2"), DType.UINT8: np.dtype("u1"), DType.BOOL: np.dtype("?"),
}

KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
"""Stream kind -> header code: train 0, val 1, test 2."""


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _dtype_code(dtype: npt.DTypeLike) -> DType:
    dt = np.dtype(dtype)
    for code, candidate in _NUMPY_DTYPES.items():
        if dt == candidate and dt.byteorder != ">":
            return code
    raise ValueError(f"ArraySpec.dtype: {dt} is not supported (supported: "
                     f"{', '.join(str(d) for d in _NUMPY_DTYPES.values())}, little-endian)")


@dataclass(frozen=True)
class ArraySpec:
    """One array of a batch: ``name`` (ASCII, 1 to 16 bytes), ``dtype`` (a ``DType``), ``shape`` (up to 4 dims).

    ``align`` (default 64) is the alignment of the array's offset: a power of two from 64 to 4096 (4096
    lets ``O_DIRECT`` read into it). The constructor normalizes ``dtype`` to its little-endian
    ``np.dtype`` and ``shape`` to a tuple of ints.
    """

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    align: int = ARRAY_ALIGNMENT

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isascii() or not 1 <= len(self.name) <= NAME_BYTES \
                or "\0" in self.name:
            raise ValueError(f"ArraySpec.name must be 1 to {NAME_BYTES} ASCII characters without NUL, "
                             f"got {self.name!r}")
        object.__setattr__(self, "dtype", _dtype_code(self.dtype).numpy)
        shape = tuple(self.shape)
        if len(shape) > MAX_NDIM or any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0
                                        for d in shape):
            raise ValueError(f"ArraySpec.shape of {self.name!r} must be at most {MAX_NDIM} non-negative ints, "
                             f"got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if not ARRAY_ALIGNMENT <= self.align <= PAGE_BYTES or self.align & (self.align - 1):
            raise ValueError(f"ArraySpec.align of {self.name!r} must be a power of two in "
                             f"[{ARRAY_ALIGNMENT}, {PAGE_BYTES}], got {self.align}")

    @property
    def code(self) -> DType:
        return _dtype_code(self.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class PlacedArray:
    """Where one array lies in a slot: ``offset`` from the slot start, ``nbytes`` long."""

    spec: ArraySpec
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SlotPlacement:
    """The placement of a batch's arrays in a slot of ``slot_bytes`` bytes with a ``header_bytes`` header.

    ``payload_bytes`` is the span from the end of the header to the end of the last array.
    """

    arrays: tuple[PlacedArray, ...]
    slot_bytes: int
    header_bytes: int
    payload_bytes: int


def _check_geometry(slot_bytes: int, header_bytes: int) -> None:
    if header_bytes < MIN_HEADER_BYTES or header_bytes % ARRAY_ALIGNMENT:
        raise SlotError(f"header_bytes must be a multiple of {ARRAY_ALIGNMENT} and at least {MIN_HEADER_BYTES}, "
                        f"got {header_bytes}")
    if slot_bytes <= header_bytes or slot_bytes % PAGE_BYTES:
        raise SlotError(f"slot_bytes must be a multiple of {PAGE_BYTES} larger than header_bytes = {header_bytes}, "
                        f"got {slot_bytes}")


def _place(specs: Sequence[ArraySpec], header_bytes: int) -> tuple[tuple[PlacedArray, ...], int]:
    """The arrays placed in order after the header, and the offset where the last one ends."""
    if len(specs) > MAX_ARRAYS:
        raise ValueError(f"a slot holds at most {MAX_ARRAYS} arrays, got {len(specs)}")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"array names must be unique, got {names}")
    placed = []
    end = header_bytes
    for spec in specs:
        offset = _round_up(end, spec.align)
        placed.append(PlacedArray(spec, offset, spec.nbytes))
        end = offset + spec.nbytes
    return tuple(placed), end


def place_arrays(specs: Sequence[ArraySpec], slot_bytes: int, header_bytes: int = HEADER_BYTES) -> SlotPlacement:
    """Place ``specs`` in one slot; raises ``SlotOverflow`` (needed = the slot size that would fit).

    ``header_bytes`` defaults to ``HEADER_BYTES``.
    """
    _check_geometry(slot_bytes, header_bytes)
    placed, end = _place(specs, header_bytes)
    if end > slot_bytes:
        raise SlotOverflow(_round_up(end, PAGE_BYTES), slot_bytes)
    return SlotPlacement(placed, slot_bytes, header_bytes, end - header_bytes)


def slot_bytes_for(specs: Sequence[ArraySpec], header_bytes: int = HEADER_BYTES) -> int:
    """The smallest valid slot size that holds ``specs`` (a multiple of 4096 above ``header_bytes``)."""
    _check_geometry(_round_up(header_bytes + 1, PAGE_BYTES), header_bytes)
    _, end = _place(specs, header_bytes)
    return _round_up(max(end, header_bytes + 1), PAGE_BYTES)


@dataclass(frozen=True)
class SlotContents:
    """A committed slot as the reader sees it: the batch its header names and zero-copy views of the
    arrays, by name."""

    batch_id: BatchId
    arrays: dict[str, np.ndarray] = field(repr=False)
    payload_bytes: int


class SlotRing:
    """Typed access to the slots of a segment held in ``buffer`` (an ``mmap.mmap`` or any byte buffer).

    The buffer must hold at least ``count * slot_bytes`` bytes; ``header_bytes`` defaults to
    ``HEADER_BYTES``. A read-only buffer (the trainer's mapping) allows ``read`` only. Arrays returned by
    ``arrays_for`` and ``read`` are views of the buffer: while they live, an ``mmap`` cannot be closed.
    """

    def __init__(self, buffer: Any, count: int, slot_bytes: int, header_bytes: int = HEADER_BYTES) -> None:
        _check_geometry(slot_bytes, header_bytes)
        if count < 1:
            raise SlotError(f"count must be >= 1, got {count}")
        view = memoryview(buffer).cast("B")
        if len(view) < count * slot_bytes:
            raise SlotError(f"the segment has {len(view)} bytes, {count} slots of {slot_bytes} bytes "
                            f"need {count * slot_bytes}")
        self.count = count
        self.slot_bytes = slot_bytes
        self.header_bytes = header_bytes
        self.writable = not view.readonly
        self._view = view
        self._bytes = np.frombuffer(view, dtype=np.uint8, count=count * slot_bytes)

    @classmethod
    def from_layout(cls, buffer: Any, layout: SlotLayout) -> "SlotRing":
        """The ring ``layout`` (from ``Welcome.slots``) describes over ``buffer``."""
        return cls(buffer, layout.count, layout.slot_bytes, layout.header_bytes)

    def close(self) -> None:
        """Drop this ring's references to the buffer (idempotent); views handed out stay valid."""
        self._bytes = np.empty(0, dtype=np.uint8)
        self._view = memoryview(b"")
        self.count = 0

    def _start(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.count:
            raise SlotError(f"slot {slot!r} is outside the ring (0 to {self.count - 1})")
        return slot * self.slot_bytes

    def _check_placement(self, placement: SlotPlacement) -> None:
        if (placement.slot_bytes, placement.header_bytes) != (self.slot_bytes, self.header_bytes):
            raise SlotError(f"placement is for {placement.slot_bytes}-byte slots with {placement.header_bytes}-byte "
                            f"headers, the ring has {self.slot_bytes} and {self.header_bytes}")

    def _check_writable(self) -> None:
        if not self.writable:
            raise SlotError("the slot ring is mapped read-only")

    # --- writer side -------------------------------------------------------------------------------

    def arrays_for(self, slot: int, placement: SlotPlacement) -> dict[str, np.ndarray]:
        """Writable views of ``slot`` laid out by ``placement``, to fill in place; invalidates the slot first."""
        self._check_writable()
        self._check_placement(placement)
        start = self._start(slot)
        # A reader must not take the old header for a description of the arrays being overwritten.
        self._bytes[start:start + len(MAGIC)] = 0
        return {a.spec.name: self._array(start + a.offset, a.spec.dtype, a.spec.shape) for a in placement.arrays}

    def commit(self, slot: int, batch: BatchId, placement: SlotPlacement) -> None:
        """Publish ``slot``: write the array table, then the header fields, then the magic.

        Writing the magic last means a reader that finds it sees the rest of the header; the
        happens-before edge between processes is still the ``BatchReady`` message sent after this.
        """
        self._check_writable()
        self._check_placement(placement)
        start = self._start(slot)
        self._bytes[start:start + len(MAGIC)] = 0
        for i, a in enumerate(placement.arrays):
            shape = a.spec.shape + (0,) * (MAX_NDIM - len(a.spec.shape))
            _ENTRY.pack_into(self._view, start + _TABLE_OFFSET + i * _ENTRY.size, a.spec.name.encode("ascii"),
                             a.spec.code, len(a.spec.shape), *shape, a.offset, a.nbytes)
        fixed = _FIXED.pack(MAGIC, LAYOUT_VERSION, KIND_CODES[batch.kind], len(placement.arrays), batch.seq,
                            batch.epoch, batch.pass_index, batch.batch_index, batch.num_batches,
                            placement.payload_bytes)
        self._view[start + len(MAGIC):start + _FIXED.size] = fixed[len(MAGIC):]
        self._view[start:start + len(MAGIC)] = MAGIC

    def clear(self, slot: int) -> None:
        """Zero the header of ``slot``: ``read`` refuses it until the next ``commit``."""
        self._check_writable()
        start = self._start(slot)
        self._bytes[start:start + self.header_bytes] = 0

    # --- reader side -------------------------------------------------------------------------------

    def read(self, slot: int, expect_seq: int | None = None) -> SlotContents:
        """The committed batch in ``slot`` as zero-copy views; raises ``SlotError`` if the header is invalid.

        ``expect_seq`` (default None: any) is the ``seq`` of the ``BatchReady`` that named the slot; a
        different one means a stale or reused slot.
        """
        start = self._start(slot)
        # Copy the header once and validate the copy, so every bound below holds for the views built.
        (magic, version, kind, num_arrays, seq, epoch, pass_index, batch_index, num_batches,
         payload_bytes) = _FIXED.unpack(bytes(self._view[start:start + _FIXED.size]))
        where = f"slot {slot}"
        if magic != MAGIC:
            raise SlotError(f"{where} holds no committed batch (magic {magic!r}, expected {MAGIC!r})")
        if version != LAYOUT_VERSION:
            raise SlotError(f"{where} has header layout version {version}, this reader supports {LAYOUT_VERSION}")
        if kind >= len(KINDS):
            raise SlotError(f"{where} has unknown kind code {kind}")
        if expect_seq is not None and seq != expect_seq:
            raise SlotError(f"{where} holds batch seq {seq}, expected {expect_seq} (stale or reused slot)")
        if num_batches < -1:
            raise SlotError(f"{where} has num_batches {num_batches}, expected -1 or more")
        if num_arrays > MAX_ARRAYS:
            raise SlotError(f"{where} declares {num_arrays} arrays, at most {MAX_ARRAYS} fit")
        if payload_bytes > self.slot_bytes - self.header_bytes:
            raise SlotError(f"{where} declares {payload_bytes} payload bytes, a slot has room for "
                            f"{self.slot_bytes - self.header_bytes}")
        table = bytes(self._view[start + _TABLE_OFFSET:start + _TABLE_OFFSET + num_arrays * _ENTRY.size])
        arrays: dict[str, np.ndarray] = {}
        spans = []
        for i in range(num_arrays):
            name, dtype, shape, offset, nbytes = self._entry(where, i, table, payload_bytes)
            if name in arrays:
                raise SlotError(f"{where} array table names {name!r} twice")
            spans.append((offset, offset + nbytes, name))
            arrays[name] = self._array(start + offset, dtype, shape)
        spans.sort()
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise SlotError(f"{where} arrays {first!r} and {second!r} overlap")
        try:
            batch = BatchId(KINDS[kind], seq, epoch, pass_index, batch_index, num_batches)
        except ValueError as err:
            raise SlotError(f"{where} header: {err}") from None
        return SlotContents(batch, arrays, payload_bytes)

    def _entry(self, where: str, i: int, table: bytes,
               payload_bytes: int) -> tuple[str, np.dtype[Any], tuple[int, ...], int, int]:
        raw_name, code, ndim, *rest = _ENTRY.unpack_from(table, i * _ENTRY.size)
        dims, offset, nbytes = rest[:MAX_NDIM], rest[MAX_NDIM], rest[MAX_NDIM + 1]
        what = f"{where} array {i}"
        name_bytes = raw_name.rstrip(b"\0")
        if not name_bytes or b"\0" in name_bytes or not name_bytes.isascii():
            raise SlotError(f"{what} has an invalid name {raw_name!r}")
        name = name_bytes.decode("ascii")
        what = f"{where} array {name!r}"
        if code not in DType._value2member_map_:
            raise SlotError(f"{what} has unknown dtype code {code}")
        dtype = DType(code).numpy
        if ndim > MAX_NDIM or any(dims[ndim:]):
            raise SlotError(f"{what} has an invalid shape (ndim {ndim}, dims {list(dims)})")
        shape = tuple(dims[:ndim])
        if nbytes != math.prod(shape) * dtype.itemsize:
            raise SlotError(f"{what} declares {nbytes} bytes, shape {shape} of {dtype} needs "
                            f"{math.prod(shape) * dtype.itemsize}")
        payload_end = self.header_bytes + payload_bytes
        if offset % ARRAY_ALIGNMENT or offset < self.header_bytes or offset + nbytes > payload_end:
            raise SlotError(f"{what} at offset {offset} ({nbytes} bytes) is misaligned or outside the payload "
                            f"[{self.header_bytes}, {payload_end})")
        return name, dtype, shape, offset, nbytes

    def _array(self, begin: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        nbytes = math.prod(shape) * dtype.itemsize
        return self._bytes[begin:begin + nbytes].view(dtype).reshape(shape)
