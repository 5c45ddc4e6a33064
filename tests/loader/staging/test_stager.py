"""Staged windows: the layout against a plain per-batch reference, and staged batches bitwise equal to the
dataset's rows of the sampled nodes, from RAM and from disk, checked on both reads."""

import os
import shutil
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.dataset import Dataset, open_dataset
from loader.format.partition_table import row_offsets_for
from loader.format.read_checks import CorruptData, load_read_checks
from loader.sampling.inmemory import epoch_batches_inmemory
from loader.sampling.sampling import CSCGraph, SampledPass, sample_pass, slice_pass
from loader.staging import stager as stager_module
from loader.staging.sequential_reader import PassStopped
from loader.staging.stager import DEFAULT_CHUNK_BYTES, WindowStager
from loader.staging.staging_kernels import copy_rows_from, keep_chunks, keep_distinct, scatter_pieces
from loader.staging.window_plan import PLAN_SLICE_ROWS, STAGING_ALIGN, batch_gather, plan_window, plan_window_bytes
from tests.graphs import generated_dataset

# 25 float32 features: 100-byte rows, which straddle pages and chunks
FEAT_DIM = 25


@pytest.fixture(scope="module")
def straddling_dataset(tmp_path_factory) -> Dataset:
    """Rows of 100 bytes (``FEAT_DIM`` float32 features), which straddle pages and chunks, in 5 partitions."""
    return open_dataset(generated_dataset(tmp_path_factory.mktemp("staging"), nodes=2500, feat_dim=FEAT_DIM,
                                          partitions=5))


def window(dataset: Dataset, batches: int, batch_size: int = 32, fanouts: tuple[int, ...] = (4, 3)) -> SampledPass:
    """The first ``batches`` batches of epoch 0, as the exact mode samples them."""
    m = dataset.manifest
    graph = CSCGraph(dataset.read("indptr", np.int64, 1), np.load(dataset.file("indices")),
                     np.arange(m.num_nodes, dtype=np.int64))
    plan = epoch_batches_inmemory(np.load(dataset.file("train")), batch_size, 0, 0)
    return sample_pass(graph, plan.seeds[:batches * batch_size], batch_size, list(fanouts), plan.keys[:batches])


