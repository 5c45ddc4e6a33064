import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.format.npyio import NpyReader, NpyWriter, read_npy, write_npy
from proto.errors import UserError


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 200), cols=st.integers(1, 7), chunk=st.integers(1, 50),
       dtype=st.sampled_from(["float32", "float16", "int64", "int32"]))
def test_chunked_write_read_matches_numpy(tmp_path_factory, rows, cols, chunk, dtype):
    path = tmp_path_factory.mktemp("npy") / "a.npy"
    data = (np.arange(rows * cols) % 97).reshape(rows, cols).astype(dtype)
    with NpyWriter(path, dtype, (cols,)) as writer:
        for start in range(0, rows, chunk):
            writer.append(data[start:start + chunk])
    np.testing.assert_array_equal(np.load(path), data)
    with NpyReader(path) as reader:
        parts = [arr for _, arr in reader.chunks(chunk)]
    got = np.concatenate(parts) if parts else np.empty((0, cols), dtype)
    np.testing.assert_array_equal(got, data)


def test_truncated_file_is_a_user_error(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(100, dtype=np.int64))
    data = path.read_bytes()
    path.write_bytes(data[:-8])
    with pytest.raises(UserError, match="truncated"):
        NpyReader(path)


def test_corrupt_header_and_magic(tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"hello world, not numpy")
    with pytest.raises(UserError, match="not a .npy"):
        read_npy(bad)
    path = tmp_path / "h.npy"
    np.save(path, np.arange(3))
    raw = bytearray(path.read_bytes())
    raw[12:20] = b"}}}}}}}}"
    path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="corrupt .npy header"):
        read_npy(path)


def test_expected_dtype_and_ndim(tmp_path):
    path = tmp_path / "a.npy"
    write_npy(path, np.zeros((3, 2), np.float32))
    with pytest.raises(UserError, match="dtype"):
        read_npy(path, expect_dtype=np.int64)
    with pytest.raises(UserError, match="dimensions"):
        read_npy(path, expect_ndim=1)


def test_declared_row_count_is_enforced(tmp_path):
    writer = NpyWriter(tmp_path / "a.npy", np.int64, nrows=3)
    writer.append(np.arange(2))
    with pytest.raises(ValueError, match="declared"):
        writer.close()


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), cols=st.integers(0, 300), chunk=st.integers(1, 70))
def test_column_writer_and_reader_round_trip(tmp_path_factory, rows, cols, chunk):
    """A (rows, cols) array written and read by column chunks is the plain C-ordered .npy."""
    from loader.format.npyio import NpyColumnWriter

    path = tmp_path_factory.mktemp("npy") / "a.npy"
    data = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols) * 7 % 1001
    with NpyColumnWriter(path, np.int64, rows, cols) as writer:
        for start in range(0, cols, chunk):
            writer.append(data[:, start:start + chunk])
    np.testing.assert_array_equal(np.load(path), data)
    with NpyReader(path) as reader:
        parts = [block for _start, block in reader.column_chunks(chunk)]
        assert reader.read_columns(cols // 3, cols // 2).tolist() == data[:, cols // 3:cols // 2].tolist()
    got = np.concatenate(parts, axis=1) if parts else np.empty((rows, 0), np.int64)
    np.testing.assert_array_equal(got, data)


def test_column_writer_checks_its_count(tmp_path):
    from loader.format.npyio import NpyColumnWriter

    with pytest.raises(ValueError, match="wrote 2 columns, declared 3"), \
            NpyColumnWriter(tmp_path / "a.npy", np.int64, 2, 3) as writer:
        writer.append(np.zeros((2, 2), np.int64))
