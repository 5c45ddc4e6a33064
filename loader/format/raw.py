"""The raw dataset: what ``generate`` and ``import`` write and ``prepare`` reads.

A directory (see docs/FORMAT.md, "Raw dataset"):

- ``raw.json``: header (format tag, version, sizes, dtypes, provenance)
- ``edge_src.npy``, ``edge_dst.npy``: int64 (E,), edge ``src -> dst`` (messages flow src to dst)
- ``features.npy``: (N, D) float32 or float16
- ``labels.npy``: int64 (N,), ``-1`` marks an unlabeled node
- ``train_idx.npy``, ``val_idx.npy``, ``test_idx.npy``: int64 node ids (all three or none)
- a link dataset (``task: "link"``) also: its positives and evaluation negatives (``loader.format.link``)
"""

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from loader.format.fileio import write_all
from loader.format.link import RAW_LINK_FILES, TASKS, LinkSplit, link_file_problems
from loader.format.npyio import NpyReader, NpyWriter, read_npy, rows_per_chunk, write_npy
from proto.atomic import atomic_directory, io_error
from proto.errors import UserError
from proto.progress import Progress

__all__ = [
    "RAW_FORMAT", "RAW_VERSION", "FEATURE_DTYPES", "SPLIT_NAMES", "RawHeader", "RawDataset",
    "RawDatasetWriter", "open_raw", "validate_raw", "iter_edge_chunks", "read_split_ids",
]

