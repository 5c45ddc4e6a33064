"""Import a gnn-benchmark ``.npz`` file (the layout of shchur/gnn-benchmark and PyG's ``read_npz``).

Keys: CSR adjacency ``adj_data, adj_indices, adj_indptr, adj_shape`` (edge ``i -> j`` for
``A[i, j] != 0``); features as CSR ``attr_data, attr_indices, attr_indptr, attr_shape`` or
dense ``attr_matrix``; ``labels`` (int, -1 unlabeled; a one-hot matrix is converted);
optional ``idx_train, idx_val, idx_test``.

The large members (adjacency and feature entries) are streamed out of the zip front to back,
because a compressed member cannot be read at an offset; only the O(N) arrays (indptr,
labels, split) are loaded whole.
"""

import contextlib
import io
import zipfile
import zlib
from collections.abc import Generator
from pathlib import Path
from typing import cast

import numpy as np

from loader.format.npyio import rows_per_chunk
from loader.offline.importers.common import ImportReadRequest, ImportSource, normalize_labels, one_line
from proto.errors import UserError

__all__ = ["read_npz"]

# per stored entry: index + value as read (<= 16), their positions, row ids and casts
_BYTES_PER_ENTRY = 64
_ARCHIVE_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error)


class _Member:
    """One array inside an ``.npz`` archive, read sequentially by rows."""

    def __init__(self, archive: zipfile.ZipFile, path: Path, key: str) -> None:
        self.origin = f"{path} [{key}]"
        try:
            # zipfile's member stream is a BufferedIOBase (typeshed says only IO[bytes])
            self._fp = cast(io.BufferedIOBase, archive.open(key + ".npy"))
        except KeyError:
            raise UserError(f"{path}: missing key {key!r}") from None
        except _ARCHIVE_ERRORS as err:
            raise UserError(f"{self.origin}: corrupt archive member ({one_line(err)})") from None
        try:
            version = np.lib.format.read_magic(self._fp)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(self._fp)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(self._fp)
            else:
                raise UserError(f"{self.origin}: unsupported .npy version {version}")
            if dtype.hasobject:
                raise UserError(f"{self.origin}: object arrays are not supported (no pickles)")
            if fortran and len(shape) > 1:
                raise UserError(f"{self.origin}: Fortran-ordered arrays are not supported; save with C order")
        except UserError:
            self._fp.close()
            raise
        except _ARCHIVE_ERRORS as err:
            self._fp.close()
            raise UserError(f"{self.origin}: corrupt array header ({one_line(err)})") from None
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype: np.dtype = dtype
        self._rows_left = shape[0] if shape else 1

    def read(self, rows: int) -> np.ndarray:
        """The next ``rows`` rows (fewer at the end)."""
        rows = max(0, min(rows, self._rows_left))
        out = np.empty((rows, *self.shape[1:]), dtype=self.dtype)
        view = out.reshape(-1).view(np.uint8).data
        done = 0
        try:
            while done < len(view):
                got = self._fp.readinto(view[done:])
                if not got:
                    raise UserError(f"{self.origin}: truncated array data")
                done += got
        except _ARCHIVE_ERRORS as err:
            raise UserError(f"{self.origin}: corrupt array data ({one_line(err)})") from None
        self._rows_left -= rows
        return out

    def finish(self) -> None:
        """Read to the end of the member, which makes zipfile verify its CRC."""
        try:
            extra = self._fp.read(1)
        except _ARCHIVE_ERRORS as err:
            raise UserError(f"{self.origin}: corrupt array data ({one_line(err)})") from None
        if self._rows_left or extra:
            raise UserError(f"{self.origin}: array data does not match its header")

    def close(self) -> None:
        self._fp.close()


def _check_columns(columns: np.ndarray, limit: int, origin: str, first_entry: int) -> None:
    """Column indices of a CSR member must lie in ``[0, limit)``; name the first that does not."""
    bad = (columns < 0) | (columns >= limit)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise UserError(f"{origin}: entry {first_entry + at} is column {int(columns[at])}, outside [0, {limit})")


