"""Prepared datasets that many test modules read: built once per session, checked unchanged at its end.

A test that needs to change a dataset's files changes a copy (``shutil.copytree(dataset_3k, tmp_path / "ds")``):
the session's datasets are shared by every module that asks for them, so a teardown compares each file's
contents with what was prepared and fails naming the files a test changed.
"""

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest


def _contents(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path) -> the SHA-256 of its bytes."""
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def _shared(path: Path) -> Iterator[Path]:
    """Yield ``path``; afterwards, fail if any test changed, added or removed a file under it."""
    before = _contents(path)
    yield path
    after = _contents(path)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"a test changed the shared dataset {path} ({', '.join(changed)}): change a copy instead"


@pytest.fixture(scope="session")
def dataset_3k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The daemon tests' dataset (``tests.daemon_harness.small_dataset``'s defaults): 3000 nodes, average
    degree 10, 16 metis partitions, 16 float32 features, 4 classes, seed 0."""
    from tests.daemon_harness import small_dataset

    yield from _shared(small_dataset(tmp_path_factory.mktemp("dataset-3k")))


@pytest.fixture(scope="session")
def dataset_1500(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small learnable dataset for whole training runs (``tests.graphs.generated_dataset``): 1500 nodes,
    average degree 10, 4 partitions, 16 float32 features, 4 classes, seed 1."""
    from tests.graphs import generated_dataset

    yield from _shared(generated_dataset(tmp_path_factory.mktemp("dataset-1500"), nodes=1500, feat_dim=16,
                                         classes=4))


@pytest.fixture(scope="session")
def dataset_400(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The DDP tests' dataset (``tests.graphs.split_dataset_400``): 400 nodes, 8 features, 3 classes, 4 partitions,
    a split of 151 training nodes (``DATASET_400_TRAIN_NODES``), so two ranks' last pieces differ."""
    from tests.graphs import split_dataset_400

    yield from _shared(split_dataset_400(tmp_path_factory.mktemp("dataset-400")))