RAW_FORMAT = "megabatch-raw"
RAW_VERSION = 1
FEATURE_DTYPES = ("float32", "float16")
SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class RawHeader:
    """Contents of ``raw.json``.

    num_nodes: N; num_edges: E (directed edges as stored); feat_dim: D;
    feat_dtype: ``float32`` or ``float16``; num_classes: labels lie in ``[0, C)`` or are -1;
    has_split: whether split id files exist; source: free-form provenance (generator
    parameters, importer and input path), copied into the prepared manifest.
    link: the edge split of a link-prediction dataset (``task: "link"``); None (the default,
    no ``task`` key written) for node classification.
    """

    num_nodes: int
    num_edges: int
    feat_dim: int
    feat_dtype: str
    num_classes: int
    has_split: bool
    source: dict[str, Any] = field(default_factory=dict)
    link: LinkSplit | None = None

    @property
    def task(self) -> str:
        """``"link"`` for a link-prediction dataset, else ``"node"``."""
        return "node" if self.link is None else "link"

    def __post_init__(self) -> None:
        for name in ("num_nodes", "num_edges", "feat_dim", "num_classes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"raw.json: {name} must be a non-negative integer, got {value!r}")
        if self.num_nodes == 0:
            raise UserError("raw.json: num_nodes must be positive")
        if self.feat_dim == 0:
            raise UserError("raw.json: feat_dim must be positive")
        if self.num_classes < 1:
            raise UserError("raw.json: num_classes must be at least 1")
        if self.feat_dtype not in FEATURE_DTYPES:
            raise UserError(f"raw.json: feat_dtype must be one of {FEATURE_DTYPES}, got {self.feat_dtype!r}")

    def to_json(self) -> dict[str, Any]:
        data = {"format": RAW_FORMAT, "version": RAW_VERSION, "num_nodes": self.num_nodes,
                "num_edges": self.num_edges, "feat_dim": self.feat_dim, "feat_dtype": self.feat_dtype,
                "num_classes": self.num_classes, "has_split": self.has_split, "source": self.source}
        if self.link is not None:  # a node dataset's header stays exactly what it was before link datasets
            data.update(task="link", link=self.link.to_json())
        return data

    @classmethod
    def from_json(cls, data: Any, path: Path) -> "RawHeader":
        if not isinstance(data, dict) or data.get("format") != RAW_FORMAT:
            raise UserError(f"{path}: not a megabatch raw dataset header (format != {RAW_FORMAT!r})")
        if data.get("version") != RAW_VERSION:
            raise UserError(f"{path}: raw format version {data.get('version')!r} is not supported "
                            f"(this tool reads version {RAW_VERSION})")
        task = data.get("task", "node")
        if task not in TASKS:
            raise UserError(f"{path}: task {task!r} is not supported (this tool reads {', '.join(TASKS)})")
        try:
            link = LinkSplit.from_json(data["link"]) if task == "link" else None
            return cls(num_nodes=data["num_nodes"], num_edges=data["num_edges"], feat_dim=data["feat_dim"],
                       feat_dtype=data["feat_dtype"], num_classes=data["num_classes"],
                       has_split=bool(data["has_split"]), source=dict(data.get("source") or {}), link=link)
        except KeyError as err:
            raise UserError(f"{path}: missing field {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            raise UserError(f"{path}: malformed field ({err})") from None


@dataclass(frozen=True)
class RawDataset:
    """A raw dataset directory with its parsed header; paths resolved once."""

    path: Path
    header: RawHeader

    @property
    def edge_src(self) -> Path:
        return self.path / "edge_src.npy"

    @property
    def edge_dst(self) -> Path:
        return self.path / "edge_dst.npy"

    @property
    def features(self) -> Path:
        return self.path / "features.npy"

    @property
    def labels(self) -> Path:
        return self.path / "labels.npy"

    def split(self, name: str) -> Path:
        return self.path / f"{name}_idx.npy"

    def link_file(self, name: str) -> Path:
        """Path of link file ``name`` (a key of ``RAW_LINK_FILES``)."""
        return self.path / RAW_LINK_FILES[name]


def open_raw(path: Path | str) -> RawDataset:
    """Open and parse a raw dataset header; file contents are checked by ``validate_raw``."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"{root}: not a directory (expected a raw dataset from 'generate' or 'import')")
    header_path = root / "raw.json"
    try:
        data = json.loads(header_path.read_text())
    except FileNotFoundError:
        raise UserError(f"{root}: no raw.json; is this a raw dataset from 'generate' or 'import'?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{header_path}: corrupt JSON ({err})") from None
    return RawDataset(root.resolve(), RawHeader.from_json(data, header_path))


def iter_edge_chunks(raw: RawDataset, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(src, dst)`` int64 chunks of at most ``rows`` edges, in file order."""
    with NpyReader(raw.edge_src, expect_dtype=np.int64, expect_ndim=1) as src, \
            NpyReader(raw.edge_dst, expect_dtype=np.int64, expect_ndim=1) as dst:
        for start in range(0, src.nrows, max(1, rows)):
            yield src.read(start, start + rows), dst.read(start, start + rows)


def validate_raw(raw: RawDataset, chunk_bytes: int, *, progress: bool = True) -> None:
    """Check every file against the header in bounded memory; raise UserError on the first problem.

    Checks: shapes and dtypes, edge endpoints in ``[0, N)``, finite features, labels in
    ``[-1, C)``, split ids in range, unique within a split and disjoint across splits; of a link
    dataset, the link files' shapes and ids (``link_file_problems``).
    Each file is checked in its own function so its chunks are freed before the next starts.
    """
    for path in (raw.edge_src, raw.edge_dst):
        _check_edge_file(path, raw.header, chunk_bytes, progress)
    _check_features(raw, chunk_bytes, progress)
    _check_labels(raw, chunk_bytes)
    if raw.header.has_split:
        _check_splits(raw)
    if raw.header.link is not None:
        problems = link_file_problems(raw.link_file, raw.header.num_nodes, raw.header.link, chunk_bytes)
        if problems:
            raise UserError(f"{raw.path}: {problems[0]}")


def _check_edge_file(path: Path, head: RawHeader, chunk_bytes: int, progress: bool) -> None:
    n = head.num_nodes
    with NpyReader(path, expect_dtype=np.int64, expect_ndim=1) as reader:
        if reader.nrows != head.num_edges:
            raise UserError(f"{path}: {reader.nrows} edges, raw.json says {head.num_edges}")
        with Progress(f"check {path.name}", reader.nrows, "edges", enabled=progress) as bar:
            for start, ids in reader.chunks(rows_per_chunk(8, chunk_bytes)):
                if ids.size and (ids.min() < 0 or ids.max() >= n):
                    bad = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
                    raise UserError(f"{path}: edge {start + bad} has endpoint {int(ids[bad])}, outside [0, {n})")
                bar.update(len(ids))
                del ids  # so the next chunk is not read while this one is alive


def _check_features(raw: RawDataset, chunk_bytes: int, progress: bool) -> None:
    head = raw.header
    with NpyReader(raw.features, expect_dtype=head.feat_dtype, expect_ndim=2) as feats:
        if feats.shape != (head.num_nodes, head.feat_dim):
            raise UserError(f"{raw.features}: shape {feats.shape}, raw.json says ({head.num_nodes}, {head.feat_dim})")
        with Progress("check features", head.num_nodes, "rows", enabled=progress) as bar:
            # a chunk plus its boolean isfinite mask (itemsize 1 per value)
            for start, rows in feats.chunks(rows_per_chunk(feats.row_bytes + head.feat_dim, chunk_bytes)):
                finite = np.isfinite(rows).all(axis=1)
                if not finite.all():
                    bad = int(np.flatnonzero(~finite)[0])
                    raise UserError(f"{raw.features}: row {start + bad} has NaN or infinite values")
                bar.update(len(rows))
                del rows, finite


def _check_labels(raw: RawDataset, chunk_bytes: int) -> None:
    head = raw.header
    with NpyReader(raw.labels, expect_ndim=1) as reader:
        if reader.dtype.kind not in "iu":
            raise UserError(f"{raw.labels}: dtype {reader.dtype}, expected an integer type")
        if reader.nrows != head.num_nodes:
            raise UserError(f"{raw.labels}: {reader.nrows} labels for {head.num_nodes} nodes")
        for start, labels in reader.chunks(rows_per_chunk(10, chunk_bytes)):
            bad_mask = (labels < -1) | (labels >= head.num_classes)
            if bad_mask.any():
                bad = int(np.flatnonzero(bad_mask)[0])
                raise UserError(f"{raw.labels}: label {int(labels[bad])} at node {start + bad} is outside "
                                f"[-1, {head.num_classes})")


def _check_splits(raw: RawDataset) -> None:
    n = raw.header.num_nodes
    seen = np.zeros(n, dtype=np.uint8)
    labels = read_npy(raw.labels)
    for name in SPLIT_NAMES:
        ids = read_split_ids(raw.split(name))
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise UserError(f"{raw.split(name)}: node ids must lie in [0, {n})")
        if np.unique(ids).size != ids.size:
            raise UserError(f"{raw.split(name)}: contains duplicate node ids")
        if seen[ids].any():
            raise UserError(f"{raw.split(name)}: overlaps an earlier split; splits must be disjoint")
        if (labels[ids] < 0).any():
            raise UserError(f"{raw.split(name)}: node {int(ids[labels[ids] < 0][0])} is unlabeled (label -1)")
        seen[ids] = 1


def read_split_ids(path: Path) -> np.ndarray:
    """A split file's node ids as int64 (any integer dtype accepted)."""
    with NpyReader(path, expect_ndim=1) as reader:
        if reader.dtype.kind not in "iu":
            raise UserError(f"{path}: dtype {reader.dtype}, expected integer node ids")
        return reader.read().astype(np.int64, copy=False)


class RawDatasetWriter:
    """Write a raw dataset atomically: build in a temporary directory, rename on ``close``.

    Usage::

        with RawDatasetWriter(out, num_nodes=N, feat_dim=D, num_classes=C) as w:
            w.append_edges(src, dst)        # any number of times
            w.append_features(rows)         # exactly N rows in total, in node order
            w.write_labels(labels)
            w.write_split(train, val, test) # optional

    ``scratch`` is a directory inside the temporary output for intermediate files; it is
    removed before publishing.
    """

    def __init__(self, out: Path | str, *, num_nodes: int, feat_dim: int, num_classes: int,
                 feat_dtype: str = "float32", source: dict[str, Any] | None = None) -> None:
        self.out = Path(out)
        self.num_nodes = int(num_nodes)
        self.feat_dim = int(feat_dim)
        self.num_classes = int(num_classes)
        self.feat_dtype = feat_dtype
        self.source = dict(source or {})
        RawHeader(self.num_nodes, 0, self.feat_dim, feat_dtype, self.num_classes, False, self.source)
        self._context = atomic_directory(self.out)
        self.tmp = self._context.__enter__()
        self._writers: list[NpyWriter] = []
        try:
            self.scratch = self.tmp / "scratch"
            self.scratch.mkdir()
            self._src = self._open(NpyWriter(self.tmp / "edge_src.npy", np.int64))
            self._dst = self._open(NpyWriter(self.tmp / "edge_dst.npy", np.int64))
            self._features = self._open(NpyWriter(self.tmp / "features.npy", feat_dtype, (self.feat_dim,),
                                                  nrows=self.num_nodes))
        except OSError as err:
            self.abort(err)
            raise io_error(err, f"writing {self.out}") from err
        self._has_labels = False
        self._has_split = False
        self._link: LinkSplit | None = None

    def _open(self, writer: NpyWriter) -> NpyWriter:
        self._writers.append(writer)
        return writer

    def append_edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        if len(src) != len(dst):
            raise ValueError("src and dst lengths differ")
        self._src.append(np.asarray(src, dtype=np.int64))
        self._dst.append(np.asarray(dst, dtype=np.int64))

    def replace_edges(self, src_path: Path, dst_path: Path) -> None:
        """Use finished edge files (for example the output of an external sort) instead."""
        self._src.abort()
        self._dst.abort()
        os.replace(src_path, self.tmp / "edge_src.npy")
        os.replace(dst_path, self.tmp / "edge_dst.npy")

    @property
    def edge_paths(self) -> tuple[Path, Path]:
        """Paths of the edge files being written (valid to read after ``finish_edges``)."""
        return self.tmp / "edge_src.npy", self.tmp / "edge_dst.npy"

    def finish_edges(self) -> None:
        """Close the edge files so they can be read back (for dedup or symmetrization)."""
        self._src.close()
        self._dst.close()

    def append_features(self, rows: np.ndarray) -> None:
        self._features.append(rows)

    def write_labels(self, labels: np.ndarray) -> None:
        write_npy(self.tmp / "labels.npy", np.asarray(labels, dtype=np.int64))
        self._has_labels = True

    def write_split(self, train: np.ndarray, val: np.ndarray, test: np.ndarray) -> None:
        for name, ids in zip(SPLIT_NAMES, (train, val, test)):
            write_npy(self.tmp / f"{name}_idx.npy", np.asarray(ids, dtype=np.int64))
        self._has_split = True

    def set_link(self, link: LinkSplit) -> None:
        """Make this a link dataset: its link files (``RAW_LINK_FILES``) have been written into ``tmp``."""
        self._link = link

    def close(self) -> RawDataset:
        """Finish every file, write ``raw.json`` and publish the directory."""
        try:
            self._src.close()
            self._dst.close()
            self._features.close()
            if not self._has_labels:
                raise ValueError("labels were never written")
            with NpyReader(self.tmp / "edge_src.npy") as reader:
                num_edges = reader.nrows
            header = RawHeader(self.num_nodes, num_edges, self.feat_dim, self.feat_dtype, self.num_classes,
                               self._has_split, self.source, self._link)
            for leftover in self.scratch.iterdir():
                leftover.unlink()
            self.scratch.rmdir()
            fd = os.open(self.tmp / "raw.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_all(fd, (json.dumps(header.to_json(), indent=2) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as err:
            self.abort(err)
            raise io_error(err, f"writing {self.out}") from err
        except BaseException as err:
            self.abort(err)
            raise
        self._context.__exit__(None, None, None)
        return RawDataset(self.out.resolve(), header)

    def abort(self, err: BaseException | None = None) -> None:
        """Discard everything written so far."""
        for writer in self._writers:
            writer.abort()
        exc = err if err is not None else KeyboardInterrupt()
        # the caller raises its own error; cleanup must not replace it
        with contextlib.suppress(BaseException):
            self._context.__exit__(type(exc), exc, None)

    def __enter__(self) -> "RawDatasetWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
            return
        self.abort(exc)
        if isinstance(exc, OSError):
            raise io_error(exc, f"writing {self.out}") from exc
