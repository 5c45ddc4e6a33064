"""``megabatch import``: turn a graph in a common on-disk format into a raw dataset.

Formats (``fmt``): ``npz`` (gnn-benchmark ``.npz``), ``ogb`` (an OGB node-property-prediction
directory) and ``numpy`` (a directory of ``.npy`` files, PyG convention). Each reader streams
its input in chunks sized from ``memory_budget``; ``common.write_dataset`` validates every
chunk, applies ``ImportOptions`` (self-loops, symmetrization and deduplication through the
external sort, so they work out of core), for ``task="link"`` splits the pairs into train,
val and test with fixed evaluation negatives (``loader.offline.link_split``), and publishes the
result atomically: a failed import leaves no output directory. ``--task link`` makes its own seeded
split of any format's graph, but of an OGB link-property directory (``ogbl-*``), whose ``split/<name>/
{train,valid,test}.pt`` torch files ``loader.format.torch_archive`` reads without torch: its own split.
"""

import contextlib
from collections.abc import Callable
from pathlib import Path

from loader.format.raw import RawDataset
from loader.offline.importers.common import ImportReadRequest, ImportSource, write_dataset
from loader.offline.importers.npz import read_npz
from loader.offline.importers.numpy_dir import read_numpy_dir
from loader.offline.importers.ogb import read_ogb
from loader.offline.importers.options import ImportOptions
from proto.errors import UserError

__all__ = ["IMPORT_FORMATS", "ImportOptions", "import_dataset"]

_READERS: dict[str, Callable[[ImportReadRequest, contextlib.ExitStack], ImportSource]] = {
    "npz": read_npz,
    "ogb": read_ogb,
    "numpy": read_numpy_dir,
}

IMPORT_FORMATS = tuple(_READERS)
"""Accepted values of ``fmt``."""

_DEFAULT_OPTIONS = ImportOptions()


def import_dataset(src: Path | str, out: Path | str, *, fmt: str, options: ImportOptions = _DEFAULT_OPTIONS,
                   memory_budget: int = 1 << 30, progress: bool = True) -> RawDataset:
    """Import ``src`` in format ``fmt`` as a raw dataset at ``out`` (which must not exist).

    ``memory_budget`` bounds the bytes held per chunk (O(N) arrays such as labels and CSR row
    pointers come on top). Raises UserError, naming the file and the problem, on bad input.
    """
    if fmt not in _READERS:
        raise UserError(f"unknown import format {fmt!r}; choose one of {', '.join(IMPORT_FORMATS)}")
    if not isinstance(memory_budget, int) or memory_budget <= 0:
        raise UserError(f"memory budget must be a positive number of bytes, got {memory_budget!r}")
    src, out = Path(src), Path(out)
    if out.exists():
        raise UserError(f"output {out} already exists; choose a new path or remove it first")
    if not src.exists():
        raise UserError(f"{src}: no such file or directory")
    with contextlib.ExitStack() as stack:
        data = _READERS[fmt](ImportReadRequest(src, memory_budget, not options.force_split, progress, options.task),
                             stack)
        return write_dataset(data, out, fmt=fmt, src=src, options=options, memory_budget=memory_budget,
                             progress=progress)
