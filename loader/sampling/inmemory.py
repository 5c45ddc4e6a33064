"""The whole prepared dataset in memory, and the batch plans shared by both training modes.

``load_in_memory`` is the in-memory reference ("NS" baseline of HierBatching): the full CSC graph,
a dense feature matrix and the labels, for datasets that fit in RAM. The plan functions fix which
seeds form which batch and which random key each batch is sampled with; the loader daemon uses
the same ones for evaluation, so validation and test accuracy mean the same thing in both modes.
"""

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import xxhash

from loader.format.dataset import Dataset
from loader.format.feature_codec import FeatureCodec
from loader.format.feature_layout import RangeCheck, feature_ranges, read_feature_layout
from loader.format.partition_table import PartitionTable
from loader.format.read_checks import PARTITION_CHECK_COLUMNS, CorruptData, ReadChecks, load_read_checks
from loader.sampling.sampling import CSCGraph, batch_keys, shuffle
from proto.errors import UserError

__all__ = [
    "STREAM_TRAIN", "STREAM_VAL", "STREAM_TEST", "STREAM_SHUFFLE", "STREAM_TRAIN_RANK", "SPLITS", "InMemoryGraph",
    "EpochBatches", "load_in_memory", "read_features", "checked_feature_ranges", "shuffle_key", "num_batches",
    "epoch_batches_inmemory", "eval_split_batches",
    "split_stream",
]

STREAM_TRAIN = 0
"""``batch_keys`` stream of training batches."""
STREAM_VAL = 1
"""``batch_keys`` stream of validation batches."""
STREAM_TEST = 2
"""``batch_keys`` stream of test batches."""
STREAM_SHUFFLE = 3
"""``batch_keys`` stream the per-epoch seed shuffle key is drawn from (never used to sample a batch)."""
STREAM_TRAIN_RANK = 4
"""``batch_keys`` stream of the training pieces of ranks 1, 2, ... when an epoch is dealt to several ranks
(``loader.sampling.ranks``; pass_index = the rank). Rank 0 keeps ``STREAM_TRAIN``, so a single rank
samples exactly as a single process does."""

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class InMemoryGraph:
    """A prepared dataset loaded whole.

    ``graph`` is the full in-neighbour CSC with ``global_ids = arange(N)`` (local id = dataset id).
    ``features`` is dense (N, D) in the stored dtype (float32, float16, or uint8 codes with ``codec``), or None
    where the caller keeps them otherwise (``load_in_memory(features=False)``: a trainer holding their non-zeros).
    ``labels`` int64 (N,), -1 for unlabeled. ``splits`` maps "train", "val", "test" to sorted int64 dataset ids.
    """

    graph: CSCGraph
    features: np.ndarray | None
    labels: np.ndarray
    splits: dict[str, np.ndarray]
    num_classes: int
    feat_dim: int
    codec: FeatureCodec | None = None
    """8-bit feature codes' column ranges (``feat_dtype`` uint8); None: ``features`` hold values."""

    def dense_features(self) -> np.ndarray:
        """``features``; a loud error where they were not loaded (a caller that holds them otherwise)."""
        if self.features is None:
            raise RuntimeError("the dense features were not loaded (load_in_memory(features=False))")
        return self.features

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """The rows of ``nodes`` as values: the stored rows, or float32 decoded from codes."""
        rows = self.dense_features()[nodes]
        return rows if self.codec is None else self.codec.decode(rows)

    @property
    def num_nodes(self) -> int:
        return int(self.labels.shape[0])


class EpochBatches(NamedTuple):
    """Seeds of a sequence of batches in batch order, and one sampling key per batch.

    Batch ``b`` is ``seeds[b * batch_size:(b + 1) * batch_size]`` sampled with ``keys[b]``.
    """

    seeds: np.ndarray
    keys: np.ndarray


def _partition_check(checks: ReadChecks, path: Path) -> RangeCheck:
    """Each partition's features range, rows and padding, against its sum (``prepare`` hashed the padded range)."""
    column = PARTITION_CHECK_COLUMNS.index("features")

    def check(partition: int, rows: memoryview, padding: bytes, offset: int) -> None:
        digest = xxhash.xxh3_64(rows)
        digest.update(padding)
        if digest.intdigest() != int(checks.partition_sums[partition, column]):
            raise CorruptData(path, offset, f"partition {partition}'s features range ({len(rows) + len(padding)} "
                                            f"bytes from byte {offset})")

    return check


def _features_check(dataset: Dataset, path: Path) -> RangeCheck | None:
    """The check of ``features.bin``'s partition ranges: each has a hash (format 1.1+), and the matrix is served from
    RAM afterwards, so this is its read check, one hash per sequential read."""
    checks = load_read_checks(dataset, blocks=False)
    return None if checks is None else _partition_check(checks, path)