def window_plan(sampled: SampledPass, parts, row_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
    """``plan_window`` of every node of ``sampled``, every chunk staged."""
    return plan_window(sampled.node_ptr, row_offsets_for(sampled.nodes, parts.node_begin, parts.feat_offset, row_bytes),
                       row_bytes, chunk_bytes)


def gather_of(dataset: Dataset, nodes: np.ndarray) -> np.ndarray:
    parts = dataset.partitions()
    return batch_gather(row_offsets_for(nodes, parts.node_begin, parts.feat_offset, dataset.manifest.row_bytes))


def expected_rows(dataset: Dataset, nodes: np.ndarray) -> np.ndarray:
    m = dataset.manifest
    parts = dataset.partitions()
    data = np.fromfile(dataset.file("features"), dtype=np.uint8)
    offsets = row_offsets_for(nodes, parts.node_begin, parts.feat_offset, m.row_bytes)
    return data[offsets[:, None] + np.arange(m.row_bytes)]


def assert_reads_back(stager: WindowStager, staged, sampled: SampledPass, dataset: Dataset, order=None) -> None:
    """Every batch of ``staged`` (in ``order``, default ascending) read back equals the dataset's rows of its nodes."""
    out = np.full((int(np.diff(sampled.node_ptr).max()), dataset.manifest.feat_dim), np.nan, dtype=np.float32)
    for b in order if order is not None else range(sampled.num_batches):
        nodes = sampled.nodes[sampled.node_ptr[b]:sampled.node_ptr[b + 1]]
        stager.read_batch(staged, b, gather_of(dataset, nodes), out)
        assert np.array_equal(out[:len(nodes)].view(np.uint8), expected_rows(dataset, nodes))


def stager_for(dataset: Dataset, staging_dir: Path | None, checked: bool = True, **kwargs) -> WindowStager:
    m = dataset.manifest
    checks = load_read_checks(dataset, blocks=True) if checked else None
    return WindowStager(dataset.file("features"), row_bytes=m.row_bytes, staging_dir=staging_dir,
                        block_sums=None if checks is None else checks.feature_blocks,
                        check_block=m.feature_check_bytes, **kwargs)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_plan_matches_a_per_batch_reference(data):
    row_bytes = data.draw(st.integers(1, 300))
    chunk_bytes = 4096 * data.draw(st.integers(1, 3))
    sizes = data.draw(st.lists(st.integers(0, 12), min_size=1, max_size=6))
    rows = data.draw(st.integers(1, 120))
    # a negative offset is a row held elsewhere (the cache): never staged
    offsets = np.asarray([data.draw(st.integers(-1, rows - 1)) for _ in range(sum(sizes))], np.int64)
    offsets = np.where(offsets < 0, -1, offsets * row_bytes)
    node_ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    plan = plan_window(node_ptr, offsets, row_bytes, chunk_bytes)
    assert np.all(plan.keys[1:] > plan.keys[:-1])  # ascending, distinct
    end = 0
    for b in range(len(sizes)):
        mine = offsets[node_ptr[b]:node_ptr[b + 1]]
        mine = mine[mine >= 0]
        staged = plan.staged_offsets(b)
        assert staged.tolist() == sorted(set(mine.tolist()))  # distinct, in file order
        assert np.array_equal(staged[batch_gather(mine)], mine)
        base, nbytes = plan.region(b)
        assert base % STAGING_ALIGN == 0 and base >= end and nbytes == len(staged) * row_bytes
        end = base + nbytes
    assert plan.staging_bytes >= end and plan.staging_bytes % STAGING_ALIGN == 0
    touched = {int(o) // chunk_bytes for o in offsets.tolist() if o >= 0}
    assert set(np.flatnonzero(plan.chunk_staged).tolist()) == touched
    starts, lo, hi = plan.chunk_runs()  # the pass: every key once, chunk by chunk
    assert starts.tolist() == [c * chunk_bytes for c in sorted(touched)] and int((hi - lo).sum()) == len(plan.keys)
    for c0, k0, k1 in zip(starts.tolist(), lo.tolist(), hi.tolist()):
        batch, at = plan.fields(k0, k1)
        assert np.all((at >= 0) & (at < chunk_bytes)) and np.all(np.diff(batch) >= 0)
        assert all(c0 + a in set(plan.staged_offsets(int(b)).tolist()) for b, a in zip(batch.tolist(), at.tolist()))


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_chunk_cost_model_matches_a_per_chunk_reference(data):
    row_bytes = data.draw(st.sampled_from([100, 1024, 4096, 6000]))
    chunk_bytes = 4096 * data.draw(st.integers(1, 4))
    sizes = data.draw(st.lists(st.integers(0, 15), min_size=1, max_size=5))
    rows = data.draw(st.integers(1, 200))
    offsets = np.asarray([data.draw(st.integers(0, rows - 1)) * row_bytes for _ in range(sum(sizes))], np.int64)
    node_ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    seq, iops = data.draw(st.sampled_from([1e6, 1e8, 1e9])), data.draw(st.sampled_from([1e2, 3e4, 1e6]))
    plan = plan_window(node_ptr, offsets, row_bytes, chunk_bytes, sequential_rate=seq, random_reads=iops)
    pages_per_row = max(1, -(-row_bytes // 4096))
    for chunk in {int(o) // chunk_bytes for o in offsets.tolist()}:
        mine = {(b, o) for b in range(len(sizes)) for o in offsets[node_ptr[b]:node_ptr[b + 1]].tolist()
                if o // chunk_bytes == chunk}
        staged = (chunk_bytes + 2 * len(mine) * row_bytes) / seq
        direct = len({(b, o // 4096) for b, o in mine}) * pages_per_row / iops
        assert plan.chunk_staged[chunk] == (staged <= direct)
        assert plan.is_staged(np.array([chunk * chunk_bytes]))[0] == (staged <= direct)
    for b in range(len(sizes)):  # a batch stages exactly its rows in chunks worth the pass
        mine = offsets[node_ptr[b]:node_ptr[b + 1]]
        assert plan.staged_offsets(b).tolist() == sorted(set(mine[plan.is_staged(mine)].tolist()))


@pytest.mark.parametrize("cached", [0.0, 0.5])
@pytest.mark.parametrize("rows", [5000, 3_000_000])
def test_planning_holds_at_most_what_the_budget_charges(rows, cached):
    """The memory plan charges ``plan_window_bytes`` for planning one superbatch whose offsets the planner asks
    for a slice at a time (as the staged mode gives them); measured. Offsets given whole add their 8 B a row."""
    batches = 200
    node_ptr = np.linspace(0, rows, batches + 1).astype(np.int64)

    def offsets_of(begin: int, end: int) -> np.ndarray:
        rng = np.random.default_rng(begin)
        offsets = rng.integers(0, rows // 2, end - begin) * 1024  # dense enough that chunks are staged
        offsets[rng.random(end - begin) < cached] = -1
        return offsets

    # the kernels' first call loads them (numba), which is not the plan's memory: run alone, this test had counted it
    plan_window(np.array([0, 1]), np.zeros(1, np.int64), 1024, 4 << 20, sequential_rate=690e6, random_reads=30e3)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        lazy = plan_window(node_ptr, offsets_of, 1024, 4 << 20, sequential_rate=690e6, random_reads=30e3)
        lazy_peak = tracemalloc.get_traced_memory()[1] - before
        before = tracemalloc.get_traced_memory()[0]
        offsets = offsets_of(0, rows)
        tracemalloc.reset_peak()
        plan = plan_window(node_ptr, offsets, 1024, 4 << 20, sequential_rate=690e6, random_reads=30e3)
        whole_peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert plan.staged_rows > 0
    assert lazy_peak <= plan_window_bytes(rows) and whole_peak <= plan_window_bytes(rows) + 8 * rows
    # told how many offsets are staged (the staged mode counts the cache's misses first), it holds a key for
    # each of those only: what a window's charge covers
    staged = sum(int(np.count_nonzero(offsets_of(b, min(rows, b + PLAN_SLICE_ROWS)) >= 0))
                 for b in range(0, rows, PLAN_SLICE_ROWS))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        counted = plan_window(node_ptr, offsets_of, 1024, 4 << 20, sequential_rate=690e6, random_reads=30e3,
                              max_rows=staged)
        counted_peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert np.array_equal(counted.keys, lazy.keys) and np.array_equal(counted.staged_counts, lazy.staged_counts)
    assert counted_peak <= plan_window_bytes(staged)
    with pytest.raises(ValueError, match="max_rows"):
        plan_window(node_ptr, offsets_of, 1024, 4 << 20, max_rows=staged - 1)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_copy_rows_from_matches_numpy(data):
    row_bytes = data.draw(st.integers(1, 64))
    src = np.frombuffer(data.draw(st.binary(min_size=row_bytes, max_size=600)), dtype=np.uint8)
    offsets = np.asarray(data.draw(st.lists(st.integers(0, len(src) - row_bytes), max_size=20)), dtype=np.int64)
    out = np.zeros(len(offsets) * row_bytes, dtype=np.uint8)
    copy_rows_from(src, offsets, out, row_bytes)
    expected = src[offsets[:, None] + np.arange(row_bytes)].reshape(-1) if len(offsets) else out
    assert np.array_equal(out, expected)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_in_place_key_kernels_match_python(data):
    shift = data.draw(st.integers(0, 59))
    chunks = data.draw(st.lists(st.integers(0, 15), max_size=40))
    lows = [data.draw(st.integers(0, 2**shift - 1)) for _ in chunks]
    keys = np.sort(np.asarray([(c << shift) | low for c, low in zip(chunks, lows)] * 2, dtype=np.uint64))
    distinct = keys.copy()
    assert distinct[:keep_distinct(distinct)].tolist() == sorted(set(keys.tolist()))
    staged = np.asarray(data.draw(st.lists(st.booleans(), min_size=16, max_size=16)), dtype=bool)
    kept = keys.copy()
    assert kept[:keep_chunks(kept, np.uint64(shift), staged)].tolist() == \
        [k for k in keys.tolist() if staged[k >> shift]]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_scatter_pieces_matches_python(data):
    """Each piece: the batch's held partial page, then its rows; whole pages out, the rest held, zero-padded."""
    row, page = data.draw(st.integers(1, 12)), data.draw(st.sampled_from([8, 16, 32]))
    chunk = np.frombuffer(data.draw(st.binary(min_size=row, max_size=200)), dtype=np.uint8)
    batches = 5
    owners = data.draw(st.lists(st.integers(0, batches - 1), unique=True, max_size=batches))
    sizes = [data.draw(st.integers(0, 6)) for _ in owners]
    source = np.asarray([data.draw(st.integers(0, len(chunk) - row)) for _ in range(sum(sizes))], dtype=np.int64)
    first = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64) if owners else np.zeros(0, np.int64)
    end = first + np.asarray(sizes, dtype=np.int64)
    tail_len = np.asarray([data.draw(st.integers(0, page - 1)) for _ in range(batches)], dtype=np.int64)
    tails = np.zeros((batches, page), dtype=np.uint8)
    for b in range(batches):
        tails[b, :tail_len[b]] = np.frombuffer(data.draw(st.binary(min_size=int(tail_len[b]),
                                                                   max_size=int(tail_len[b]))), dtype=np.uint8)
    expected = {}
    span, at = [], []
    for k, b in enumerate(owners):
        content = bytes(tails[b, :tail_len[b]]) + b"".join(bytes(chunk[o:o + row])
                                                            for o in source[first[k]:end[k]].tolist())
        expected[b] = content
        at.append(sum(span))
        span.append(-(-len(content) // page) * page)
    scatter = np.zeros(max(1, sum(span)), dtype=np.uint8)
    whole = np.zeros(len(owners), dtype=np.int64)
    new_tails, new_len = tails.copy(), tail_len.copy()
    scatter_pieces(chunk, source, first, end, np.asarray(owners, dtype=np.int64), np.asarray(at, dtype=np.int64),
                   row, page, new_tails, new_len, scatter, whole)
    for k, b in enumerate(owners):
        content = expected[b]
        w = len(content) // page * page
        assert int(whole[k]) == w and bytes(scatter[at[k]:at[k] + len(content)]) == content
        assert int(new_len[b]) == len(content) - w
        assert bytes(new_tails[b]) == content[w:] + bytes(page - (len(content) - w))
    for b in set(range(batches)) - set(owners):  # batches without a piece keep what they held
        assert int(new_len[b]) == int(tail_len[b]) and np.array_equal(new_tails[b], tails[b])


@pytest.mark.parametrize("where", ["ram", "disk", "disk-buffered"])
@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
def test_staged_batches_equal_the_dataset_rows(straddling_dataset, tmp_path, where, chunk_bytes):
    """In RAM (a memfd), on disk with O_DIRECT writes (whole pages, each batch's partial page held between runs),
    and on disk through the page cache (flushed and dropped as it goes)."""
    sampled = window(straddling_dataset, 12)
    m = straddling_dataset.manifest
    parts = straddling_dataset.partitions()
    plan = window_plan(sampled, parts, m.row_bytes, chunk_bytes)
    # a small scatter buffer: several write groups per chunk; on disk, several flushes per window
    with stager_for(straddling_dataset, None if where == "ram" else tmp_path, chunk_bytes=chunk_bytes,
                    scatter_bytes=8192, flush_bytes=16384, direct=where != "disk-buffered") as stager:
        staged = stager.stage(plan)
        try:
            assert staged.direct_writes == (where == "disk")
            assert staged.stats.staged_bytes == plan.staged_rows * m.row_bytes
            assert staged.stats.file_bytes_read >= staged.stats.chunks * 4096
            assert len(staged.plan.keys) == 0  # the pass's keys are dropped once it is done
            # in any order
            assert_reads_back(stager, staged, sampled, straddling_dataset, reversed(range(plan.num_batches)))
        finally:
            staged.close()
    assert not list(tmp_path.iterdir())  # the staging file has no name to leave behind


@pytest.fixture(scope="module")
def word_dataset(tmp_path_factory) -> Dataset:
    """Rows of 1 KiB, a whole number of words dividing a page: the stager's word path, partial pages of 1-3 rows."""
    return open_dataset(generated_dataset(tmp_path_factory.mktemp("staging-words"), nodes=3000, feat_dim=256,
                                          partitions=4))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
@pytest.mark.parametrize("chunk_bytes", [8192, 1 << 20])
def test_word_rows_staged_on_disk_equal_the_dataset_rows(word_dataset, tmp_path, direct, chunk_bytes):
    sampled = window(word_dataset, 10)
    m = word_dataset.manifest
    plan = window_plan(sampled, word_dataset.partitions(), m.row_bytes, chunk_bytes)
    with stager_for(word_dataset, tmp_path, chunk_bytes=chunk_bytes, scatter_bytes=8192, flush_bytes=16384,
                    direct=direct) as stager:
        staged = stager.stage(plan)
        try:
            assert staged.direct_writes == direct
            assert_reads_back(stager, staged, sampled, word_dataset)
        finally:
            staged.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_later_windows_rewrite_a_kept_staging_file(straddling_dataset, tmp_path, direct):
    """A window's staging file goes back to the stager when the window closes and the next window rewrites it
    (grown when it needs more): what the earlier window left there never reaches a batch."""
    m = straddling_dataset.manifest
    parts = straddling_dataset.partitions()
    full = window(straddling_dataset, 40)
    windows = [slice_pass(full, 0, 24), slice_pass(full, 24, 6), slice_pass(full, 0, 40)]  # large, small, larger
    with stager_for(straddling_dataset, tmp_path, chunk_bytes=8192, scatter_bytes=8192, flush_bytes=16384,
                    direct=direct) as stager:
        files = []
        for sampled in windows:
            plan = window_plan(sampled, parts, m.row_bytes, 8192)
            staged = stager.stage(plan)
            try:
                files.append((staged.file, staged.file.size))
                assert_reads_back(stager, staged, sampled, straddling_dataset)
            finally:
                staged.close()
        assert files[1][0] is files[0][0] and files[2][0] is files[0][0]  # one file, rewritten
        assert files[1][1] == files[0][1] < files[2][1]  # kept its size, then grown
    assert files[0][0].fd == -1  # closed with the stager
    assert not list(tmp_path.iterdir())


def test_a_corrupt_feature_block_fails_staging(straddling_dataset, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(straddling_dataset.path, copy)
    corrupt = open_dataset(copy)
    sampled = window(corrupt, 40)
    parts = corrupt.partitions()
    plan = window_plan(sampled, parts, corrupt.manifest.row_bytes)
    victim = int(plan.staged_offsets(3)[5])
    with open(corrupt.file("features"), "r+b") as f:
        f.seek(victim)
        byte = f.read(1)
        f.seek(victim)
        f.write(bytes([byte[0] ^ 0x40]))
    block = corrupt.manifest.feature_check_bytes
    with stager_for(corrupt, None) as stager, pytest.raises(CorruptData, match="features.bin") as failed:
        stager.stage(plan)
    assert failed.value.offset == victim // block * block
    with stager_for(corrupt, None, checked=False) as stager:  # unchecked: served (what the checks prevent)
        stager.stage(plan).close()


@pytest.mark.parametrize("where", ["ram", "disk", "disk-buffered"])
def test_a_stopped_window_ends_within_a_chunk_and_gives_its_file_back(straddling_dataset, tmp_path, monkeypatch, where):
    """The stop is set while the window's third chunk is read (on the read-ahead thread): staging ends before it
    uses another chunk, its writes landed and its staging file given back, none in use; the next window rewrites
    that file and every batch reads back whole."""
    sampled = window(straddling_dataset, 40)
    m = straddling_dataset.manifest
    plan = window_plan(sampled, straddling_dataset.partitions(), m.row_bytes, 4096)
    total = len(plan.chunk_runs()[0])
    stop = threading.Event()
    reads: list[int] = []
    with stager_for(straddling_dataset, None if where == "ram" else tmp_path, chunk_bytes=4096, scatter_bytes=8192,
                    flush_bytes=16384, direct=where != "disk-buffered") as stager:
        read_chunk = stager.reader._read_chunk

        def counted(buffer, at, need):
            reads.append(at)
            if len(reads) == 3:
                stop.set()
            return read_chunk(buffer, at, need)

        monkeypatch.setattr(stager.reader, "_read_chunk", counted)
        taken = []
        take = stager._files.take
        monkeypatch.setattr(stager._files, "take", lambda size: taken.append(take(size)) or taken[-1])
        with pytest.raises(PassStopped):
            stager.stage(plan, stop)
        assert len(reads) == 3 and total > 20
        files = stager._files
        assert files.kept == (0 if where == "ram" else 1) and len(files._open) == files.kept  # given back
        reads.clear()
        staged = stager.stage(plan, threading.Event())
        try:
            assert len(reads) == total and staged.stats.chunks == total
            if where != "ram":
                assert staged.file is taken[0]  # the stopped window's file, rewritten
            assert_reads_back(stager, staged, sampled, straddling_dataset)
        finally:
            staged.close()


def test_closing_the_stager_stops_a_window_being_staged(straddling_dataset, tmp_path, monkeypatch):
    """``close`` from another thread while a window is staged (the mode closing): the pass ends at its next chunk,
    then every staging file is closed."""
    sampled = window(straddling_dataset, 40)
    plan = window_plan(sampled, straddling_dataset.partitions(), straddling_dataset.manifest.row_bytes, 4096)
    stager = stager_for(straddling_dataset, tmp_path, chunk_bytes=4096, scatter_bytes=8192, flush_bytes=16384)
    closer = threading.Thread(target=stager.close)
    reads: list[int] = []
    read_chunk = stager.reader._read_chunk

    def counted(buffer, at, need):
        reads.append(at)
        if len(reads) == 3:
            closer.start()
            assert stager.reader._closing.wait(30)  # close has begun: it waits for the window
        return read_chunk(buffer, at, need)

    monkeypatch.setattr(stager.reader, "_read_chunk", counted)
    with pytest.raises(PassStopped):
        stager.stage(plan)
    closer.join(30)
    assert not closer.is_alive() and stager.reader.closed and len(reads) == 3
    assert not stager._files._open  # the stopped window's file went back, then closed with the stager
    with pytest.raises(ValueError, match="closed"):
        stager.stage(plan)


def test_a_corrupt_staging_region_fails_its_batch(straddling_dataset, tmp_path):
    sampled = window(straddling_dataset, 6)
    m = straddling_dataset.manifest
    parts = straddling_dataset.partitions()
    plan = window_plan(sampled, parts, m.row_bytes)
    with stager_for(straddling_dataset, tmp_path) as stager:
        staged = stager.stage(plan)
        try:
            base, nbytes = plan.region(3)
            assert staged.direct_writes  # its fd takes whole pages only: flip the byte through a buffered one
            fd = os.open(f"/proc/self/fd/{staged.fd}", os.O_WRONLY)
            try:
                os.pwrite(fd, b"\xff", base + nbytes // 2)
            finally:
                os.close(fd)
            out = np.empty((int(np.diff(sampled.node_ptr).max()), FEAT_DIM), dtype=np.float32)
            nodes = [sampled.nodes[sampled.node_ptr[b]:sampled.node_ptr[b + 1]] for b in (2, 3)]
            with pytest.raises(CorruptData, match="batch 3"):
                stager.read_batch(staged, 3, gather_of(straddling_dataset, nodes[1]), out)
            stager.read_batch(staged, 2, gather_of(straddling_dataset, nodes[0]), out)  # the others are still served
        finally:
            staged.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_regions_read_back_in_pieces(straddling_dataset, word_dataset, tmp_path, monkeypatch, direct):
    """Regions larger than ``READ_BACK_BYTES`` come back in pieces (100-byte rows straddling pages, 1 KiB rows),
    the next piece read ahead across batches and past empty regions, in order and out of it, into two buffers
    of a piece each; a flipped byte in a region's last piece still fails its batch."""
    for ds in (straddling_dataset, word_dataset):
        m = ds.manifest
        monkeypatch.setattr(stager_module, "READ_BACK_BYTES", 7 * m.row_bytes)
        sampled = window(ds, 8)
        parts = ds.partitions()
        offsets = row_offsets_for(sampled.nodes, parts.node_begin, parts.feat_offset, m.row_bytes)
        empty = [2, 3, 7]  # batches whose rows are all cached: empty regions, the last batch's among them
        for b in empty:
            offsets[sampled.node_ptr[b]:sampled.node_ptr[b + 1]] = -1
        plan = plan_window(sampled.node_ptr, offsets, m.row_bytes, DEFAULT_CHUNK_BYTES)
        assert (plan.staged_counts[empty] == 0).all() and plan.staged_counts.max() > 3 * 7
        out = np.full((int(np.diff(sampled.node_ptr).max()), m.feat_dim), np.nan, dtype=np.float32)
        with stager_for(ds, tmp_path, scatter_bytes=8192, flush_bytes=16384, direct=direct) as stager:
            staged = stager.stage(plan)
            loads: list[tuple[int, int]] = []

            def counted(staged_window, b, k, load=stager._load, loads=loads):  # each piece read once, in order
                loads.append((b, k))
                return load(staged_window, b, k)

            stager._load = counted
            try:
                for order in (range(8), [5, 1, 0, 6, 4]):
                    if order == [5, 1, 0, 6, 4]:
                        assert loads == [(b, k) for b in range(8) for k in range(-(-int(plan.staged_counts[b]) // 7))]
                    for b in order:
                        at = slice(sampled.node_ptr[b], sampled.node_ptr[b + 1])
                        staged_here = np.flatnonzero(offsets[at] >= 0)
                        stager.read_batch(staged, b, batch_gather(offsets[at][staged_here]), out, staged_here)
                        assert np.array_equal(out[staged_here].view(np.uint8),
                                              expected_rows(ds, sampled.nodes[at][staged_here]))
                assert all(len(back) <= stager_module._piece_buffer_bytes(m.row_bytes, 7) for back in stager._backs)
                b = int(np.argmax(plan.staged_counts))
                base, nbytes = plan.region(b)
                fd = os.open(f"/proc/self/fd/{staged.fd}", os.O_WRONLY)
                try:
                    os.pwrite(fd, b"\xff", base + nbytes - 1)
                finally:
                    os.close(fd)
                at = slice(sampled.node_ptr[b], sampled.node_ptr[b + 1])
                with pytest.raises(CorruptData, match=f"batch {b}"):
                    stager.read_batch(staged, b, batch_gather(offsets[at][offsets[at] >= 0]), out,
                                      np.flatnonzero(offsets[at] >= 0))
            finally:
                staged.close()


def test_bad_arguments_are_refused(straddling_dataset):
    sampled = window(straddling_dataset, 2)
    parts = straddling_dataset.partitions()
    plan = window_plan(sampled, parts, straddling_dataset.manifest.row_bytes)
    with pytest.raises(ValueError, match="chunk_bytes"):
        stager_for(straddling_dataset, None, chunk_bytes=1000)
    with stager_for(straddling_dataset, None) as stager:
        staged = stager.stage(plan)
        try:
            gather = gather_of(straddling_dataset, sampled.nodes[:sampled.node_ptr[1]])
            with pytest.raises(ValueError, match="outside"):
                stager.read_batch(staged, 2, gather, np.empty((1000, FEAT_DIM), np.float32))
            with pytest.raises(ValueError, match="out"):
                stager.read_batch(staged, 0, gather, np.empty((1, FEAT_DIM), np.float32))
            with pytest.raises(ValueError, match="gather"):
                stager.read_batch(staged, 0, gather + 10**6, np.empty((1000, FEAT_DIM), np.float32))
        finally:
            staged.close()
