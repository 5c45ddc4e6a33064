"""Checked reads (format 1.1, 1.2): the block kernel against the xxhash library, the readers, and the daemon.

The daemon tests flip one byte of ``features.bin`` or ``indices.npy`` in a copy of a prepared dataset
and train one epoch in each disk-reading mode: the client must get ``data_corrupt`` naming the file and
the byte's block or partition range instead of a batch, and the daemon must go on serving others.
"""

import json
import select
import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.caches.row_reader import RowReader
from loader.format.checksum_kernels import PAGE_BYTES, USING_C_XXH3, block_checksums, check_block_bytes, first_bad_block
from loader.format.dataset import CHECK_FILES, FEATURE_PAGES_1_1, FORMAT_VERSION, manifest_text, open_dataset
from loader.format.npyio import NpyReader
from loader.format.read_checks import CorruptData, load_read_checks
from loader.offline.verify import verify_dataset
from loader.sampling.neighbor_reader import NeighborReader
from proto.errors import RemoteError, UserError
from proto.messages import StartEpoch, Stats, StatsRequest
from tests.daemon_harness import connect, daemon_config, running_daemon, train_until_error


def reference_block_sums(data: bytes, block: int = PAGE_BYTES) -> list[int]:
    """The plain definition: xxh3_64 of each ``block`` bytes, the last one zero-padded."""
    sums = []
    for start in range(0, len(data), block):
        chunk = data[start:start + block]
        sums.append(xxhash.xxh3_64_intdigest(chunk + bytes(block - len(chunk))))
    return sums


BLOCKS = st.sampled_from([512, 1024, 2048, 4096])


@settings(max_examples=80, deadline=None)
@given(st.binary(min_size=1, max_size=3 * PAGE_BYTES + 700), BLOCKS)
def test_block_checksums_equal_the_xxhash_library(data, block):
    for numba_only in (False, True):  # the C path where available, and the fallback
        out = np.empty(-(-len(data) // block), dtype=np.uint64)
        block_checksums(np.frombuffer(data, dtype=np.uint8), out, block, numba_only)
        assert out.tolist() == reference_block_sums(data, block)


def test_the_fast_c_hash_is_found_in_the_installed_xxhash():
    assert USING_C_XXH3, "xxhash exports no XXH3_64bits: blocks are hashed 3x slower by the numba fallback"


@given(st.integers(1, 1 << 20))
def test_the_check_block_is_the_largest_power_of_two_in_a_row_within_512_and_4096(row_bytes):
    block = check_block_bytes(row_bytes)
    assert block in (512, 1024, 2048, 4096)
    assert block <= max(512, row_bytes) and (block == 4096 or 2 * block > row_bytes)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5 * PAGE_BYTES), BLOCKS, st.data())
def test_first_bad_block_names_the_block_of_a_flipped_byte(size, block, draw):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    sums = np.array(reference_block_sums(data.tobytes(), block), dtype=np.uint64)
    whole = (np.zeros(1, np.int64), np.array([size], np.int64), np.zeros(1, np.int64))
    assert first_bad_block(data, *whole, sums, block) == -1
    at = draw.draw(st.integers(0, size - 1))
    data[at] ^= 1 << draw.draw(st.integers(0, 7))
    assert first_bad_block(data, *whole, sums, block) == at // block * block


