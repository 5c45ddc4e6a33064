"""The aggregation cache's files in a prepared dataset (docs/FORMAT.md, "Aggregation cache"): names, the
manifest section, the reader, and the cost model that says whether the cache pays. ``megabatch aggregate``
(``loader.offline.aggregation``) writes them."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from loader.format.dataset import Dataset
from loader.format.feature_layout import read_feature_layout
from proto.errors import UserError

__all__ = ["SECTION", "AggregationCache", "aggregation_files", "aggregation_bytes", "node_row_starts",
           "dataset_cache", "read_aggregates"]

SECTION = "aggregation_cache"
"""The manifest's section naming the dataset's aggregation cache (absent: none)."""


def aggregation_files(kind: str) -> tuple[str, str]:
    """(data file, block checks file) of the cache of ``kind``."""
    return f"aggregates-{kind}.bin", f"aggregate-blocks-{kind}.npy"


@dataclass(frozen=True)
class AggregationCache:
    """What manifest.json's ``aggregation_cache`` section says: the aggregator, its files, the check block."""

    kind: str
    file: str
    checks: str
    check_block: int

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "file": self.file, "checks": self.checks, "check_block": self.check_block}


def aggregation_bytes(nodes_per_hop: list[int], row_bytes: int) -> tuple[int, int]:
    """(feature bytes a batch of these sizes fetches without the cache, with it): without, one row for every
    node of hops 0..L; with, a row of x and one of x_agg for every node of hops 0..L-1 and nothing of hop L.
    The cache pays where the second is smaller (BatchGNN's Table 5 shows both cases)."""
    inner = sum(nodes_per_hop[:-1])
    return sum(nodes_per_hop) * row_bytes, 2 * inner * row_bytes


def node_row_starts(dataset: Dataset) -> np.ndarray:
    """Per node, the element index of its row in features.bin read as a flat array of the feature dtype."""
    m = dataset.manifest
    parts = dataset.partitions()
    itemsize = np.dtype(m.feat_dtype.value).itemsize
    counts = parts.node_end - parts.node_begin
    if np.any(parts.feat_offset % itemsize):
        raise UserError(f"{dataset.file('features')}: a partition's rows start off the {itemsize}-byte grid")
    first = np.repeat(parts.feat_offset // itemsize - parts.node_begin * m.feat_dim, counts)
    return first + np.arange(m.num_nodes, dtype=np.int64) * m.feat_dim


def dataset_cache(dataset: Dataset) -> AggregationCache | None:
    """The aggregation cache ``dataset``'s manifest names, or None."""
    section = dataset.manifest.extra.get(SECTION)
    if not isinstance(section, dict):
        return None
    try:
        return AggregationCache(str(section["kind"]), str(section["file"]), str(section["checks"]),
                                int(section["check_block"]))
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{dataset.path / 'manifest.json'}: malformed {SECTION} section") from None


class _WholeFileHash:
    """Checks a file read partition by partition, in file order, against its manifest ``xxh3_64``: the ranges must
    tile the file from byte 0, so their bytes in order are the file's (prepare's layout; checked as they come)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = xxhash.xxh3_64()
        self.next_offset = 0

    def __call__(self, partition: int, rows: memoryview, padding: bytes, offset: int) -> None:
        if offset != self.next_offset:
            raise UserError(f"{self.path}: partition {partition} starts at byte {offset}, not where the one before "
                            f"ends ({self.next_offset}); run 'megabatch aggregate' again")
        self.digest.update(rows)
        self.digest.update(padding)
        self.next_offset = offset + len(rows) + len(padding)

    def verify(self, expected: str, size: int) -> None:
        if self.next_offset != size or self.digest.hexdigest() != expected:
            raise UserError(f"{self.path}: not the file the manifest records; run 'megabatch aggregate' again")


def read_aggregates(dataset: Dataset) -> tuple[AggregationCache, np.ndarray]:
    """The cache and its rows in node order, (N, F) in the feature dtype, checked whole against the manifest's
    checksum as they are read (one pass). A dataset without a cache is a one-line error naming the command that
    builds one."""
    cache = dataset_cache(dataset)
    if cache is None:
        raise UserError(f"{dataset.path} has no aggregation cache: build one with 'megabatch aggregate "
                        f"{dataset.path} --kind mean' (gcn for --model gcn)")
    path = dataset.path / cache.file
    entry = dataset.manifest.files.get(cache.file)
    if entry is None or not path.is_file():
        raise UserError(f"{path}: missing or not the file the manifest records; run 'megabatch aggregate' again")
    check = _WholeFileHash(path)
    rows = read_feature_layout(dataset, path, dataset.partitions(), check)
    check.verify(entry.xxh3_64, path.stat().st_size)
    return cache, rows
