"""Checked reads (format 1.1): the page kernel against the xxhash library, the readers, and the daemon.

The daemon tests flip one byte of ``features.bin`` or ``indices.npy`` in a copy of a prepared dataset
and train one epoch in each disk-reading mode: the client must get ``data_corrupt`` naming the file and
the byte's page or partition range instead of a batch, and the daemon must go on serving others.
"""

import json
import select
import shutil

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.caches.row_reader import RowReader
from loader.format.checksum_kernels import PAGE_BYTES, USING_C_XXH3, first_bad_page, page_checksums
from loader.format.dataset import CHECK_FILES, FORMAT_VERSION, manifest_text, open_dataset
from loader.format.npyio import NpyReader
from loader.format.read_checks import CorruptData, load_read_checks
from loader.offline.verify import verify_dataset
from loader.sampling.neighbor_reader import NeighborReader
from proto.errors import RemoteError, UserError
from proto.messages import StartEpoch, Stats, StatsRequest
from tests.daemon_harness import connect, daemon_config, running_daemon, small_dataset, train_until_error


def reference_page_sums(data: bytes) -> list[int]:
    """The plain definition: xxh3_64 of each 4 KiB page, the last one zero-padded."""
    pages = []
    for start in range(0, len(data), PAGE_BYTES):
        page = data[start:start + PAGE_BYTES]
        pages.append(xxhash.xxh3_64_intdigest(page + bytes(PAGE_BYTES - len(page))))
    return pages


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=3 * PAGE_BYTES + 700))
def test_page_checksums_equal_the_xxhash_library(data):
    for numba_only in (False, True):  # the C path where available, and the fallback
        out = np.empty(-(-len(data) // PAGE_BYTES), dtype=np.uint64)
        page_checksums(np.frombuffer(data, dtype=np.uint8), out, numba_only)
        assert out.tolist() == reference_page_sums(data)


def test_the_fast_c_hash_is_found_in_the_installed_xxhash():
    assert USING_C_XXH3, "xxhash exports no XXH3_64bits: pages are hashed 3x slower by the numba fallback"


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5 * PAGE_BYTES), st.data())
def test_first_bad_page_names_the_page_of_a_flipped_byte(size, draw):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    sums = np.array(reference_page_sums(data.tobytes()), dtype=np.uint64)
    whole = (np.zeros(1, np.int64), np.array([size], np.int64), np.zeros(1, np.int64))
    assert first_bad_page(data, *whole, sums) == -1
    at = draw.draw(st.integers(0, size - 1))
    data[at] ^= 1 << draw.draw(st.integers(0, 7))
    assert first_bad_page(data, *whole, sums) == at // PAGE_BYTES * PAGE_BYTES


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return small_dataset(tmp_path_factory.mktemp("checked"))


def test_prepare_writes_format_1_1_with_read_checks_that_verify_recomputes(dataset, tmp_path):
    ds = open_dataset(dataset)
    assert ds.manifest.version == FORMAT_VERSION == "1.1" and ds.manifest.has_read_checks
    checks = load_read_checks(ds, pages=True)
    assert checks is not None and checks.partition_sums.shape == (ds.manifest.num_partitions, 3)
    assert checks.feature_pages.tolist() == reference_page_sums(ds.file("features").read_bytes())
    assert checks.index_pages.tolist() == reference_page_sums(ds.file("indices").read_bytes())
    assert verify_dataset(dataset, progress=False).ok

    # read checks that disagree with their files (rewritten with a consistent manifest) are reported
    copy = shutil.copytree(dataset, tmp_path / "ds")
    table = np.load(copy / CHECK_FILES["feature_pages"])
    table[3] ^= np.uint64(1)
    np.save(copy / CHECK_FILES["feature_pages"], table)
    _rehash_manifest(copy)
    report = verify_dataset(copy, progress=False)
    assert any("feature_pages.npy disagrees" in p for p in report.problems), report.problems


def _rehash_manifest(path):
    """Record the current size and xxh3 of every file, as if prepare had written them."""
    from loader.format.fileio import file_xxh3
    data = json.loads((path / "manifest.json").read_text())
    for name, entry in data["files"].items():
        entry["bytes"], entry["xxh3_64"] = (path / name).stat().st_size, file_xxh3(path / name)
    del data["checksum"]
    (path / "manifest.json").write_text(manifest_text(data))


def test_a_format_1_0_dataset_is_served_unchecked_with_a_warning(dataset, tmp_path, caplog):
    copy = shutil.copytree(dataset, tmp_path / "old")
    data = json.loads((copy / "manifest.json").read_text())
    data["version"] = "1.0"
    for name in CHECK_FILES.values():
        del data["files"][name]
        (copy / name).unlink()
    del data["checksum"]
    (copy / "manifest.json").write_text(manifest_text(data))
    ds = open_dataset(copy)
    assert not ds.manifest.has_read_checks
    assert load_read_checks(ds, pages=True) is None
    assert "no read checks" in caplog.text
    assert verify_dataset(copy, progress=False).ok


