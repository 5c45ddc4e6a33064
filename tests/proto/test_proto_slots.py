"""proto.slots: plan/commit/read round-trips; invalid, stale or corrupt headers are SlotErrors."""

import mmap
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto import slots
from proto.errors import SlotError, SlotOverflow
from proto.messages import BatchId, SlotLayout
from proto.slots import (
    ARRAY_ALIGNMENT,
    HEADER_BYTES,
    MAX_ARRAYS,
    MIN_HEADER_BYTES,
    PAGE_BYTES,
    ArraySpec,
    SlotRing,
    place_arrays,
    slot_bytes_for,
)

DTYPES = ["int32", "int64", "float32", "float16", "uint8", "bool"]
FIXED_END = 64
ENTRY_BYTES = 72


def fill(arrays: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Write deterministic random values into ``arrays`` in place; return copies for comparison."""
    rng = np.random.default_rng(seed)
    for arr in arrays.values():
        if arr.dtype == np.bool_:
            arr[...] = rng.random(arr.shape) < 0.5
        else:
            arr[...] = rng.integers(0, 100, size=arr.shape).astype(arr.dtype)
    return {name: arr.copy() for name, arr in arrays.items()}


def address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def batch_specs() -> list[ArraySpec]:
    return [ArraySpec("x", np.dtype("float32"), (100, 16), align=4096), ArraySpec("y", np.dtype("int64"), (10,)),
            ArraySpec("edge_index", np.dtype("int64"), (2, 300)), ArraySpec("mask", np.dtype("bool"), (10,))]


def committed_ring(count: int = 3, slot: int = 1, seq: int = 5):
    specs = batch_specs()
    slot_bytes = slot_bytes_for(specs)
    buf = bytearray(count * slot_bytes)
    ring = SlotRing(buf, count, slot_bytes)
    plan = place_arrays(specs, slot_bytes)
    expected = fill(ring.arrays_for(slot, plan), seed=seq)
    ring.commit(slot, BatchId("train", seq, 2, 1, 7, 40), plan)
    return ring, buf, slot_bytes, expected


specs_strategy = st.lists(
    st.builds(ArraySpec, st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=16),
              st.sampled_from(DTYPES).map(np.dtype), st.lists(st.integers(0, 9), max_size=4).map(tuple),
              st.sampled_from([64, 128, 4096])),
    max_size=8, unique_by=lambda s: s.name)


@settings(max_examples=150, deadline=None)
@given(specs_strategy, st.integers(0, 2), st.sampled_from(["train", "val", "test"]), st.integers(0, 2**63 - 1),
       st.integers(-1, 2**31 - 1), st.integers(0, 2**32))
def test_plan_commit_read_round_trip(specs, slot, kind, seq, num_batches, seed):
    slot_bytes = slot_bytes_for(specs)
    assert slot_bytes % PAGE_BYTES == 0 and slot_bytes > HEADER_BYTES
    segment = mmap.mmap(-1, 3 * slot_bytes)  # page aligned, like the real segment
    ring = SlotRing(segment, 3, slot_bytes)
    plan = place_arrays(specs, slot_bytes)
    arrays = ring.arrays_for(slot, plan)
    expected = fill(arrays, seed)
    header = BatchId(kind, seq, seed % 2**32, 3, 9, num_batches)
    ring.commit(slot, header, plan)
    contents = ring.read(slot, expect_seq=seq)
    assert contents.batch_id == header
    assert list(contents.arrays) == [s.name for s in specs]
    base = address(np.frombuffer(segment, np.uint8))
    slot_begin = base + slot * slot_bytes
    spans = []
    for spec in specs:
        got = contents.arrays[spec.name]
        assert got.dtype == spec.dtype and got.shape == spec.shape
        np.testing.assert_array_equal(got, expected[spec.name])
        if got.nbytes:
            assert address(got) % spec.align == 0
            assert slot_begin + HEADER_BYTES <= address(got) and address(got) + got.nbytes <= slot_begin + slot_bytes
            spans.append((address(got), address(got) + got.nbytes))
            assert address(got) == address(arrays[spec.name])  # zero copy: the reader sees the writer's memory
    spans.sort()
    assert all(end <= begin for (_, end), (begin, _) in zip(spans, spans[1:]))
    for other in {0, 1, 2} - {slot}:
        with pytest.raises(SlotError, match="no committed batch"):
            ring.read(other)


def test_writes_after_commit_are_visible_through_read_views():
    ring, buf, _, expected = committed_ring()
    view = ring.read(1).arrays["y"]
    buf_view = ring.arrays_for(1, place_arrays(batch_specs(), ring.slot_bytes))["y"]
    buf_view[:] = -1
    assert (view == -1).all()
    assert not (expected["y"] == -1).all()


def test_overflow_names_the_size_needed():
    specs = batch_specs()
    needed = slot_bytes_for(specs)
    with pytest.raises(SlotOverflow, match=f"needs {needed} bytes per slot but slots have 8192") as info:
        place_arrays(specs, 8192)
    assert (info.value.needed, info.value.available) == (needed, 8192)
    assert place_arrays(specs, needed).payload_bytes <= needed - HEADER_BYTES


def test_uncommitted_cleared_and_rewritten_slots_are_invalid():
    ring, _, slot_bytes, _ = committed_ring()
    with pytest.raises(SlotError, match="slot 0 holds no committed batch"):
        ring.read(0)
    ring.read(1)
    ring.arrays_for(1, place_arrays(batch_specs(), slot_bytes))  # the producer starts overwriting the slot
    with pytest.raises(SlotError, match="no committed batch"):
        ring.read(1)
    ring.commit(1, BatchId("val", 6, 0, 0, 0, -1), place_arrays(batch_specs(), slot_bytes))
    assert ring.read(1, expect_seq=6).batch_id.kind == "val"
    ring.clear(1)
    with pytest.raises(SlotError, match="no committed batch"):
        ring.read(1)


def test_an_interrupted_commit_leaves_the_slot_invalid(monkeypatch):
    # The magic is written last: a commit that stops while writing the table must not publish the slot.
    ring, _, slot_bytes, _ = committed_ring()
    real = slots._ENTRY

    class FailingEntry:
        size = real.size
        calls = 0

        def pack_into(self, *args: object) -> None:
            FailingEntry.calls += 1
            if FailingEntry.calls == 2:
                raise RuntimeError("producer died mid-commit")
            real.pack_into(*args)

    monkeypatch.setattr(slots, "_ENTRY", FailingEntry())
    with pytest.raises(RuntimeError):
        ring.commit(1, BatchId("train", 6, 0, 0, 0, -1), place_arrays(batch_specs(), slot_bytes))
    monkeypatch.setattr(slots, "_ENTRY", real)
    with pytest.raises(SlotError, match="no committed batch"):
        ring.read(1)


def test_stale_seq_is_rejected():
    ring, *_ = committed_ring(seq=5)
    with pytest.raises(SlotError, match="holds batch seq 5, expected 6"):
        ring.read(1, expect_seq=6)


def _corrupt(buf: bytearray, slot_bytes: int, offset: int, fmt: str, value: object) -> None:
    struct.pack_into(fmt, buf, slot_bytes + offset, value)


def _entry(i: int, field_offset: int) -> int:
    return FIXED_END + i * ENTRY_BYTES + field_offset


# (what, byte offset in the header, struct format, value, expected message)
CORRUPTIONS = [
    ("version", 8, "<H", 2, "layout version 2"),
    ("kind", 10, "<B", 7, "unknown kind code 7"),
    ("num_arrays", 11, "<B", 200, "declares 200 arrays"),
    ("num_batches", 36, "<i", -5, "num_batches -5"),
    ("payload_bytes", 40, "<Q", 2**63, "payload bytes"),
    ("name", _entry(0, 0), "<16s", b"", "invalid name"),
    ("name non-ascii", _entry(0, 0), "<16s", b"\xff", "invalid name"),
    ("name inner NUL", _entry(0, 0), "<16s", b"a\0b", "invalid name"),
    ("duplicate name", _entry(1, 0), "<16s", b"x", "names 'x' twice"),
    ("dtype code 0", _entry(0, 16), "<B", 0, "unknown dtype code 0"),
    ("dtype code 99", _entry(0, 16), "<B", 99, "unknown dtype code 99"),
    ("ndim", _entry(0, 17), "<B", 5, "invalid shape"),
    ("dim beyond ndim", _entry(1, 24 + 8), "<Q", 3, "invalid shape"),
    ("huge dim", _entry(0, 24), "<Q", 2**64 - 1, "declares"),
    ("nbytes", _entry(0, 64), "<Q", 12, "declares 12 bytes"),
    ("offset past slot", _entry(0, 56), "<Q", 2**64 - 4096, "outside the payload"),
    ("offset in header", _entry(0, 56), "<Q", 0, "outside the payload"),
    ("offset misaligned", _entry(1, 56), "<Q", HEADER_BYTES + 6400 + 8, "misaligned"),
    ("overlap", _entry(1, 56), "<Q", HEADER_BYTES, "overlap"),
]


@pytest.mark.parametrize(("what", "offset", "fmt", "value", "match"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupt_header_fields_are_slot_errors(what, offset, fmt, value, match):
    ring, buf, slot_bytes, _ = committed_ring()
    ring.read(1)
    _corrupt(buf, slot_bytes, offset, fmt, value)
    with pytest.raises(SlotError, match=match):
        ring.read(1)


# Header bytes a reader without ``expect_seq`` takes as they come (PROTOCOL.md bounds none of them): its
# views of such a header must still lie in the slot's payload. (offset, value) flips, as the property draws them.
ACCEPTED_FLIPS = {
    "seq": [(16, 0x11)],
    "epoch": [(24, 9)],
    "one array fewer": [(11, 3)],
    "renamed array": [(FIXED_END, ord("A"))],
}
# ... and flips a reader must refuse (the magic, the layout version, an array's dtype code).
REJECTED_FLIPS = {"magic": [(0, 0)], "version": [(8, 2)], "dtype code": [(_entry(1, 16), 0)]}


def _read_corrupted(flips: list[tuple[int, int]]) -> bool:
    """Commit a batch, apply ``flips`` to its header and read it: False if refused (``SlotError``), True if
    accepted, after checking that every view of the accepted header lies in the slot's payload."""
    ring, buf, slot_bytes, _ = committed_ring()
    for offset, value in flips:
        buf[slot_bytes + offset] = value
    base = address(np.frombuffer(buf, np.uint8))
    try:
        contents = ring.read(1)
    except SlotError:
        return False
    for arr in contents.arrays.values():
        if arr.nbytes:
            assert base + slot_bytes + HEADER_BYTES <= address(arr)
            assert address(arr) + arr.nbytes <= base + 2 * slot_bytes
    return True


@pytest.mark.parametrize("flips", ACCEPTED_FLIPS.values(), ids=ACCEPTED_FLIPS)
def test_corruptions_of_unbounded_fields_are_read_within_the_slot(flips):
    assert _read_corrupted(flips)


@pytest.mark.parametrize("flips", REJECTED_FLIPS.values(), ids=REJECTED_FLIPS)
def test_corruptions_of_bounded_fields_are_refused(flips):
    assert not _read_corrupted(flips)


def test_random_header_corruption_never_escapes_the_slot():
    outcomes = {True: 0, False: 0}

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, FIXED_END + 4 * ENTRY_BYTES - 1), st.integers(0, 255)),
                    min_size=1, max_size=6))
    def corrupt(flips):
        outcomes[_read_corrupted(flips)] += 1

    corrupt()
    # both outcomes occur among the draws: a reader that refused every corruption would pass without the
    # bounds check above ever running, and one that refused none would be checking no header field
    assert outcomes[True] and outcomes[False], f"accepted {outcomes[True]}, refused {outcomes[False]}"


