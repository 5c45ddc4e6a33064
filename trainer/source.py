"""Where batches come from: the loader daemon or the in-memory reference, behind one interface."""

import abc
from collections.abc import Iterator
from dataclasses import dataclass

import torch

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
    train_class_counts: tuple[int, ...] | None = None
    """Labelled training nodes per class (index = class id), when the source knows them up front (the
    in-memory source does; the daemon's handshake does not carry them). None: the training loop counts
    the labels of the first epoch's training batches where it needs the class balance (``--metric auto``)."""
    aggregation: str = ""
    """The aggregation cache the batches carry (``Batch.x_agg``): "mean" or "gcn", "" for none."""
    dealing: str = ""
    """What decides the epochs' batches, as a fingerprint (the daemon's ``Welcome.dealing``; "" where the
    source does not say). The ranks of one job must agree on it: the loop checks that they do."""

    def __post_init__(self) -> None:
        counts = self.train_class_counts
        if counts is not None:
            normalized = tuple(int(c) for c in counts)
            if len(normalized) != self.num_classes or any(c < 0 for c in normalized):
                raise ValueError(f"train_class_counts must hold {self.num_classes} non-negative counts (one per "
                                 f"class), got {list(normalized)}")
            object.__setattr__(self, "train_class_counts", normalized)  # frozen: normalize once, here


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

    def pin_for(self, device: torch.device) -> None:  # noqa: B027 - optional hook
        """Ready the source's host memory for asynchronous copies to ``device`` (called once, before the first
        batch); the default does nothing. The daemon's source pins its slot segment for a CUDA device."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and memory; the default has nothing to release."""