def read_features(dataset: Dataset, partitions: PartitionTable | None = None) -> np.ndarray:
    """``dataset``'s dense feature matrix (N, D), each partition's range checked against its sum."""
    path = dataset.file("features")
    return read_feature_layout(dataset, path, dataset.partitions() if partitions is None else partitions,
                               _features_check(dataset, path))


def checked_feature_ranges(dataset: Dataset) -> Generator[tuple[int, np.ndarray], None, None]:
    """``dataset``'s feature rows one partition at a time (its first node, its rows), each checked against its
    sum as ``load_in_memory`` checks them: for a reader that keeps less than the dense matrix."""
    path = dataset.file("features")
    return feature_ranges(dataset, path, dataset.partitions(), _features_check(dataset, path))


def load_in_memory(dataset: Dataset, features: bool = True) -> InMemoryGraph:
    """Read ``dataset``'s graph, features (unless ``features`` is False), labels and splits into memory.

    Features are read partition by partition at each partition's ``feat_offset`` (the padding
    between partitions is skipped). Raises UserError when a file disagrees with the manifest.
    """
    manifest = dataset.manifest
    n = manifest.num_nodes
    indptr = dataset.read("indptr", np.int64, 1)
    indices = dataset.read("indices", manifest.index_dtype.value, 1)
    if indptr.shape[0] != n + 1 or indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        raise UserError(f"{dataset.file('indptr')}: does not describe {n} nodes and {indices.shape[0]} edges")
    partitions = dataset.partitions()
    covered = int(partitions.num_nodes.sum())
    if covered != n:
        raise UserError(f"{dataset.file('partitions')}: partitions cover {covered} nodes, manifest says {n}")
    labels = dataset.read("labels", np.int64, 1)
    if labels.shape[0] != n:
        raise UserError(f"{dataset.file('labels')}: {labels.shape[0]} labels for {n} nodes")
    splits = {name: dataset.read(name, np.int64, 1) for name in SPLITS}
    for name, ids in splits.items():
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise UserError(f"{dataset.file(name)}: node ids outside [0, {n})")
    graph = CSCGraph(indptr=indptr, indices=indices, global_ids=np.arange(n, dtype=np.int64))
    return InMemoryGraph(graph=graph, features=read_features(dataset, partitions) if features else None,
                         labels=labels, splits=splits, num_classes=manifest.num_classes, feat_dim=manifest.feat_dim,
                         codec=dataset.feature_codec())


def num_batches(num_seeds: int, batch_size: int) -> int:
    """Batches needed for ``num_seeds`` seeds (the last one may be short)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    return -(-num_seeds // batch_size)


def shuffle_key(seed: int, epoch: int) -> int:
    """The key that orders the training seeds of ``epoch`` (a function of ``seed`` and ``epoch`` only)."""
    return int(batch_keys(seed, STREAM_SHUFFLE, epoch, 0, 0, 1)[0])


def epoch_batches_inmemory(train_ids: np.ndarray, batch_size: int, seed: int, epoch: int) -> EpochBatches:
    """Neighbour-sampling ("NS") epoch: every training id once, in a fresh random order per epoch.

    ``seeds = shuffle(train_ids, shuffle_key(seed, epoch))``; ``keys = batch_keys(seed, STREAM_TRAIN,
    epoch, 0, 0, num_batches)`` (one pass per epoch). The same arguments give the same plan.
    """
    ids = np.ascontiguousarray(train_ids, dtype=np.int64)
    count = num_batches(ids.shape[0], batch_size)
    return EpochBatches(shuffle(ids, shuffle_key(seed, epoch)), batch_keys(seed, STREAM_TRAIN, epoch, 0, 0, count))


def split_stream(split: str) -> int:
    """The ``batch_keys`` stream of evaluation split ``split`` ("val" or "test")."""
    streams = {"val": STREAM_VAL, "test": STREAM_TEST}
    if split not in streams:
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    return streams[split]


def eval_split_batches(split_ids: np.ndarray, batch_size: int, seed: int, stream: int) -> EpochBatches:
    """Evaluation batches of one split: the sorted ids in order (no shuffle), keys of epoch 0, pass 0.

    Used by the in-memory source and the loader daemon alike, so evaluation is identical in both.
    """
    ids = np.sort(np.asarray(split_ids, dtype=np.int64))
    return EpochBatches(ids, batch_keys(seed, stream, 0, 0, 0, num_batches(ids.shape[0], batch_size)))
