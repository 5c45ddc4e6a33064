"""The prepared (partitioned) dataset: manifest schema, file names, and a reader.

The format is specified in docs/FORMAT.md. Readers accept any 1.x manifest, refuse other
major versions, and keep unknown manifest keys (``Manifest.extra``) rather than dropping them.
A link-prediction dataset (``task: "link"``, format 1.3) adds the ``link`` table and the files of
``LINK_FILES``; a node-classification dataset is written as 1.2, exactly as before. A dataset of 8-bit feature
codes (``feat_dtype`` uint8, format 1.4) adds ``feature_range.npy`` (``CODEC_FILES``).
"""

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from loader.format.feature_codec import RANGE_FILE, FeatureCodec
from loader.format.fileio import file_xxh3
from loader.format.link import LINK_FILES, TASKS, LinkSplit
from loader.format.manifest_tables import EdgeCut, NeighborRankInfo, PartitionerInfo, SplitSizes, StaticCacheInfo
from loader.format.npyio import NpyReader
from loader.format.partition_table import FEATURE_ALIGNMENT, PARTITION_COLUMNS, PartitionTable
from proto.errors import UserError

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "FEATURE_ALIGNMENT", "FeatureDtype", "IndexDtype",
    "FileEntry", "Manifest", "Dataset", "open_dataset", "manifest_text", "manifest_checksum", "FILES", "CODEC_FILES",
    "CHECK_FILES", "STORED_DTYPES",
    "FEATURE_PAGES_1_1", "check_file_sizes", "LINK_FORMAT_VERSION", "CODES_FORMAT_VERSION",
    "LINK_FILES",
]

FORMAT_NAME = "megabatch-dataset"
FORMAT_VERSION = "1.2"
"""The version ``prepare`` writes for a node-classification dataset (and, with its major, what readers accept)."""
LINK_FORMAT_VERSION = "1.3"
CODES_FORMAT_VERSION = "1.4"
"""A dataset of 8-bit feature codes (``feat_dtype`` uint8 and ``feature_range.npy``), node or link task: a 1.3
reader refuses its dtype in one line rather than misread it."""
"""The version ``prepare`` writes for a link-prediction dataset: 1.2 plus the ``link`` table and files."""


FILES = {
    "indptr": "indptr.npy", "indices": "indices.npy", "features": "features.bin", "labels": "labels.npy",
    "new_to_orig": "new_to_orig.npy", "partitions": "partitions.npy", "train": "train_idx.npy",
    "val": "val_idx.npy", "test": "test_idx.npy", "static_nodes": "static_nodes.npy",
    "static_features": "static_features.npy", "static_indptr": "static_indptr.npy",
    "static_indices": "static_indices.npy", "neighbor_rank": "neighbor_rank.npy",
}
"""Logical name -> file name of every data file in a v1 dataset."""

CODEC_FILES = {"feature_range": RANGE_FILE}
"""Files a dataset has only with 8-bit feature codes (``feat_dtype`` uint8)."""
CHECK_FILES = {
    "partition_checksums": "partition_checksums.npy", "feature_blocks": "feature_blocks.npy",
    "index_pages": "index_pages.npy",
}
"""The read-check files of format 1.2 (``loader.format.read_checks``); a 1.0 dataset has none of them."""

FEATURE_PAGES_1_1 = "feature_pages.npy"
"""Format 1.1's feature checks: 4096-byte blocks, where 1.2's ``feature_blocks.npy`` has row-sized ones."""


