"""The sequential reader: a pass's rows bitwise the file's, every chunk checked (a flipped byte fails the pass naming
the file and the byte), a pass stopped between two chunks, and the memory charged what the reader holds."""

import shutil
import threading

import numpy as np
import pytest

from loader.format.dataset import Dataset, open_dataset
from loader.format.partition_table import row_offsets_for
from loader.format.read_checks import CorruptData, load_read_checks
from loader.staging.sequential_reader import PassStopped, SequentialReader, reader_buffer_bytes
from tests.graphs import generated_dataset

# 25 float32 features: 100-byte rows, which straddle pages and chunks
FEAT_DIM = 25


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Dataset:
    return open_dataset(generated_dataset(tmp_path_factory.mktemp("reader"), nodes=2500, feat_dim=FEAT_DIM,
                                          partitions=5))


@pytest.fixture(scope="module")
def word_dataset(tmp_path_factory) -> Dataset:
    """Rows of 1 KiB: the word copies."""
    return open_dataset(generated_dataset(tmp_path_factory.mktemp("reader-words"), nodes=3000, feat_dim=256,
                                          partitions=4))


def reader_for(dataset: Dataset, checked: bool = True, **kwargs) -> SequentialReader:
    m = dataset.manifest
    checks = load_read_checks(dataset, blocks=True) if checked else None
    return SequentialReader(dataset.file("features"), row_bytes=m.row_bytes,
                            block_sums=None if checks is None else checks.feature_blocks,
                            check_block=m.feature_check_bytes, **kwargs)


def file_rows(dataset: Dataset, offsets: np.ndarray) -> np.ndarray:
    data = np.fromfile(dataset.file("features"), dtype=np.uint8)
    return data[offsets[:, None] + np.arange(dataset.manifest.row_bytes)]


def every_row(dataset: Dataset) -> np.ndarray:
    m = dataset.manifest
    parts = dataset.partitions()
    return row_offsets_for(np.arange(m.num_nodes), parts.node_begin, parts.feat_offset, m.row_bytes)


