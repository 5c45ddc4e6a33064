"""Shared fixtures: small raw datasets built in plain numpy, and the path to ../shared/data."""

from pathlib import Path

import numpy as np
import pytest

from loader.format.raw import RawDataset, RawDatasetWriter, open_raw
from tests.paths import SHARED_DATA


def shared_graph(name: str) -> Path:
    """Path of a graph in ../shared/data; skips only where ../shared is absent (a user's clone)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data not present (a user's clone)")
    return SHARED_DATA / name


def write_raw(path: Path, src: np.ndarray, dst: np.ndarray, features: np.ndarray, labels: np.ndarray,
              num_classes: int, split: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> RawDataset:
    """Write a raw dataset from in-memory arrays (the reference input of round-trip tests)."""
    with RawDatasetWriter(path, num_nodes=len(labels), feat_dim=features.shape[1], num_classes=num_classes,
                          feat_dtype=str(features.dtype)) as writer:
        writer.append_edges(src, dst)
        writer.append_features(features)
        writer.write_labels(labels)
        if split is not None:
            writer.write_split(*split)
    return open_raw(path)


def random_graph(rng: np.random.Generator, n: int, e: int, d: int, classes: int = 3
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, features, labels) of a random multigraph with self-loops allowed."""
    src = rng.integers(0, n, e)
    dst = rng.integers(0, n, e)
    features = rng.standard_normal((n, d)).astype(np.float32)
    labels = rng.integers(0, classes, n)
    return src, dst, features, labels


def generated_dataset(root: Path, *, nodes: int = 3000, avg_degree: float = 10, feat_dim: int = 32, classes: int = 5,
                      partitions: int = 4, seed: int = 1) -> Path:
    """A small learnable prepared dataset (``megabatch generate`` + ``prepare``) at ``root / "ds"``."""
    from loader.offline.generate import generate_graph
    from loader.offline.prepare import PrepareOptions, prepare_dataset

    generate_graph(root / "raw", num_nodes=nodes, avg_degree=avg_degree, feat_dim=feat_dim, num_classes=classes,
                   seed=seed, progress=False)
    prepare_dataset(root / "raw", root / "ds", PrepareOptions(num_partitions=partitions, memory_budget=256 << 20,
                                                              progress=False))
    return root / "ds"


DATASET_400_TRAIN_NODES = 151
"""Training nodes of ``split_dataset_400``'s split."""


def split_dataset_400(root: Path) -> Path:
    """A prepared dataset at ``root / "ds"``: 400 nodes, 2400 random edges (``random_graph``, seed 8), 8 float32
    features, 3 classes, 4 partitions; its split (seed 9) has ``DATASET_400_TRAIN_NODES`` training nodes, 109
    validation and 140 test nodes."""
    from loader.offline.prepare import PrepareOptions, prepare_dataset

    n = 400
    src, dst, features, labels = random_graph(np.random.default_rng(8), n, 2400, 8, classes=3)
    ids = np.random.default_rng(9).permutation(n)
    train = DATASET_400_TRAIN_NODES
    split = (np.sort(ids[:train]), np.sort(ids[train:260]), np.sort(ids[260:]))
    write_raw(root / "raw", src, dst, features, labels, 3, split)
    prepare_dataset(root / "raw", root / "ds", PrepareOptions(num_partitions=4, memory_budget=256 << 20,
                                                              progress=False))
    return root / "ds"


def link_raw(path: Path, src: np.ndarray, dst: np.ndarray, num_nodes: int, *, feat_dim: int = 4,
             undirected: bool = False, edge_split: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0,
             eval_negatives: int = 5, memory_budget: int = 64 << 20, feature_density: float = 1.0) -> RawDataset:
    """A link-prediction raw dataset at ``path`` (``import --format numpy --task link``) of the edges ``src ->
    dst`` (input order kept), random features and labels: the reference input of the link tests.
    ``feature_density`` < 1 keeps about that share of the features non-zero (bag-of-words-like rows)."""
    from loader.offline.importers import ImportOptions, import_dataset

    source = path.parent / f"{path.name}-input"
    source.mkdir()
    rng = np.random.default_rng(num_nodes)
    np.save(source / "edge_index.npy", np.stack((np.asarray(src, np.int64), np.asarray(dst, np.int64))))
    features = rng.standard_normal((num_nodes, feat_dim)).astype(np.float32)
    labels = rng.integers(0, 3, num_nodes)
    if feature_density < 1.0:
        features[np.random.default_rng(feat_dim).random(features.shape) >= feature_density] = 0.0
    np.save(source / "features.npy", features)
    np.save(source / "labels.npy", labels)
    options = ImportOptions(undirected=undirected, task="link", edge_split=edge_split, edge_split_seed=seed,
                            eval_negatives=eval_negatives)
    return import_dataset(source, path, fmt="numpy", options=options, memory_budget=memory_budget, progress=False)


def link_input_graph(seed: int, n: int, e: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of ~1.2 e random edges with frequent duplicates and self-loops; ``symmetric`` stores each both
    ways (as an undirected graph's file does)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = np.where(rng.random(e) < 0.15, src, rng.integers(0, n, e))
    repeat = rng.random(e) < 0.2
    src, dst = np.concatenate((src, src[repeat])), np.concatenate((dst, dst[repeat]))
    if symmetric:
        src, dst = np.concatenate((src, dst)), np.concatenate((dst, src))
    order = rng.permutation(len(src))
    return src[order], dst[order]