def _load(npz: np.lib.npyio.NpzFile, path: Path, key: str) -> np.ndarray:
    """A small member, whole."""
    if key not in npz.files:
        raise UserError(f"{path}: missing key {key!r}")
    try:
        return np.asarray(npz[key])
    except _ARCHIVE_ERRORS as err:
        raise UserError(f"{path} [{key}]: cannot read ({one_line(err)})"
                        ) from None


def _shape2(npz: np.lib.npyio.NpzFile, path: Path, key: str) -> tuple[int, int]:
    shape = _load(npz, path, key)
    if shape.shape != (2,) or shape.dtype.kind not in "iu" or shape.min() < 0:
        raise UserError(f"{path} [{key}]: expected two non-negative integers, got {shape.tolist()!r}")
    return int(shape[0]), int(shape[1])


def _indptr(npz: np.lib.npyio.NpzFile, path: Path, key: str, rows: int, entries: int) -> np.ndarray:
    indptr = _load(npz, path, key)
    if indptr.shape != (rows + 1,) or indptr.dtype.kind not in "iu":
        raise UserError(f"{path} [{key}]: expected {rows + 1} integers, got {indptr.dtype} {indptr.shape}")
    indptr = indptr.astype(np.int64)
    if indptr[0] != 0 or indptr[-1] != entries or (np.diff(indptr) < 0).any():
        raise UserError(f"{path} [{key}]: not a valid CSR row pointer (must rise from 0 to {entries})")
    return indptr


def _open_entries(stack: contextlib.ExitStack, archive: zipfile.ZipFile, path: Path, prefix: str
                  ) -> tuple[_Member, _Member]:
    """The ``indices`` and ``data`` members of a CSR matrix, checked for matching lengths."""
    indices = stack.enter_context(contextlib.closing(_Member(archive, path, f"{prefix}_indices")))
    data = stack.enter_context(contextlib.closing(_Member(archive, path, f"{prefix}_data")))
    if len(indices.shape) != 1 or indices.dtype.kind not in "iu":
        raise UserError(f"{indices.origin}: expected a 1-D integer array, got {indices.dtype} {indices.shape}")
    if data.shape != indices.shape or data.dtype.kind not in "biuf":
        raise UserError(f"{data.origin}: expected {indices.shape[0]} numbers, got {data.dtype} {data.shape}")
    return indices, data


def _entry_count(archive: zipfile.ZipFile, path: Path, prefix: str) -> int:
    with contextlib.ExitStack() as stack:
        return _open_entries(stack, archive, path, prefix)[0].shape[0]


