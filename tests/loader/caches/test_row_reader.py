"""loader.caches.row_reader (+ row_reader_kernels): scattered row reads against numpy's own reading of the file."""

import errno
import itertools
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.caches import row_reader_kernels as kernels
from loader.caches.row_reader import RowReader, ShareResult
from loader.format.read_checks import CorruptData

PAGE = 4096


def write_rows(path: Path, num_rows: int, row_bytes: int, seed: int = 0, pad_to_page: bool = False) -> np.ndarray:
    """A file of random rows (optionally zero-padded to a page multiple); returns the rows as numpy reads them."""
    rng = np.random.default_rng(seed)
    rng.integers(0, 256, num_rows * row_bytes, dtype=np.uint8).tofile(path)
    if pad_to_page:
        with open(path, "ab") as f:
            f.write(b"\0" * (-(num_rows * row_bytes) % PAGE))
    return np.fromfile(path, dtype=np.uint8, count=num_rows * row_bytes).reshape(num_rows, row_bytes)


def touched_pages(offsets: np.ndarray, row_bytes: int) -> set[int]:
    pages: set[int] = set()
    for off in offsets.tolist():
        pages.update(range(off // PAGE, (off + row_bytes - 1) // PAGE + 1))
    return pages


def page_bytes(pages: set[int], file_size: int) -> int:
    """Bytes a read of each page returns: a whole page, less where the file ends inside it."""
    return sum(min(PAGE, file_size - p * PAGE) for p in pages)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("row_bytes", [4, 100, 1024, 4096, 5000])
def test_random_subset_in_random_order_is_bitwise_equal(tmp_path, row_bytes, direct):
    num_rows = 3000 if row_bytes < 1024 else 400
    ref = write_rows(tmp_path / "f.bin", num_rows, row_bytes, seed=row_bytes)
    rng = np.random.default_rng(1)
    idx = rng.permutation(num_rows)[:num_rows // 3]
    idx[0] = num_rows - 1  # the last row: its span runs past the (unaligned) end of the file
    with RowReader(tmp_path / "f.bin", row_bytes=row_bytes, direct=direct, threads=4, max_span=4 * PAGE) as reader:
        out = np.zeros((len(idx), row_bytes), dtype=np.uint8)
        stats = reader.read_rows(idx * row_bytes, out)
        assert np.array_equal(out, ref[idx])
        assert stats.rows == len(idx) and stats.reads >= 1 and stats.bytes >= len(idx) * row_bytes
        # the same request scattered to a permutation of destinations in a larger buffer
        dest = rng.permutation(2 * len(idx))[:len(idx)]
        big = np.full((2 * len(idx), row_bytes), 7, dtype=np.uint8)
        reader.read_rows(idx * row_bytes, big, rows=dest)
        assert np.array_equal(big[dest], ref[idx])
        untouched = np.setdiff1d(np.arange(len(big)), dest)
        assert (big[untouched] == 7).all()
        assert reader.rows_read == 2 * len(idx)


def test_rows_land_in_a_float_view(tmp_path):
    features = np.random.default_rng(0).standard_normal((500, 256)).astype(np.float32)
    features.tofile(tmp_path / "features.bin")
    idx = np.array([499, 3, 250, 4, 0])
    x = np.zeros((10, 256), dtype=np.float32)
    with RowReader(tmp_path / "features.bin", row_bytes=1024, direct=False) as reader:
        reader.read_rows(idx * 1024, x, rows=np.array([9, 0, 5, 1, 2], dtype=np.int32))
    assert np.array_equal(x[[9, 0, 5, 1, 2]], features[idx])
    assert not x[[3, 4, 6, 7, 8]].any()


def test_duplicated_offsets_are_served_from_one_read(tmp_path):
    ref = write_rows(tmp_path / "f.bin", 64, 1024, pad_to_page=True)
    idx = np.array([40, 3, 40, 40, 3])
    with RowReader(tmp_path / "f.bin", row_bytes=1024, direct=False) as reader:
        out = np.zeros((5, 1024), dtype=np.uint8)
        stats = reader.read_rows(idx * 1024, out)
    assert np.array_equal(out, ref[idx])
    assert stats.reads == 2 and stats.bytes == 2 * PAGE


def fd_flags(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))


def test_o_direct_reads_on_disk():
    # tmp_path may be a tmpfs; /var/tmp is on the disk here, where O_DIRECT really bypasses the cache
    where = tempfile.mkdtemp(dir="/var/tmp", prefix="megabatch-rowreader-")
    try:
        path = Path(where) / "features.bin"
        ref = write_rows(path, 2000, 1000, seed=5)  # 2 MB, not a page multiple
        idx = np.random.default_rng(2).permutation(2000)[:700]
        idx[0] = 1999
        with RowReader(path, row_bytes=1000, direct=True, threads=8) as reader:
            assert reader.direct_active
            assert fd_flags(reader._fd) & os.O_DIRECT
            out = np.zeros((700, 1000), dtype=np.uint8)
            stats = reader.read_rows(idx * 1000, out)
        assert np.array_equal(out, ref[idx])
        # every touched page once; the last page is short (the file ends inside it)
        assert stats.bytes == page_bytes(touched_pages(idx * 1000, 1000), 2_000_000)
    finally:
        shutil.rmtree(where)


def test_buffered_reads_disable_readahead(tmp_path):
    write_rows(tmp_path / "f.bin", 10, 100)
    with RowReader(tmp_path / "f.bin", row_bytes=100, direct=False) as reader:
        assert not reader.direct_active
        assert not fd_flags(reader._fd) & os.O_DIRECT


def test_o_direct_refused_at_open_falls_back(tmp_path, monkeypatch, caplog):
    ref = write_rows(tmp_path / "f.bin", 300, 100)
    real_open = os.open

    def refuse_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse_direct)
    with caplog.at_level(logging.WARNING, logger="megabatch.row_reader"), \
            RowReader(tmp_path / "f.bin", row_bytes=100, direct=True) as reader:
        assert not reader.direct_active and reader.direct_requested
        out = np.zeros((3, 100), dtype=np.uint8)
        reader.read_rows(np.array([299, 0, 150]) * 100, out)
    assert np.array_equal(out, ref[[299, 0, 150]])
    assert "O_DIRECT" in caplog.text


@pytest.mark.parametrize("threads", [1, 4])
def test_o_direct_refused_at_a_read_falls_back_and_retries(tmp_path, monkeypatch, caplog, threads):
    ref = write_rows(tmp_path / "f.bin", 3000, 100)
    real_kernel = kernels.read_groups
    calls = []

    def einval_once(fd, *args):
        calls.append(fd_flags(fd) & os.O_DIRECT)
        if len(calls) == 1:
            result = args[12]  # read_groups(fd, span_start, ..., g0, g1, result, block_sums, check_block)
            result[:] = (kernels.STATUS_OS_ERROR, errno.EINVAL, 1, 0, 0)
            return
        real_kernel(fd, *args)

    monkeypatch.setattr(kernels, "read_groups", einval_once)
    idx = np.random.default_rng(3).permutation(3000)[:900]
    with caplog.at_level(logging.WARNING, logger="megabatch.row_reader"), \
            RowReader(tmp_path / "f.bin", row_bytes=100, direct=True, threads=threads, max_span=PAGE) as reader:
        assert reader.direct_active
        out = np.zeros((900, 100), dtype=np.uint8)
        reader.read_rows(idx * 100, out)
        assert not reader.direct_active
        out2 = np.zeros((900, 100), dtype=np.uint8)
        reader.read_rows(idx * 100, out2)
    assert np.array_equal(out, ref[idx]) and np.array_equal(out2, ref[idx])
    assert calls[0] and not any(calls[threads:])  # the retry and later calls run on a buffered fd
    assert "EINVAL" in caplog.text


def test_contiguous_rows_merge_into_max_span_reads(tmp_path):
    write_rows(tmp_path / "f.bin", 1000, 1024)
    idx = np.random.default_rng(4).permutation(1000)  # order of the request does not matter
    with RowReader(tmp_path / "f.bin", row_bytes=1024, direct=False, max_span=256 << 10) as reader:
        stats = reader.read_rows(idx * 1024, np.zeros((1000, 1024), dtype=np.uint8))
    assert stats.reads <= 4 + 1
    assert stats.bytes % PAGE == 0 and stats.bytes >= 1000 * 1024
    assert (reader.reads, reader.bytes_read, reader.rows_read) == (stats.reads, stats.bytes, 1000)


def test_merge_gap_trades_bytes_for_fewer_reads(tmp_path):
    ref = write_rows(tmp_path / "f.bin", 3000, 1024, pad_to_page=True)
    idx = np.arange(0, 3000, 12)  # one row every third page: nothing touches without a gap
    out = np.zeros((len(idx), 1024), dtype=np.uint8)
    with RowReader(tmp_path / "f.bin", row_bytes=1024, direct=False, merge_gap=0) as reader:
        tight = reader.read_rows(idx * 1024, out)
    assert tight.reads == len(idx) and tight.bytes == len(idx) * PAGE
    with RowReader(tmp_path / "f.bin", row_bytes=1024, direct=False, merge_gap=2 * PAGE) as reader:
        out[:] = 0
        gapped = reader.read_rows(idx * 1024, out)
    assert np.array_equal(out, ref[idx])
    assert gapped.reads <= tight.reads // 10
    assert gapped.bytes > tight.bytes


def test_threads_give_identical_output(tmp_path):
    ref = write_rows(tmp_path / "f.bin", 20000, 100, pad_to_page=True)
    idx = np.random.default_rng(6).choice(20000, 5000, replace=False)
    outs, stats = [], []
    for threads in (1, 8):
        with RowReader(tmp_path / "f.bin", row_bytes=100, direct=False, threads=threads, max_span=2 * PAGE) as reader:
            outs.append(np.zeros((5000, 100), dtype=np.uint8))
            stats.append(reader.read_rows(idx * 100, outs[-1]))
    assert np.array_equal(outs[0], ref[idx]) and np.array_equal(outs[1], outs[0])
    assert (stats[0].reads, stats[0].bytes) == (stats[1].reads, stats[1].bytes)


@pytest.fixture(scope="module")
def row_files(tmp_path_factory):
    """Per row size, a page-padded file of 300 random rows and its rows."""
    where = tmp_path_factory.mktemp("rows")
    return {rb: (where / f"{rb}.bin", write_rows(where / f"{rb}.bin", 300, rb, seed=rb, pad_to_page=True))
            for rb in (4, 100, 1024, 4096, 5000, 9000)}


@settings(max_examples=60, deadline=None)
@given(row_bytes=st.sampled_from([4, 100, 1024, 4096, 5000, 9000]), data=st.data(),
       max_pages=st.sampled_from([1, 2, 3, 64]), threads=st.sampled_from([1, 3]))
def test_any_rows_equal_the_reference_and_each_page_is_read_once(row_files, row_bytes, data, max_pages, threads):
    path, ref = row_files[row_bytes]
    idx = np.array(data.draw(st.lists(st.integers(0, 299), unique=True, max_size=120)), dtype=np.int64)
    with RowReader(path, row_bytes=row_bytes, direct=False, threads=threads, max_span=max_pages * PAGE) as reader:
        out = np.zeros((len(idx), row_bytes), dtype=np.uint8)
        stats = reader.read_rows(idx * row_bytes, out)
    assert np.array_equal(out, ref[idx])
    assert stats.bytes == len(touched_pages(idx * row_bytes, row_bytes)) * PAGE


@settings(max_examples=300, deadline=None)
@given(offsets=st.lists(st.integers(0, 60_000), max_size=40), row_bytes=st.integers(1, 20_000),
       max_pages=st.integers(1, 6), merge_gap=st.sampled_from([0, 1, 4096, 10_000]))
def test_plan_spans_is_aligned_disjoint_bounded_and_covers_every_row(offsets, row_bytes, max_pages, merge_gap):
    off = np.sort(np.array(offsets, dtype=np.int64))
    max_span = max_pages * PAGE
    starts, lengths = kernels.plan_spans(off, row_bytes, PAGE, merge_gap, max_span)
    if len(off) == 0:
        assert len(starts) == 0
        return
    assert (starts % PAGE == 0).all() and (lengths % PAGE == 0).all()
    assert (lengths > 0).all() and (lengths <= max_span).all()
    assert (starts[1:] >= starts[:-1] + lengths[:-1]).all()  # ascending, no page read twice
    covered = set()
    for s, n in zip(starts.tolist(), lengths.tolist()):
        covered.update(range(s // PAGE, (s + n) // PAGE))
    needed = set()
    for o in off.tolist():
        needed.update(range(o // PAGE, (o + row_bytes - 1) // PAGE + 1))
    assert needed <= covered
    if merge_gap == 0:
        assert covered == needed
    # every span holds bytes of some row (nothing read for nothing but a merged gap)
    for s, n in zip(starts.tolist(), lengths.tolist()):
        assert ((off < s + n) & (off + row_bytes > s)).any()


def test_bad_requests_raise_value_error_and_write_nothing(tmp_path):
    write_rows(tmp_path / "f.bin", 10, 100)  # 1000 bytes
    reader = RowReader(tmp_path / "f.bin", row_bytes=100, direct=False)
    good = np.array([0, 900])
    cases = [
        ("offsets", np.array([0, 901]), np.full((2, 100), 9, np.uint8), None),
        ("offsets", np.array([-1, 0]), np.full((2, 100), 9, np.uint8), None),
        ("offsets", np.array([0.0, 100.0]), np.full((2, 100), 9, np.uint8), None),
        ("out", good, np.full(200, 9, np.uint8), None),
        ("out", good, np.full((2, 100), 9, np.float64), None),
        ("out", good, np.full((2, 200), 9, np.uint8)[:, ::2], None),
        ("out", good, np.asfortranarray(np.full((2, 100), 9, np.uint8)), None),
        ("out", good, np.full((1, 100), 9, np.uint8), None),
        ("rows", good, np.full((4, 100), 9, np.uint8), np.array([0, 4])),
        ("rows", good, np.full((4, 100), 9, np.uint8), np.array([1, 1])),
        ("rows", good, np.full((4, 100), 9, np.uint8), np.array([1, 2, 3])),
    ]
    for field, offsets, out, rows in cases:
        with pytest.raises(ValueError, match=field):
            reader.read_rows(offsets, out, rows)
        assert (out == 9).all()
    frozen = np.full((2, 100), 9, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        reader.read_rows(good, frozen)
    assert reader.reads == 0 and reader.rows_read == 0
    empty = reader.read_rows(np.array([], dtype=np.int64), np.zeros((0, 100), np.uint8))
    assert (empty.rows, empty.reads, empty.bytes) == (0, 0, 0)
    reader.close()
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.read_rows(good, np.zeros((2, 100), np.uint8))


@pytest.mark.parametrize("field, kwargs", [
    ("row_bytes", {"row_bytes": 0}),
    ("threads", {"threads": 0}),
    ("max_span", {"max_span": 5000}),
    ("max_span", {"max_span": 0}),
    ("merge_gap", {"merge_gap": -1}),
])
def test_bad_arguments_raise_value_error(tmp_path, field, kwargs):
    write_rows(tmp_path / "f.bin", 10, 100)
    args = {"row_bytes": 100, "direct": False} | kwargs
    with pytest.raises(ValueError, match=field):
        RowReader(tmp_path / "f.bin", **args)


def test_missing_file_raises_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        RowReader(tmp_path / "absent.bin", row_bytes=100, direct=True)


def test_file_shrinking_under_the_reader_raises_os_error(tmp_path, monkeypatch):
    write_rows(tmp_path / "f.bin", 100, 100)  # 10000 bytes
    real_fstat = os.fstat

    class Larger:
        def __init__(self, st):
            self.st_size = st.st_size + 100_000

    monkeypatch.setattr(os, "fstat", lambda fd: Larger(real_fstat(fd)))
    with RowReader(tmp_path / "f.bin", row_bytes=100, direct=False) as reader, \
            pytest.raises(OSError, match="ends at byte") as info:
        reader.read_rows(np.array([50_000]), np.zeros((1, 100), np.uint8))
    assert info.value.filename == os.fspath(tmp_path / "f.bin")


def test_read_error_raises_os_error_with_errno_and_path(tmp_path):
    write_rows(tmp_path / "f.bin", 100, 4)
    with RowReader(tmp_path / "f.bin", row_bytes=4, direct=False) as reader:
        # swap in a directory's fd: fstat passes, pread fails with EISDIR
        os.close(reader._fd)
        reader._fd = os.open(tmp_path, os.O_RDONLY)
        with pytest.raises(OSError) as info:
            reader.read_rows(np.array([0]), np.zeros((1, 4), np.uint8))
    assert info.value.errno == errno.EISDIR
    assert info.value.filename == os.fspath(tmp_path / "f.bin")


def test_a_share_result_reads_the_kernels_row_by_name():
    row = np.array([kernels.STATUS_OS_ERROR, errno.EIO, 3, 8192, 12345], dtype=np.int64)  # RESULT_FIELDS' order
    assert ShareResult.from_kernel(row) == ShareResult(status=kernels.STATUS_OS_ERROR, errno=errno.EIO, reads=3,
                                                       bytes=8192, offset=12345)


@pytest.mark.parametrize("status", [kernels.STATUS_OS_ERROR, kernels.STATUS_EOF, kernels.STATUS_CORRUPT])
@pytest.mark.parametrize("threads", [1, 4])
def test_a_failed_share_is_reported_from_its_own_fields(tmp_path, monkeypatch, status, threads):
    """Every share reports a different count; the failure is the first failed share's, the counters their sums."""
    write_rows(tmp_path / "f.bin", 3000, 100)
    calls = itertools.count(1)  # next() is atomic: the shares run on the pool's threads
    reported = []

    def report(fd, *args):
        result = args[12]  # read_groups(fd, span_start, ..., g0, g1, result, block_sums, check_block)
        k = next(calls)
        reported.append(k)
        if k == 2 or threads == 1:  # one share fails
            err = errno.EIO if status == kernels.STATUS_OS_ERROR else 0
            result[:] = (status, err, k, 4096 * k, 1000 * k)  # the kernel's order (RESULT_FIELDS)
        else:
            result[:] = (kernels.STATUS_OK, 0, k, 4096 * k, -1)

    monkeypatch.setattr(kernels, "read_groups", report)
    idx = np.arange(0, 3000, 50)  # rows 5000 bytes apart: a span each, so a share per thread
    with RowReader(tmp_path / "f.bin", row_bytes=100, direct=False, threads=threads, max_span=PAGE) as reader:
        with pytest.raises(OSError if status != kernels.STATUS_CORRUPT else CorruptData) as info:
            reader.read_rows(idx * 100, np.zeros((len(idx), 100), np.uint8))
        assert sorted(reported) == list(range(1, threads + 1))
        assert (reader.reads, reader.bytes_read, reader.rows_read) == (sum(reported), 4096 * sum(reported), 0)
    at = 1000 * (1 if threads == 1 else 2)
    if status == kernels.STATUS_CORRUPT:
        assert info.value.offset == at
    elif status == kernels.STATUS_EOF:
        assert info.value.errno == errno.EIO and f"file ends at byte {at}," in str(info.value)
    else:
        assert info.value.errno == errno.EIO and f"pread at byte {at})" in str(info.value)
