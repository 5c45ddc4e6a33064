"""What the daemon tests compare served batches with: the shared dataset held in memory."""

from pathlib import Path

import pytest

from loader.format.dataset import open_dataset
from loader.sampling.inmemory import InMemoryGraph, load_in_memory


@pytest.fixture(scope="module")
def reference_3k(dataset_3k: Path) -> InMemoryGraph:
    """``dataset_3k`` loaded whole (graph, features, labels, splits): the in-memory reference
    (one per module, so a test that changes its arrays cannot reach another module)."""
    return load_in_memory(open_dataset(dataset_3k))