def read_npz(req: ImportReadRequest, stack: contextlib.ExitStack) -> ImportSource:
    """Open a gnn-benchmark ``.npz`` as an ``ImportSource`` (closed with ``stack``)."""
    path = req.src
    if not path.is_file():
        raise UserError(f"{path}: not a file (expected a gnn-benchmark .npz)")
    try:
        npz = np.load(path, allow_pickle=False)
    except _ARCHIVE_ERRORS as err:
        raise UserError(f"{path}: not a readable .npz archive ({one_line(err)})") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise UserError(f"{path}: a single .npy array, not an .npz archive")
    stack.callback(npz.close)
    archive = npz.zip
    if archive is None:
        raise UserError(f"{path}: not a readable .npz archive")

    n, n_cols = _shape2(npz, path, "adj_shape")
    if n != n_cols or n == 0:
        raise UserError(f"{path} [adj_shape]: adjacency must be square and non-empty, got ({n}, {n_cols})")
    num_edges = _entry_count(archive, path, "adj")
    adj_indptr = _indptr(npz, path, "adj_indptr", n, num_edges)
    labels = normalize_labels(_load(npz, path, "labels"), f"{path} [labels]")
    if len(labels) != n:
        raise UserError(f"{path} [labels]: {len(labels)} labels, but adj_shape says {n} nodes")

    if any(f"attr_{part}" in npz.files for part in ("data", "indices", "indptr", "shape")):
        rows, dim = _shape2(npz, path, "attr_shape")
        attr_indptr = _indptr(npz, path, "attr_indptr", rows, _entry_count(archive, path, "attr"))
        feature_origin = f"{path} [attr_data]"
    elif "attr_matrix" in npz.files:
        with contextlib.closing(_Member(archive, path, "attr_matrix")) as member:
            if len(member.shape) != 2 or member.dtype.kind not in "biuf":
                raise UserError(f"{member.origin}: expected a 2-D numeric array, got {member.dtype} "
                                f"{member.shape}")
            rows, dim = member.shape
        attr_indptr = None
        feature_origin = f"{path} [attr_matrix]"
    else:
        raise UserError(f"{path}: no node features (neither CSR 'attr_data', 'attr_indices', 'attr_indptr', "
                        "'attr_shape' nor dense 'attr_matrix')")
    if rows != n:
        raise UserError(f"{feature_origin}: {rows} feature rows, but adj_shape says {n} nodes")
    if dim == 0:
        raise UserError(f"{feature_origin}: features have zero columns")

    split_keys = ("idx_train", "idx_val", "idx_test")
    present = [key for key in split_keys if key in npz.files]
    if present and len(present) != 3:
        raise UserError(f"{path}: has {', '.join(present)} but not "
                        f"{', '.join(k for k in split_keys if k not in present)}; a split needs all three")
    split = None
    if present and req.want_split:
        train, val, test = (_load(npz, path, key) for key in split_keys)
        split = (train, val, test)

    edge_rows = rows_per_chunk(_BYTES_PER_ENTRY, req.memory_budget)

    def edges() -> Generator[tuple[np.ndarray, np.ndarray], None, None]:
        with contextlib.ExitStack() as members:
            indices, data = _open_entries(members, archive, path, "adj")
            for start in range(0, num_edges, edge_rows):
                dst = indices.read(edge_rows).astype(np.int64)
                weight = data.read(edge_rows)
                _check_columns(dst, n, indices.origin, start)
                src = np.searchsorted(adj_indptr, np.arange(start, start + len(dst)), side="right") - 1
                keep = weight != 0
                yield src[keep], dst[keep]
            indices.finish()
            data.finish()

    def features() -> Generator[np.ndarray, None, None]:
        with contextlib.ExitStack() as members:
            if attr_indptr is None:
                matrix = members.enter_context(contextlib.closing(_Member(archive, path, "attr_matrix")))
                step = rows_per_chunk(dim * (2 * matrix.dtype.itemsize + 8), req.memory_budget)
                for _start in range(0, n, step):
                    yield matrix.read(step)
                matrix.finish()
                return
            indices, data = _open_entries(members, archive, path, "attr")
            dense_dtype = np.result_type(data.dtype, np.float32)
            step = rows_per_chunk(dim * (dense_dtype.itemsize + 8 + _BYTES_PER_ENTRY // 4), req.memory_budget)
            for start in range(0, n, step):
                stop = min(n, start + step)
                count = int(attr_indptr[stop] - attr_indptr[start])
                cols = indices.read(count).astype(np.int64)
                values = data.read(count)
                _check_columns(cols, dim, indices.origin, int(attr_indptr[start]))
                row_of = np.repeat(np.arange(stop - start, dtype=np.int64), np.diff(attr_indptr[start:stop + 1]))
                dense = np.zeros((stop - start, dim), dtype=dense_dtype)
                # add, not assign: duplicate (row, column) entries of a CSR matrix sum
                np.add.at(dense.reshape(-1), row_of * dim + cols, values)
                yield dense
            indices.finish()
            data.finish()

    return ImportSource(num_nodes=n, feat_dim=dim, labels=labels, split=split,
                        split_origins=(f"{path} [idx_train]", f"{path} [idx_val]", f"{path} [idx_test]"),
                        edges=edges, edge_origin=f"{path} [adj_indices]", num_edges=num_edges,
                        features=features, feature_origin=feature_origin)