def flip(path, offset):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x10]))


def test_row_and_neighbour_readers_refuse_a_flipped_page(dataset, tmp_path):
    copy = shutil.copytree(dataset, tmp_path / "ds")
    ds = open_dataset(copy)
    checks = load_read_checks(ds, pages=True)
    assert checks is not None
    row_bytes = ds.manifest.row_bytes
    size = ds.file("features").stat().st_size
    bad_row = 17
    flip(ds.file("features"), bad_row * row_bytes + 5)
    out = np.zeros((3, row_bytes), dtype=np.uint8)
    with RowReader(ds.file("features"), row_bytes=row_bytes, direct=False, page_sums=checks.feature_pages) as rows:
        far = (size // PAGE_BYTES - 1) * PAGE_BYTES  # a clean page: served
        rows.read_rows(np.array([far]), out[:1])
        with pytest.raises(CorruptData) as info:
            rows.read_rows(np.array([0, bad_row * row_bytes, far]), out)
    assert info.value.offset == (bad_row * row_bytes + 5) // PAGE_BYTES * PAGE_BYTES
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
        p = int(np.searchsorted(parts[:, 1], seed, side="right"))
        return int(parts[p, 4] + (seed - parts[p, 0]) * ds.manifest.row_bytes + 3)
    with NpyReader(ds.file("indices")) as header:
        return header.data_offset + int(indptr[seed]) * header.dtype.itemsize


MODES = {
    "hierarchical": {},
    "exact": {"loader": {"mode": "exact"}, "exact": {"neighbor_cache": 0, "feature_cache": 0}},
    "static": {"loader": {"mode": "static"}, "exact": {"neighbor_cache": 0, "feature_cache": 0}},
}


@pytest.mark.parametrize("file", ["features.bin", "indices.npy"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_flipped_byte_fails_the_stream_with_data_corrupt_and_the_daemon_serves_on(dataset, tmp_path, mode, file):
    copy = shutil.copytree(dataset, tmp_path / "ds")
    ds = open_dataset(copy)
    offset = _flip_offset(ds, file)
    flip(copy / file, offset)
    config = daemon_config(copy, tmp_path / "s.sock", **MODES[mode])
    with running_daemon(config) as daemon, connect(config) as client:
        err = train_until_error(client)
        assert err.code == "data_corrupt", err
        assert file in err.message and "fails its checksum" in err.message
        if mode != "hierarchical":  # the row-granular modes name the page; the hierarchical one the partition range
            assert f"at byte {offset // PAGE_BYTES * PAGE_BYTES} " in err.message
        assert daemon.metrics.read_check_failures.labels(file)._value.get() == 1
        with connect(config) as other:
            other.send(StatsRequest())
            assert isinstance(other.recv(timeout=30), Stats)


def test_a_flip_in_the_padding_between_partitions_is_caught_too(dataset, tmp_path):
    copy = shutil.copytree(dataset, tmp_path / "ds")
    parts = open_dataset(copy).partitions()
    gaps = np.flatnonzero(parts[:, 5] % PAGE_BYTES)
    assert len(gaps), "the test graph has no partition whose rows end inside a page"
    p = int(gaps[0])
    flip(copy / "features.bin", int(parts[p, 4] + parts[p, 5]))  # the first zero byte after its rows
    config = daemon_config(copy, tmp_path / "s.sock")
    with running_daemon(config), connect(config) as client:
        err = train_until_error(client)
        assert err.code == "data_corrupt" and f"partition {p}'s features range" in err.message


def test_serve_refuses_a_truncated_file_at_start(dataset, tmp_path):
    copy = shutil.copytree(dataset, tmp_path / "ds")
    with open(copy / "indices.npy", "r+b") as handle:
        handle.truncate(handle.seek(0, 2) - 8)
    config = daemon_config(copy, tmp_path / "s.sock")
    truncated = r"indices\.npy: \d+ bytes, the manifest says \d+ \(truncated or replaced\)"
    with pytest.raises(UserError, match=truncated), running_daemon(config):
        pass


def test_a_client_that_sends_after_the_daemon_closed_still_learns_why(dataset, tmp_path):
    """The daemon sends ``data_corrupt`` and closes while the client may be sending a ``Release``: the
    client's send then fails with EPIPE, and must report the daemon's reason, not "Broken pipe"."""
    copy = shutil.copytree(dataset, tmp_path / "ds")
    ds = open_dataset(copy)
    flip(copy / "features.bin", _flip_offset(ds, "features.bin"))
    config = daemon_config(copy, tmp_path / "s.sock")
    with running_daemon(config), connect(config) as client:
        client.send(StartEpoch(epoch=0))
        poller = select.poll()
        poller.register(client._sock, select.POLLRDHUP)  # the daemon's close, before reading a byte
        assert poller.poll(60_000)
        with pytest.raises(RemoteError) as info:
            client.send(StatsRequest())
        assert info.value.code == "data_corrupt" and "features.bin" in info.value.message