def check_rows_against_the_rule(path: Path, row_bytes: int, rows: int, data: st.DataObject) -> None:
    """Against the plain rule: a read fails iff a flipped block holds a byte of a requested row; a
    read that passes returns the file's rows, where ``rows=`` puts them."""
    size = rows * row_bytes + data.draw(st.integers(0, 100))  # trailing bytes no row owns
    content = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    block = check_block_bytes(row_bytes)
    sums = np.array(reference_block_sums(content.tobytes(), block), dtype=np.uint64)
    flipped = data.draw(st.integers(0, size - 1))
    content[flipped] ^= 0x40
    path.write_bytes(content.tobytes())
    wanted = np.array(sorted(data.draw(st.sets(st.integers(0, rows - 1), min_size=1, max_size=rows))), np.int64)
    bad = flipped // block
    touched = any(r * row_bytes // block <= bad <= (r * row_bytes + row_bytes - 1) // block for r in wanted.tolist())
    out = np.zeros((len(wanted), row_bytes), dtype=np.uint8)
    places = np.random.default_rng(rows).permutation(len(wanted)) if data.draw(st.booleans()) else None
    with RowReader(path, row_bytes=row_bytes, direct=False, block_sums=sums, check_block=block) as reader:
        if touched:
            with pytest.raises(CorruptData) as info:
                reader.read_rows(wanted * row_bytes, out, places)
            assert info.value.offset == bad * block
        else:
            reader.read_rows(wanted * row_bytes, out, places)
            expected = content[:rows * row_bytes].reshape(rows, row_bytes)[wanted]
            np.testing.assert_array_equal(out if places is None else out[places], expected)


@settings(max_examples=60, deadline=None)
@given(row_bytes=st.integers(1, 3000), rows=st.integers(1, 40), data=st.data())
def test_checked_row_reads_fail_exactly_when_a_requested_row_touches_the_flipped_block(tmp_path_factory, row_bytes,
                                                                                    rows, data):
    check_rows_against_the_rule(tmp_path_factory.mktemp("rows") / "rows.bin", row_bytes, rows, data)


@settings(max_examples=40, deadline=None)
@given(row_bytes=st.sampled_from([512, 1024, 2048, 4096, 8192]), rows=st.integers(1, 40), data=st.data())
def test_rows_of_whole_blocks_are_checked_after_the_reads_by_the_same_rule(tmp_path_factory, row_bytes, rows, data):
    """Rows made of whole, aligned blocks take the other road (checked in one pass after the reads)."""
    check_rows_against_the_rule(tmp_path_factory.mktemp("rows") / "rows.bin", row_bytes, rows, data)


def test_prepare_writes_format_1_2_with_read_checks_that_verify_recomputes(dataset_3k, tmp_path):
    ds = open_dataset(dataset_3k)
    assert ds.manifest.version == FORMAT_VERSION == "1.2" and ds.manifest.has_read_checks
    assert ds.manifest.row_bytes == 64 and ds.manifest.feature_check_block == 512  # 16 float32 features
    checks = load_read_checks(ds, blocks=True)
    assert checks is not None and checks.partition_sums.shape == (ds.manifest.num_partitions, 3)
    assert checks.feature_block == 512
    assert checks.feature_blocks.tolist() == reference_block_sums(ds.file("features").read_bytes(), 512)
    assert checks.index_pages.tolist() == reference_block_sums(ds.file("indices").read_bytes())
    assert verify_dataset(dataset_3k, progress=False).ok

    # read checks that disagree with their files (rewritten with a consistent manifest) are reported
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    table = np.load(copy / CHECK_FILES["feature_blocks"])
    table[3] ^= np.uint64(1)
    np.save(copy / CHECK_FILES["feature_blocks"], table)
    _rehash_manifest(copy)
    report = verify_dataset(copy, progress=False)
    assert any("feature_blocks.npy disagrees with the 512-byte blocks" in p for p in report.problems), report.problems


def test_a_format_1_1_dataset_is_checked_by_its_4096_byte_feature_pages(dataset_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "v11")
    (copy / CHECK_FILES["feature_blocks"]).unlink()
    np.save(copy / FEATURE_PAGES_1_1, np.array(reference_block_sums((copy / "features.bin").read_bytes()), np.uint64))
    data = json.loads((copy / "manifest.json").read_text())
    data["version"] = "1.1"
    del data["features"]["check_block"]
    data["files"][FEATURE_PAGES_1_1] = data["files"].pop(CHECK_FILES["feature_blocks"])
    (copy / "manifest.json").write_text(json.dumps(data))
    _rehash_manifest(copy)
    ds = open_dataset(copy)
    assert ds.manifest.has_read_checks and ds.manifest.feature_check_bytes == PAGE_BYTES
    checks = load_read_checks(ds, blocks=True)
    assert checks is not None and checks.feature_block == PAGE_BYTES
    assert len(checks.feature_blocks) == -(-(copy / "features.bin").stat().st_size // PAGE_BYTES)
    assert verify_dataset(copy, progress=False).ok


def _rehash_manifest(path):
    """Record the current size and xxh3 of every file, as if prepare had written them."""
    from loader.format.fileio import file_xxh3
    data = json.loads((path / "manifest.json").read_text())
    for name, entry in data["files"].items():
        entry["bytes"], entry["xxh3_64"] = (path / name).stat().st_size, file_xxh3(path / name)
    del data["checksum"]
    (path / "manifest.json").write_text(manifest_text(data))


def test_a_format_1_0_dataset_is_served_unchecked_with_a_warning(dataset_3k, tmp_path, caplog):
    copy = shutil.copytree(dataset_3k, tmp_path / "old")
    data = json.loads((copy / "manifest.json").read_text())
    data["version"] = "1.0"
    for name in CHECK_FILES.values():
        del data["files"][name]
        (copy / name).unlink()
    del data["features"]["check_block"]
    del data["checksum"]
    (copy / "manifest.json").write_text(manifest_text(data))
    ds = open_dataset(copy)
    assert not ds.manifest.has_read_checks
    assert load_read_checks(ds, blocks=True) is None
    assert "no read checks" in caplog.text
    assert verify_dataset(copy, progress=False).ok


def flip(path, offset):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x10]))