def test_read_only_ring():
    ring, buf, slot_bytes, expected = committed_ring()
    reader = SlotRing(bytes(buf), 3, slot_bytes)
    contents = reader.read(1, expect_seq=5)
    np.testing.assert_array_equal(contents.arrays["x"], expected["x"])
    assert not contents.arrays["x"].flags.writeable
    with pytest.raises(SlotError, match="read-only"):
        reader.arrays_for(1, place_arrays(batch_specs(), slot_bytes))
    with pytest.raises(SlotError, match="read-only"):
        reader.clear(1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"name": ""}, "name"), ({"name": "x" * 17}, "name"), ({"name": "é"}, "name"), ({"name": "a\0"}, "name"),
    ({"dtype": np.dtype("float64")}, "not supported"), ({"dtype": np.dtype(">i4")}, "not supported"),
    ({"shape": (-1,)}, "shape"), ({"shape": (1, 1, 1, 1, 1)}, "shape"), ({"shape": (True,)}, "shape"),
    ({"shape": (1.5,)}, "shape"), ({"align": 32}, "align"), ({"align": 100}, "align"), ({"align": 8192}, "align"),
])
def test_array_spec_validation(kwargs, match):
    args = {"name": "x", "dtype": np.dtype("int32"), "shape": (3,), **kwargs}
    with pytest.raises(ValueError, match=match):
        ArraySpec(**args)


