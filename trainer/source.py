"""Where batches come from: the loader daemon or the in-memory reference, behind one interface."""

import abc
from collections.abc import Iterator
from dataclasses import dataclass

from trainer.batch import Batch

__all__ = ["SourceInfo", "BatchSource"]


@dataclass(frozen=True)
class SourceInfo:
    """What the model needs to know about the data before the first batch."""

    num_features: int
    num_classes: int
    num_hops: int
    """Number of sampled hops (= number of GNN layers the batches support)."""
    batch_size: int
    train_nodes: int
    """Training nodes per epoch (each appears once per pass)."""
    description: str
    """One line for logs, e.g. 'daemon /run/megabatch/loader.sock' or 'inmemory demo-data/dataset'."""
    feature_dtype: str = "float32"
    """"float32" or "float16": the dtype of ``Batch.x``."""
    feature_cache_rows: int = 0
    """Rows of the trainer-side feature cache the source plans for (0 = none; only the daemon has one).
    When > 0, training batches may carry a ``cache_plan`` and the loop keeps a ``DeviceFeatureCache``."""


class BatchSource(abc.ABC):
    """A stream of training and evaluation batches.

    ``train_batches(epoch)`` yields every batch of one epoch (all passes); the same epoch number
    yields the same batches (deterministic from the configured seed), which is what makes
    ``--resume`` reproduce an uninterrupted run. ``eval_batches(split)`` covers every node of the
    split ("val" or "test") exactly once.
    """

    @property
    @abc.abstractmethod
    def info(self) -> SourceInfo: ...

    @abc.abstractmethod
    def train_batches(self, epoch: int) -> Iterator[Batch]: ...

    @abc.abstractmethod
    def eval_batches(self, split: str) -> Iterator[Batch]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and memory; the default has nothing to release."""