def test_row_and_neighbour_readers_refuse_a_flipped_block(dataset_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    ds = open_dataset(copy)
    checks = load_read_checks(ds, blocks=True)
    assert checks is not None
    row_bytes = ds.manifest.row_bytes
    size = ds.file("features").stat().st_size
    bad_row = 17
    flip(ds.file("features"), bad_row * row_bytes + 5)
    out = np.zeros((3, row_bytes), dtype=np.uint8)
    block = checks.feature_block
    with RowReader(ds.file("features"), row_bytes=row_bytes, direct=False, block_sums=checks.feature_blocks,
                   check_block=block) as rows:
        far = (size // PAGE_BYTES - 1) * PAGE_BYTES  # a clean page: served
        rows.read_rows(np.array([far]), out[:1])
        with pytest.raises(CorruptData) as info:
            rows.read_rows(np.array([0, bad_row * row_bytes, far]), out)
    assert info.value.offset == (bad_row * row_bytes + 5) // block * block
    assert "features.bin" in str(info.value) and f"byte {info.value.offset}" in str(info.value)

    indptr = ds.read("indptr", np.int64, 1)
    node = int(np.flatnonzero(np.diff(indptr) > 0)[len(indptr) // 2])
    with NpyReader(ds.file("indices")) as header:
        at = header.data_offset + int(indptr[node]) * header.dtype.itemsize
    flip(ds.file("indices"), at)
    first = int(np.flatnonzero(np.diff(indptr) > 0)[0])
    assert at >= 2 * PAGE_BYTES  # so the first list's pages are clean
    with NeighborReader(indptr, ds.file("indices"), page_sums=checks.index_pages) as lists:
        lists.read(np.array([first]))
        with pytest.raises(CorruptData) as info:
            lists.read(np.array([node]))
    assert info.value.offset == at // PAGE_BYTES * PAGE_BYTES and "indices.npy" in str(info.value)
    with NeighborReader(indptr, ds.file("indices")) as unchecked:
        unchecked.read(np.array([node]))  # without read checks the flipped list is served as is


def _flip_offset(ds, file: str) -> int:
    """A byte the first epoch surely reads: in a training seed's feature row, or in its in-neighbour list."""
    parts = ds.partitions()
    train = ds.read("train", np.int64, 1)
    indptr = ds.read("indptr", np.int64, 1)
    seed = int(train[np.flatnonzero(np.diff(indptr)[train] > 0)[len(train) // 3]])
    if file == "features.bin":
        p = int(parts.partition_of(seed))
        return int(parts.feat_offset[p] + (seed - parts.node_begin[p]) * ds.manifest.row_bytes + 3)
    with NpyReader(ds.file("indices")) as header:
        return header.data_offset + int(indptr[seed]) * header.dtype.itemsize


MODES = {
    "hierarchical": {},
    "exact": {"loader": {"mode": "exact"}, "fullgraph": {"neighbor_cache": 0, "feature_cache": 0}},
    "static": {"loader": {"mode": "static"}, "fullgraph": {"neighbor_cache": 0, "feature_cache": 0}},
    "staged": {"loader": {"mode": "staged"}, "fullgraph": {"neighbor_cache": 0, "feature_cache": 0}},
    "hybrid": {"loader": {"mode": "hybrid"}, "fullgraph": {"neighbor_cache": 0, "feature_cache": "64M"}},
}


@pytest.mark.parametrize("file", ["features.bin", "indices.npy"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_flipped_byte_fails_the_stream_with_data_corrupt_and_the_daemon_serves_on(dataset_3k, tmp_path, mode, file):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    ds = open_dataset(copy)
    offset = _flip_offset(ds, file)
    flip(copy / file, offset)
    config = daemon_config(copy, tmp_path / "s.sock", **MODES[mode])
    with running_daemon(config) as daemon, connect(config) as client:
        err = train_until_error(client)
        assert err.code == "data_corrupt", err
        assert file in err.message and "fails its checksum" in err.message
        if mode != "hierarchical":  # the row-granular modes name the block; the hierarchical one the partition range
            block = ds.manifest.feature_check_bytes if file == "features.bin" else PAGE_BYTES
            assert f"at byte {offset // block * block} " in err.message
        assert daemon.metrics.read_check_failures.labels(file)._value.get() == 1
        with connect(config) as other:
            other.send(StatsRequest())
            assert isinstance(other.recv(timeout=30), Stats)


def test_a_flip_in_the_padding_between_partitions_is_caught_too(dataset_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    parts = open_dataset(copy).partitions()
    gaps = np.flatnonzero(parts.feat_nbytes % PAGE_BYTES)
    assert len(gaps), "the test graph has no partition whose rows end inside a page"
    p = int(gaps[0])
    flip(copy / "features.bin", int(parts.feat_offset[p] + parts.feat_nbytes[p]))  # the first zero byte after its rows
    config = daemon_config(copy, tmp_path / "s.sock")
    with running_daemon(config), connect(config) as client:
        err = train_until_error(client)
        assert err.code == "data_corrupt" and f"partition {p}'s features range" in err.message


@pytest.mark.parametrize("mode, file", [("exact", "indices.npy"), ("static", "features.bin")])
def test_serve_refuses_to_start_when_the_bytes_its_caches_load_fail_their_check(dataset_3k, tmp_path, mode, file):
    """Modes exact and static fill their neighbour-list and feature caches at start (the whole graph fits this
    budget): damage there stops the start with one line naming the file, before any client is served."""
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    offset = _flip_offset(open_dataset(copy), file)
    if file == "indices.npy":  # the id's low byte: the flipped id must stay a node, or the start-up pilot's
        ids = np.load(copy / file, mmap_mode="r")  # range check (not the read check) would refuse it
        with NpyReader(copy / file) as header:
            entry = (offset - header.data_offset) // header.dtype.itemsize
        offset = header.data_offset + entry * header.dtype.itemsize
        assert 16 <= int(ids[entry]) < len(open_dataset(copy).read("indptr", np.int64, 1)) - 17
    flip(copy / file, offset)
    config = daemon_config(copy, tmp_path / "s.sock", loader={"mode": mode})
    with pytest.raises(CorruptData, match=rf"{file.replace('.', '[.]')}: .* at byte \d+ fails its checksum"), \
            running_daemon(config):
        pass
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("mode", ["hierarchical", "exact"])
def test_serve_refuses_an_indices_file_whose_ids_leave_the_graph_in_one_line_naming_it(dataset_3k, tmp_path, mode):
    """A damaged id past the last node is caught by the start-up pilot's range check before any read check:
    one line naming the file (a UserError, exit 78), not an internal ValueError."""
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    with NpyReader(copy / "indices.npy") as header:
        offset, itemsize = header.data_offset, header.dtype.itemsize
    with open(copy / "indices.npy", "r+b") as handle:
        handle.seek(offset + itemsize - 1)  # the first id's high byte: far past the last node
        handle.write(b"\x7f")
    config = daemon_config(copy, tmp_path / "s.sock", loader={"mode": mode})
    with pytest.raises(UserError, match=r"indices[.]npy: .*damaged: run 'megabatch verify'"), running_daemon(config):
        pass
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("name", ["labels.npy", "indptr.npy", "partitions.npy", "val_idx.npy", "static_features.npy"])
def test_a_flipped_byte_in_a_file_read_whole_stops_the_start_in_one_line(dataset_3k, tmp_path, name):
    """Files read whole at start are served from RAM (labels travel in every batch): their manifest hash is
    their read check, so a flip never reaches a batch."""
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    size = (copy / name).stat().st_size
    flip(copy / name, size - 3)  # in the data, past the header
    config = daemon_config(copy, tmp_path / "s.sock", loader={"mode": "hierarchical"},
                           hierarchy={"static_cache": True})
    pattern = rf"{name.replace('.', '[.]')}: its bytes do not match the manifest's xxh3_64"
    with pytest.raises(UserError, match=pattern), running_daemon(config):
        pass
    assert not (tmp_path / "s.sock").exists()


def test_mode_inmemory_checks_every_partition_of_features_it_loads(dataset_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    flip(copy / "features.bin", _flip_offset(open_dataset(copy), "features.bin"))
    config = daemon_config(copy, tmp_path / "s.sock", loader={"mode": "inmemory"})
    with pytest.raises(CorruptData, match=r"features[.]bin: partition \d+'s features range"), running_daemon(config):
        pass


def test_serve_refuses_a_truncated_file_at_start(dataset_3k, tmp_path):
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    with open(copy / "indices.npy", "r+b") as handle:
        handle.truncate(handle.seek(0, 2) - 8)
    config = daemon_config(copy, tmp_path / "s.sock")
    truncated = r"indices\.npy: \d+ bytes, the manifest says \d+ \(truncated or replaced\)"
    with pytest.raises(UserError, match=truncated), running_daemon(config):
        pass


def test_a_client_that_sends_after_the_daemon_closed_still_learns_why(dataset_3k, tmp_path):
    """The daemon sends ``data_corrupt`` and closes while the client may be sending a ``Release``: the
    client's send then fails with EPIPE, and must report the daemon's reason, not "Broken pipe".

    The client releases nothing: whether the slots fill before the damaged partition is read depends on
    timing, and a publisher waiting for a slot must hear the pipeline's failure at once (a stall timeout
    longer than the test's wait makes "timeout" impossible as the answer)."""
    copy = shutil.copytree(dataset_3k, tmp_path / "ds")
    ds = open_dataset(copy)
    flip(copy / "features.bin", _flip_offset(ds, "features.bin"))
    config = daemon_config(copy, tmp_path / "s.sock", server={"stall_timeout": 600}, publisher={"slots": 1})
    with running_daemon(config), connect(config) as client:
        client.send(StartEpoch(epoch=0))
        poller = select.poll()
        poller.register(client._sock, select.POLLRDHUP)  # the daemon's close, before reading a byte
        assert poller.poll(60_000)
        with pytest.raises(RemoteError) as info:
            client.send(StatsRequest())
        assert info.value.code == "data_corrupt" and "features.bin" in info.value.message