def test_array_spec_normalizes():
    spec = ArraySpec("x", "<f4", [np.int64(3), 2])  # type: ignore[arg-type]
    assert spec.dtype == np.dtype("float32") and spec.shape == (3, 2) and type(spec.shape[0]) is int
    assert spec.nbytes == 24 and spec.align == ARRAY_ALIGNMENT


def test_plan_limits():
    with pytest.raises(ValueError, match="at most 32 arrays"):
        place_arrays([ArraySpec(f"a{i}", np.dtype("uint8"), (1,)) for i in range(MAX_ARRAYS + 1)], 65536)
    with pytest.raises(ValueError, match="unique"):
        place_arrays([ArraySpec("a", np.dtype("uint8"), (1,))] * 2, 65536)
    full = place_arrays([ArraySpec(f"a{i}", np.dtype("uint8"), (1,)) for i in range(MAX_ARRAYS)], 65536)
    assert len(full.arrays) == MAX_ARRAYS


@pytest.mark.parametrize(("count", "slot_bytes", "header_bytes", "buf_bytes", "match"), [
    (2, 8000, HEADER_BYTES, 16000, "multiple of 4096"),
    (2, 4096, HEADER_BYTES, 8192, "larger than header_bytes"),
    (2, 8192, MIN_HEADER_BYTES - 64, 16384, "at least"),
    (2, 8192, 4000, 16384, "multiple of 64"),
    (0, 8192, HEADER_BYTES, 16384, "count"),
    (3, 8192, HEADER_BYTES, 16384, "need 24576"),
])
def test_ring_geometry_is_checked(count, slot_bytes, header_bytes, buf_bytes, match):
    with pytest.raises(SlotError, match=match):
        SlotRing(bytearray(buf_bytes), count, slot_bytes, header_bytes)


def test_ring_from_layout_and_misuse():
    layout = SlotLayout(count=2, slot_bytes=16384, header_bytes=HEADER_BYTES, segment_bytes=32768)
    ring = SlotRing.from_layout(bytearray(32768), layout)
    assert (ring.count, ring.slot_bytes, ring.header_bytes) == (2, 16384, HEADER_BYTES)
    with pytest.raises(SlotError, match="outside the ring"):
        ring.read(2)
    with pytest.raises(SlotError, match="outside the ring"):
        ring.read(-1)
    with pytest.raises(SlotError, match="placement is for 8192-byte slots"):
        ring.arrays_for(0, place_arrays([ArraySpec("a", np.dtype("uint8"), (1,))], 8192))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"kind": "eval"}, "kind"), ({"seq": -1}, "seq"), ({"epoch": 2**32}, "epoch"), ({"num_batches": -2}, "num_batches"),
    ({"batch_index": True}, "batch_index"),
])
def test_slot_header_validation(kwargs, match):
    args = {"kind": "train", "seq": 0, "epoch": 0, "pass_index": 0, "batch_index": 0, "num_batches": -1, **kwargs}
    with pytest.raises(ValueError, match=match):
        BatchId(**args)
