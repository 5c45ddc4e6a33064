"""Stream ``.npy`` files in row chunks with bounded memory (no memory maps).

Memory maps would make every touched page count toward the process's resident set and
would turn a truncated file into a SIGBUS; explicit ``preadv`` reads into fresh arrays keep
peak memory at one chunk and turn truncation into a clear error.
"""

import ast
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np
import numpy.typing as npt

from loader.format.fileio import pread_into, write_all
from proto.errors import UserError

__all__ = ["NpyReader", "NpyWriter", "NpyColumnWriter", "read_npy", "write_npy", "rows_per_chunk"]

_MAGIC = b"\x93NUMPY"
_GROWABLE_HEADER_BYTES = 256


def rows_per_chunk(row_bytes: int, budget_bytes: int, minimum: int = 1) -> int:
    """How many rows of ``row_bytes`` fit in ``budget_bytes`` (at least ``minimum``)."""
    return max(minimum, budget_bytes // max(1, row_bytes))


class NpyReader:
    """A read-only ``.npy`` file read by row ranges.

    ``expect_dtype`` / ``expect_ndim`` make a mismatch a UserError that names the file.
    """

    def __init__(self, path: Path | str, *, expect_dtype: npt.DTypeLike | None = None,
                 expect_ndim: int | None = None) -> None:
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise UserError(f"{self.path}: file not found") from None
        except OSError as err:
            raise UserError(f"{self.path}: cannot open ({err.strerror})") from None
        try:
            self.shape, self.dtype, self.data_offset = self._parse_header()
            expected = self.data_offset + int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
            size = os.fstat(self._fd).st_size
            if size < expected:
                raise UserError(f"{self.path}: truncated (header promises {expected} bytes, file has {size})")
            if size > expected:
                raise UserError(f"{self.path}: {size - expected} trailing bytes after the array data")
            if expect_dtype is not None and self.dtype != np.dtype(expect_dtype):
                raise UserError(f"{self.path}: dtype {self.dtype}, expected {np.dtype(expect_dtype)}")
            if expect_ndim is not None and len(self.shape) != expect_ndim:
                raise UserError(f"{self.path}: shape {self.shape} has {len(self.shape)} dimensions, "
                                f"expected {expect_ndim}")
        except BaseException:
            os.close(self._fd)
            raise

    def _parse_header(self) -> tuple[tuple[int, ...], np.dtype, int]:
        head = os.pread(self._fd, 12, 0)
        if len(head) < 10 or head[:6] != _MAGIC:
            raise UserError(f"{self.path}: not a .npy file (bad magic)")
        major = head[6]
        if major == 1:
            header_len, start = int.from_bytes(head[8:10], "little"), 10
        elif major in (2, 3):
            header_len, start = int.from_bytes(head[8:12], "little"), 12
        else:
            raise UserError(f"{self.path}: unsupported .npy version {major}")
        raw = os.pread(self._fd, header_len, start)
        if len(raw) < header_len:
            raise UserError(f"{self.path}: truncated .npy header")
        try:
            header = ast.literal_eval(raw.decode("latin1"))
            dtype = np.dtype(header["descr"])
            shape = tuple(int(x) for x in header["shape"])
            fortran = bool(header["fortran_order"])
        except (ValueError, SyntaxError, KeyError, TypeError) as err:
            raise UserError(f"{self.path}: corrupt .npy header ({err})") from None
        if fortran:
            raise UserError(f"{self.path}: Fortran-ordered arrays are not supported; save with C order")
        if dtype.hasobject:
            raise UserError(f"{self.path}: object arrays are not supported (no pickles)")
        if any(dim < 0 for dim in shape):
            raise UserError(f"{self.path}: negative dimension in shape {shape}")
        return shape, dtype, start + header_len

    @property
    def nrows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` as a new array."""
        stop = self.nrows if stop is None else min(stop, self.nrows)
        start = max(0, min(start, stop))
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        if out.nbytes:
            pread_into(self._fd, out, self.data_offset + start * self.row_bytes, self.path)
        return out if self.shape else out.reshape(())

    def chunks(self, rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first_row, array)`` for consecutive chunks of at most ``rows`` rows."""
        for start in range(0, self.nrows, max(1, rows)):
            yield start, self.read(start, start + rows)

    def read_columns(self, start: int, stop: int) -> np.ndarray:
        """Columns ``[start, stop)`` of a 2-D array, as a new (rows, stop - start) array.

        For wide, short arrays such as a (2, E) edge list, whose first-axis rows are too long to read
        whole: each row's slice is one ``pread``.
        """
        if len(self.shape) != 2:
            raise ValueError(f"{self.path}: read_columns needs a 2-D array, shape is {self.shape}")
        rows, cols = self.shape
        stop = min(stop, cols)
        start = max(0, min(start, stop))
        out = np.empty((rows, stop - start), dtype=self.dtype)
        if out.nbytes:
            for row in range(rows):
                pread_into(self._fd, out[row], self.data_offset + (row * cols + start) * self.dtype.itemsize,
                           self.path)
        return out

    def column_chunks(self, columns: int) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first_column, array)`` for consecutive column chunks of a 2-D array."""
        for start in range(0, self.shape[1] if len(self.shape) == 2 else 0, max(1, columns)):
            yield start, self.read_columns(start, start + columns)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "NpyReader":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _header_bytes(dtype: np.dtype, shape: tuple[int, ...], total: int | None) -> bytes:
    body = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    if total is None:
        total = -(-(10 + len(body) + 1) // 64) * 64
    padded = body.ljust(total - 10 - 1) + "\n"
    if len(padded) + 10 != total:
        raise ValueError(f"npy header does not fit in {total} bytes")
    return _MAGIC + b"\x01\x00" + len(padded).to_bytes(2, "little") + padded.encode("latin1")


class _FileWriter:
    """What both writers share: an open descriptor, ``close`` (checked, fsynced) on a clean exit from a ``with``
    block, and ``abort`` (closed, nothing checked) when it raised, so no half-written file is passed as whole."""

    _fd: int

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class NpyWriter(_FileWriter):
    """Write a ``.npy`` file by appending row chunks.

    With ``nrows`` given, the header is final up front and ``close`` checks the count; with
    ``nrows=None`` the file grows and the header is rewritten on ``close``.
    """

    def __init__(self, path: Path | str, dtype: npt.DTypeLike, row_shape: tuple[int, ...] = (),
                 nrows: int | None = None) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(int(x) for x in row_shape)
        self.expected_rows = nrows
        self.rows = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._header_total = None if nrows is not None else _GROWABLE_HEADER_BYTES
        header = _header_bytes(self.dtype, (nrows or 0, *self.row_shape), self._header_total)
        self._header_total = len(header)
        write_all(self._fd, header)

    def append(self, rows: np.ndarray) -> None:
        """Append rows (cast to the file's dtype if safe); shape after axis 0 must match."""
        arr = np.asarray(rows)
        if arr.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path}: appended rows of shape {arr.shape}, file rows are {self.row_shape}")
        if arr.dtype != self.dtype:
            arr = arr.astype(self.dtype)
        if self.expected_rows is not None and self.rows + len(arr) > self.expected_rows:
            raise ValueError(f"{self.path}: more than the declared {self.expected_rows} rows")
        write_all(self._fd, np.ascontiguousarray(arr))
        self.rows += len(arr)

    def close(self) -> None:
        """Finish the header, fsync and close."""
        if self._fd < 0:
            return
        try:
            if self.expected_rows is not None and self.rows != self.expected_rows:
                raise ValueError(f"{self.path}: wrote {self.rows} rows, declared {self.expected_rows}")
            if self.expected_rows is None:
                write_all(self._fd, _header_bytes(self.dtype, (self.rows, *self.row_shape), self._header_total),
                          offset=0)
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1



class NpyColumnWriter(_FileWriter):
    """Write a 2-D (rows, columns) ``.npy`` file of known shape by appending column chunks.

    For a (2, E) edge list streamed in chunks of edges: each chunk's rows are written at their
    places with ``pwrite``, so the file is C-ordered like any other. ``close`` checks the count.
    """

    def __init__(self, path: Path | str, dtype: npt.DTypeLike, nrows: int, ncols: int) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.shape = (int(nrows), int(ncols))
        self.columns = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            header = _header_bytes(self.dtype, self.shape, None)
            write_all(self._fd, header)
            self._data_offset = len(header)
            os.ftruncate(self._fd, self._data_offset + self.shape[0] * self.shape[1] * self.dtype.itemsize)
        except BaseException:
            self.abort()
            raise

    def append(self, block: np.ndarray) -> None:
        """Append columns: ``block`` has shape (rows, k); cast to the file's dtype if needed."""
        arr = np.asarray(block)
        if arr.ndim != 2 or arr.shape[0] != self.shape[0]:
            raise ValueError(f"{self.path}: appended a block of shape {arr.shape}, file has {self.shape[0]} rows")
        if self.columns + arr.shape[1] > self.shape[1]:
            raise ValueError(f"{self.path}: more than the declared {self.shape[1]} columns")
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        for row in range(self.shape[0]):
            write_all(self._fd, arr[row],
                      offset=self._data_offset + (row * self.shape[1] + self.columns) * self.dtype.itemsize)
        self.columns += arr.shape[1]

    def close(self) -> None:
        """Check the column count, fsync and close."""
        if self._fd < 0:
            return
        try:
            if self.columns != self.shape[1]:
                raise ValueError(f"{self.path}: wrote {self.columns} columns, declared {self.shape[1]}")
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1



def read_npy(path: Path | str, *, expect_dtype: npt.DTypeLike | None = None,
             expect_ndim: int | None = None) -> np.ndarray:
    """Read a whole (small) ``.npy`` file with the same validation as NpyReader."""
    with NpyReader(path, expect_dtype=expect_dtype, expect_ndim=expect_ndim) as reader:
        return reader.read()


def write_npy(path: Path | str, array: np.ndarray) -> None:
    """Write a whole array as ``.npy`` through the single write path, fsynced."""
    arr = np.ascontiguousarray(array)
    with NpyWriter(path, arr.dtype, arr.shape[1:], nrows=arr.shape[0]) as writer:
        writer.append(arr)