class FeatureDtype(enum.Enum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    UINT8 = "uint8"
    """Per-column 8-bit codes (``loader.format.feature_codec``), with ``feature_range.npy``."""


STORED_DTYPES = tuple(dtype.value for dtype in FeatureDtype)
"""``prepare --feat-dtype`` values: how ``features.bin`` stores a row."""


class IndexDtype(enum.Enum):
    INT32 = "int32"
    INT64 = "int64"


@dataclass(frozen=True)
class FileEntry:
    """Size in bytes and xxh3-64 (hex) of one data file."""

    bytes: int
    xxh3_64: str


@dataclass(frozen=True)
class Manifest:
    """Parsed ``manifest.json``; see docs/FORMAT.md for each field."""

    version: str
    num_nodes: int
    num_edges: int
    num_partitions: int
    num_classes: int
    feat_dim: int
    feat_dtype: FeatureDtype
    index_dtype: IndexDtype
    feature_alignment: int
    partitioner: PartitionerInfo
    edge_cut: EdgeCut
    static_cache: StaticCacheInfo
    neighbor_rank: NeighborRankInfo
    splits: SplitSizes
    files: dict[str, FileEntry]
    created_by: dict[str, Any]
    source: dict[str, Any]
    feature_check_block: int | None = None
    """Bytes per checksum of ``feature_blocks.npy`` (format 1.2, ``features.check_block``); None before."""
    link: LinkSplit | None = None
    """The edge split of a link-prediction dataset (format 1.3, ``task: "link"``); None for node classification."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> str:
        """``"link"`` for a link-prediction dataset, else ``"node"``."""
        return "node" if self.link is None else "link"

    @property
    def row_bytes(self) -> int:
        """Bytes of a stored row (``features.bin``)."""
        return self.feat_dim * np.dtype(self.feat_dtype.value).itemsize

    @property
    def value_dtype(self) -> np.dtype:
        """The dtype a row's values have once read: the stored one, but float32 for 8-bit codes (what a batch's
        ``x`` carries)."""
        return np.dtype(np.float32 if self.feat_dtype is FeatureDtype.UINT8 else self.feat_dtype.value)

    @property
    def has_read_checks(self) -> bool:
        """Format 1.1 or later: every read-check file is listed (and checksummed) in ``files``."""
        return all(name in self.files for name in self.check_files)

    @property
    def check_files(self) -> tuple[str, ...]:
        """The read-check files this dataset's version has (1.1 names its feature table differently)."""
        if self.feature_check_block is None and FEATURE_PAGES_1_1 in self.files:
            return CHECK_FILES["partition_checksums"], FEATURE_PAGES_1_1, CHECK_FILES["index_pages"]
        return tuple(CHECK_FILES.values())

    @property
    def feature_check_file(self) -> str:
        """The file of ``features.bin``'s block checksums: ``feature_blocks.npy``, or 1.1's pages."""
        return CHECK_FILES["feature_blocks"] if self.feature_check_block is not None else FEATURE_PAGES_1_1

    @property
    def feature_check_bytes(self) -> int:
        """Bytes per checksum of ``features.bin`` (4096 in format 1.1)."""
        return self.feature_check_block or 4096

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.extra)
        data.update({
            "format": FORMAT_NAME, "version": self.version, "num_nodes": self.num_nodes,
            "num_edges": self.num_edges, "num_partitions": self.num_partitions, "num_classes": self.num_classes,
            "features": {"file": FILES["features"], "dim": self.feat_dim, "dtype": self.feat_dtype.value,
                         "alignment": self.feature_alignment,
                         **({} if self.feature_check_block is None else {"check_block": self.feature_check_block})},
            "index_dtype": self.index_dtype.value, "partitioner": self.partitioner.to_json(),
            "edge_cut": self.edge_cut.to_json(), "static_cache": self.static_cache.to_json(),
            "neighbor_rank": self.neighbor_rank.to_json(), "splits": self.splits.to_json(),
            "files": {name: {"bytes": e.bytes, "xxh3_64": e.xxh3_64} for name, e in sorted(self.files.items())},
            "created_by": self.created_by, "source": self.source,
        })
        if self.link is not None:  # absent from node datasets, so theirs stay byte-for-byte 1.2
            data.update(task="link", link=self.link.to_json())
        return data

    @classmethod
    def from_json(cls, data: Any, path: Path) -> "Manifest":
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise UserError(f"{path}: not a megabatch dataset manifest (format != {FORMAT_NAME!r})")
        version = str(data.get("version", ""))
        major = version.split(".")[0]
        if major != FORMAT_VERSION.split(".")[0]:
            raise UserError(f"{path}: dataset format version {version!r} is not supported "
                            f"(this megabatch reads {FORMAT_VERSION.split('.')[0]}.x)")
        known = {"format", "version", "num_nodes", "num_edges", "num_partitions", "num_classes", "features",
                 "index_dtype", "partitioner", "edge_cut", "static_cache", "neighbor_rank", "splits", "files",
                 "created_by", "source", "checksum", "task", "link"}
        task = data.get("task", "node")
        if task not in TASKS:
            raise UserError(f"{path}: task {task!r} is not supported (this megabatch reads {', '.join(TASKS)})")
        try:
            feats = data["features"]
            files = {str(k): FileEntry(int(v["bytes"]), str(v["xxh3_64"])) for k, v in data["files"].items()}
            manifest = cls(
                version=version, num_nodes=int(data["num_nodes"]), num_edges=int(data["num_edges"]),
                num_partitions=int(data["num_partitions"]), num_classes=int(data["num_classes"]),
                feat_dim=int(feats["dim"]), feat_dtype=FeatureDtype(feats["dtype"]),
                index_dtype=IndexDtype(data["index_dtype"]), feature_alignment=int(feats["alignment"]),
                partitioner=PartitionerInfo.from_json(data["partitioner"]),
                edge_cut=EdgeCut.from_json(data["edge_cut"]),
                static_cache=StaticCacheInfo.from_json(data["static_cache"]),
                neighbor_rank=NeighborRankInfo.from_json(data["neighbor_rank"]),
                splits=SplitSizes.from_json(data["splits"]), files=files, created_by=dict(data["created_by"]),
                source=dict(data.get("source") or {}),
                feature_check_block=None if feats.get("check_block") is None else int(feats["check_block"]),
                link=LinkSplit.from_json(data["link"]) if task == "link" else None,
                extra={k: v for k, v in data.items() if k not in known})
        except KeyError as err:
            raise UserError(f"{path}: missing field {err.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise UserError(f"{path}: malformed field ({err})") from None
        if manifest.feat_dtype is FeatureDtype.UINT8 and RANGE_FILE not in manifest.files:
            raise UserError(f"{path}: features of dtype uint8 need {RANGE_FILE} in files (the codes' column ranges)")
        block = manifest.feature_check_block
        if block is not None and (block < 512 or block > 4096 or block & (block - 1)):
            raise UserError(f"{path}: features.check_block must be a power of two in [512, 4096], got {block}")
        for name in ("num_nodes", "num_partitions", "num_classes", "feat_dim", "feature_alignment"):
            if getattr(manifest, name) <= 0:
                raise UserError(f"{path}: {name} must be positive, got {getattr(manifest, name)}")
        if manifest.num_edges < 0:
            raise UserError(f"{path}: num_edges must be non-negative")
        return manifest


def manifest_checksum(data: dict[str, Any]) -> str:
    """xxh3-64 of the canonical JSON of ``data`` without its ``checksum`` key."""
    body = {k: v for k, v in data.items() if k != "checksum"}
    return xxhash.xxh3_64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def manifest_text(data: dict[str, Any]) -> str:
    """The exact bytes written to manifest.json (sorted keys, indent 2, checksum included)."""
    full = dict(data)
    full["checksum"] = manifest_checksum(data)
    return json.dumps(full, sort_keys=True, indent=2) + "\n"


@dataclass(frozen=True)
class Dataset:
    """An opened prepared dataset: its manifest and resolved file paths."""

    path: Path
    manifest: Manifest

    def file(self, name: str) -> Path:
        """Path of logical file ``name`` (a key of ``FILES``, of ``CODEC_FILES`` or of ``LINK_FILES`` in a link
        dataset)."""
        if name in FILES:
            return self.path / FILES[name]
        return self.path / (CODEC_FILES[name] if name in CODEC_FILES else LINK_FILES[name])

    def feature_codec(self) -> FeatureCodec | None:
        """The 8-bit codes' column ranges of a ``uint8`` dataset (checked against the manifest), else None."""
        if self.manifest.feat_dtype is not FeatureDtype.UINT8:
            return None
        table = self.read("feature_range", np.float32, 2)
        try:
            codec = FeatureCodec.from_table(table)
        except ValueError as err:
            raise UserError(f"{self.file('feature_range')}: {err}; run 'megabatch verify'") from None
        if codec.dim != self.manifest.feat_dim:
            raise UserError(f"{self.file('feature_range')}: {codec.dim} columns, the manifest says "
                            f"{self.manifest.feat_dim}; run 'megabatch verify'")
        return codec

    def partitions(self) -> PartitionTable:
        """``partitions.npy``, by column name."""
        table = self.read("partitions", np.int64, 2)
        if table.shape[1:] != (len(PARTITION_COLUMNS),):
            raise UserError(f"{self.file('partitions')}: shape {table.shape}, expected (P, {len(PARTITION_COLUMNS)}); "
                            f"run 'megabatch verify'")
        return PartitionTable(table)

    def read(self, name: str, dtype: npt.DTypeLike | None = None, ndim: int | None = None) -> np.ndarray:
        """A whole (per-node or smaller) array file, checked against ``dtype``/``ndim`` when given, and its
        bytes against the manifest's xxh3-64 (UserError naming the file when they differ).

        Files read whole are served from RAM afterwards (labels travel in every batch, ``indptr`` decides
        every neighbour list), so this is their read check: one hash at load, ~10 GB/s."""
        path = self.file(name)
        with NpyReader(path, expect_dtype=dtype, expect_ndim=ndim) as reader:
            array = reader.read()
            header_bytes = reader.data_offset
        entry = self.manifest.files.get(path.name)
        if entry is not None:
            digest = xxhash.xxh3_64()
            with open(path, "rb") as handle:
                digest.update(handle.read(header_bytes))
            # flat first: memoryview refuses to cast an empty array of two or more dimensions
            digest.update(np.ascontiguousarray(array).reshape(-1).data.cast("B"))
            if digest.hexdigest() != entry.xxh3_64:
                raise self._mismatch(path)
        return array

    def check_whole(self, name: str) -> None:
        """``name``'s bytes against the manifest's xxh3-64, streamed (bounded memory): for a file the daemon
        maps at start (``indptr.npy``, whose every entry decides a neighbour list) rather than reads whole."""
        path = self.file(name)
        entry = self.manifest.files.get(path.name)
        if entry is not None and file_xxh3(path) != entry.xxh3_64:
            raise self._mismatch(path)

    def _mismatch(self, path: Path) -> UserError:
        return UserError(f"{path}: its bytes do not match the manifest's xxh3_64 (the file changed or the disk "
                         f"returned corrupt data); nothing was served from it; run 'megabatch verify {self.path}'")


def check_file_sizes(dataset: Dataset) -> None:
    """UserError naming the first data file that is missing or whose size differs from the manifest's.

    Seconds where ``megabatch verify`` takes minutes: it catches truncated and replaced files at
    start instead of mid-epoch (what changes content but not size is caught by the read checks).
    """
    for name, entry in sorted(dataset.manifest.files.items()):
        path = dataset.path / name
        try:
            size = path.stat().st_size
        except OSError as err:
            raise UserError(f"{path}: {err.strerror}; the dataset is incomplete (prepare it again)") from None
        if size != entry.bytes:
            raise UserError(f"{path}: {size} bytes, the manifest says {entry.bytes} (truncated or replaced); "
                            f"run 'megabatch verify {dataset.path}'")


def open_dataset(path: Path | str) -> Dataset:
    """Open a prepared dataset directory, checking the manifest's format, version and checksum."""
    root = Path(path)
    manifest_path = root / "manifest.json"
    if not root.is_dir():
        raise UserError(f"{root}: not a directory (expected a dataset from 'megabatch prepare')")
    try:
        text = manifest_path.read_text()
        data = json.loads(text)
    except FileNotFoundError:
        raise UserError(f"{root}: no manifest.json; is this a dataset from 'megabatch prepare'?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{manifest_path}: corrupt JSON ({err})") from None
    if not isinstance(data, dict):
        raise UserError(f"{manifest_path}: not a JSON object")
    manifest = Manifest.from_json(data, manifest_path)
    if data.get("checksum") != manifest_checksum(data):
        raise UserError(f"{manifest_path}: checksum mismatch (the manifest was modified or corrupted)")
    return Dataset(root.resolve(), manifest)