@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
@pytest.mark.parametrize("which", ["dense", "sparse"])
def test_read_rows_fills_any_rows_in_one_pass(dataset, word_dataset, chunk_bytes, which):
    """A cache's rows by one pass over the chunks holding them (rows straddling chunks, 100-byte and 1 KiB rows),
    into any places of ``out``, checked; the same bytes as the dataset's."""
    for ds in (dataset, word_dataset):
        m = ds.manifest
        parts = ds.partitions()
        rng = np.random.default_rng(chunk_bytes)
        ids = rng.choice(m.num_nodes, m.num_nodes // (3 if which == "dense" else 50), replace=False)
        offsets = row_offsets_for(ids, parts.node_begin, parts.feat_offset, m.row_bytes)
        rows = rng.permutation(len(ids) + 7)[:len(ids)]  # places in out, some left as they were
        out = np.full((len(ids) + 7, m.feat_dim), np.nan, dtype=np.float32)
        with reader_for(ds, chunk_bytes=chunk_bytes) as reader:
            stats = reader.read_rows(offsets, out, rows)
            assert np.array_equal(out[rows].view(np.uint8), file_rows(ds, offsets))
            assert np.isnan(out[np.setdiff1d(np.arange(len(out)), rows)]).all()
            touched = len(np.unique(offsets // chunk_bytes))
            assert stats.chunks == touched and stats.file_bytes_read <= touched * (chunk_bytes + 4096 + m.row_bytes)
            with pytest.raises(ValueError, match="twice"):
                reader.read_rows(np.repeat(offsets[:2], 2), out, np.arange(4))
            assert reader.read_rows(offsets[:0], out, rows[:0]).chunks == 0


def test_a_corrupt_feature_block_fails_the_pass_naming_the_file_and_the_byte(dataset, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(dataset.path, copy)
    corrupt = open_dataset(copy)
    offsets = every_row(corrupt)[::7]
    victim = int(offsets[len(offsets) // 2]) + 3
    with open(corrupt.file("features"), "r+b") as f:
        f.seek(victim)
        byte = f.read(1)
        f.seek(victim)
        f.write(bytes([byte[0] ^ 0x40]))
    block = corrupt.manifest.feature_check_bytes
    out = np.empty((len(offsets), FEAT_DIM), np.float32)
    with reader_for(corrupt, chunk_bytes=8192) as reader, pytest.raises(CorruptData) as failed:
        reader.read_rows(offsets, out, np.arange(len(offsets)))
    assert failed.value.path.name == "features.bin" and failed.value.offset == victim // block * block
    assert f"features.bin: the {block}-byte block at byte {victim // block * block}" in str(failed.value)
    with reader_for(corrupt, checked=False, chunk_bytes=8192) as reader:  # unchecked: served (what checks prevent)
        reader.read_rows(offsets, out, np.arange(len(offsets)))
    assert not np.array_equal(out.view(np.uint8), file_rows(dataset, offsets))


def test_a_pass_stops_between_chunks_once_its_stop_is_set(dataset, monkeypatch):
    """The stop is set while the third chunk is read (on the read-ahead thread): the pass ends before using another
    chunk, its read ahead landed, and the reader's next pass reads every row."""
    offsets = every_row(dataset)
    out = np.zeros((len(offsets), FEAT_DIM), np.float32)
    stop = threading.Event()
    reads: list[int] = []
    with reader_for(dataset, chunk_bytes=4096) as reader:
        read_chunk = reader._read_chunk

        def counted(buffer, at, need):
            reads.append(at)
            if len(reads) == 3:
                stop.set()
            return read_chunk(buffer, at, need)

        monkeypatch.setattr(reader, "_read_chunk", counted)
        total = len(np.unique(offsets // 4096))
        assert total > 20
        with pytest.raises(PassStopped):
            reader.read_rows(offsets, out, np.arange(len(offsets)), stop)
        assert len(reads) == 3  # the chunk being read when it stopped, no read ahead started after it
        reads.clear()
        stats = reader.read_rows(offsets, out, np.arange(len(offsets)), threading.Event())
        assert stats.chunks == len(reads) == total
        assert np.array_equal(out.view(np.uint8), file_rows(dataset, offsets))


def test_closing_the_reader_stops_a_pass_in_flight(dataset, monkeypatch):
    """``close`` from another thread while a pass runs: the pass ends at its next chunk and the reader closes."""
    offsets = every_row(dataset)
    out = np.zeros((len(offsets), FEAT_DIM), np.float32)
    reader = reader_for(dataset, chunk_bytes=4096)
    closer = threading.Thread(target=reader.close)
    reads: list[int] = []
    read_chunk = reader._read_chunk

    def counted(buffer, at, need):
        reads.append(at)
        if len(reads) == 3:
            closer.start()
            assert reader._closing.wait(30)  # close has begun: it waits for the pass
        return read_chunk(buffer, at, need)

    monkeypatch.setattr(reader, "_read_chunk", counted)
    with pytest.raises(PassStopped):
        reader.read_rows(offsets, out, np.arange(len(offsets)))
    closer.join(30)
    assert not closer.is_alive() and reader.closed and len(reads) == 3
    with pytest.raises(ValueError, match="closed"):
        reader.read_rows(offsets[:1], out, np.zeros(1, np.int64))


@pytest.mark.parametrize("row_bytes, chunk_bytes, scatter_bytes", [(100, 4096, 8192), (1024, 1 << 20, 1 << 20),
                                                                   (6000, 8192, 32 << 20)])
def test_the_reader_holds_what_its_charge_says(tmp_path, row_bytes, chunk_bytes, scatter_bytes):
    path = tmp_path / "rows.bin"
    path.write_bytes(bytes(3 * chunk_bytes))
    with SequentialReader(path, row_bytes=row_bytes, chunk_bytes=chunk_bytes, scatter_bytes=scatter_bytes,
                          direct=False) as reader:
        held = sum(len(chunk) for chunk in reader._chunks) + reader.scatter.nbytes
    assert held == reader_buffer_bytes(row_bytes=row_bytes, chunk_bytes=chunk_bytes, scatter_bytes=scatter_bytes)


def test_bad_arguments_are_refused(dataset):
    with pytest.raises(ValueError, match="chunk_bytes"):
        reader_for(dataset, chunk_bytes=1000)
    with pytest.raises(ValueError, match="row_bytes"):
        SequentialReader(dataset.file("features"), row_bytes=0)
    with reader_for(dataset) as reader:
        out = np.zeros((2, FEAT_DIM), np.float32)
        with pytest.raises(ValueError, match="outside"):
            reader.read_rows(np.array([reader.file_size]), out[:1], np.zeros(1, np.int64))
        with pytest.raises(ValueError, match="out"):
            reader.read_rows(np.array([0]), np.zeros((1, 3), np.float32), np.zeros(1, np.int64))
        with pytest.raises(ValueError, match="rows"):
            reader.read_rows(np.array([0]), out, np.array([2]))
