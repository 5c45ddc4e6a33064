"""Read the tensors of a ``torch.save`` file without torch (the loader never imports it): OGB's link splits.

``torch.save`` (since torch 1.6) writes a zip archive: ``<name>/data.pkl``, a pickle whose tensors are
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`` calls and whose storages are
persistent ids ``("storage", torch.<Type>Storage, key, location, numel)`` naming ``<name>/data/<key>``, the
storage's raw bytes (``<name>/byteorder`` says their byte order). ``read_tensors`` unpickles ``data.pkl``
with an unpickler that builds exactly those objects (a tensor becomes a numpy array, copied out of its
storage with the saved strides) and dicts, lists and tuples of them; any other class a pickle names (the
way a pickle runs code) is refused, so a hostile file cannot run anything. The legacy format of torch < 1.6
(no zip) is refused with the way out: load and save it again with a current torch.
"""

import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from proto.errors import UserError

__all__ = ["read_tensors", "STORAGE_DTYPES"]

STORAGE_DTYPES: dict[str, np.dtype] = {
    "LongStorage": np.dtype(np.int64), "IntStorage": np.dtype(np.int32), "ShortStorage": np.dtype(np.int16),
    "CharStorage": np.dtype(np.int8), "ByteStorage": np.dtype(np.uint8), "BoolStorage": np.dtype(np.bool_),
    "DoubleStorage": np.dtype(np.float64), "FloatStorage": np.dtype(np.float32), "HalfStorage": np.dtype(np.float16),
}
"""The storage types a tensor may have, and their numpy dtypes (little-endian unless ``byteorder`` says big)."""


class _StorageType:
    """What ``torch.<Type>Storage`` unpickles to: the dtype of the storages that name it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = STORAGE_DTYPES[name]


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    *_rest: Any) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2``: the tensor's elements, copied out with its strides (checked first)."""
    size, stride = tuple(int(v) for v in size), tuple(int(v) for v in stride)
    if len(size) != len(stride) or any(v < 0 for v in (*size, *stride)) or offset < 0:
        raise pickle.UnpicklingError(f"a tensor of size {size}, stride {stride}, offset {offset}")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if last >= len(storage):
        raise pickle.UnpicklingError(f"a tensor reaching element {last} of a storage of {len(storage)}")
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=[s * item for s in stride],
                                           writeable=False)
    return np.array(view)


class _Unpickler(pickle.Unpickler):
    """Builds tensors, their storages and plain containers; refuses every other class."""

    def __init__(self, file: Any, archive: zipfile.ZipFile, prefix: str, byteorder: str) -> None:
        super().__init__(file)
        self._archive, self._prefix, self._byteorder = archive, prefix, byteorder
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")):
            return _rebuild_tensor
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not a tensor, a storage or a dict")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"a persistent id {str(pid)[:60]} that is not a storage")
        _, kind, key, _location, numel = pid
        if key not in self._storages:
            try:
                raw = self._archive.read(f"{self._prefix}data/{key}")
            except KeyError:
                raise pickle.UnpicklingError(f"storage {key!r} is not in the archive") from None
            dtype = kind.dtype.newbyteorder("<" if self._byteorder == "little" else ">")
            if len(raw) < int(numel) * dtype.itemsize:
                raise pickle.UnpicklingError(f"storage {key!r} holds {len(raw)} bytes, {numel} elements expected")
            self._storages[key] = np.frombuffer(raw, dtype=dtype, count=int(numel)).astype(kind.dtype, copy=False)
        return self._storages[key]


def read_tensors(path: Path) -> Any:
    """The object a ``torch.save`` zip file holds, tensors as numpy arrays; UserError (one line) for a file that
    is not one, holds anything else than tensors and containers, or is damaged."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as err:
        raise UserError(f"{path}: not a torch.save zip archive ({err}); a file saved by torch < 1.6 must be loaded "
                        f"and saved again with a current torch") from None
    with archive:
        pickles = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
        if len(pickles) != 1:
            raise UserError(f"{path}: a zip archive without one <name>/data.pkl, not a torch.save file")
        prefix = pickles[0][:-len("data.pkl")]
        try:
            byteorder = archive.read(f"{prefix}byteorder").decode().strip()
        except KeyError:
            byteorder = "little"  # torch writes it since 1.12; older archives are little-endian
        try:
            with archive.open(pickles[0]) as data:
                return _Unpickler(data, archive, prefix, byteorder).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, zipfile.BadZipFile) as err:
            raise UserError(f"{path}: cannot read its tensors: {err}") from None
