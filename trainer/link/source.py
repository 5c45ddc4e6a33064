"""What the link-prediction loop reads of its batch source: ``LinkInMemorySource`` (``--mode inmemory``) and
``LinkDaemonSource`` (the daemon) both have it."""

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from loader.sampling.buffer_order import BufferEpoch
    from proto.held_pairs import HeldPairs
    from trainer.link.batches import BufferSettings, LinkBatch, NodeBatch

__all__ = ["LinkSource"]


class LinkSource(Protocol):
    """Training batches of positives and negatives, evaluation batches over a split's held-out nodes."""

    @property
    def num_features(self) -> int: ...

    @property
    def num_hops(self) -> int: ...

    @property
    def negatives(self) -> int:
        """Training negatives per positive (the loss of a piece under several ranks is scaled by it)."""
        ...

    @property
    def eval_negatives(self) -> int: ...

    @property
    def train_positives(self) -> int: ...

    @property
    def description(self) -> str: ...

    @property
    def buffer(self) -> "BufferSettings | None": ...

    @property
    def held_out(self) -> "dict[str, HeldPairs]":
        """A split's nodes and pairs; a daemon's is known once the split's evaluation stream has ended."""
        ...

    def positives(self, split: str) -> int:
        """Held-out positives of ``split``."""
        ...

    def buffer_epoch(self, epoch: int) -> "BufferEpoch": ...

    def train_batches(self, epoch: int) -> "Generator[LinkBatch, None, None]": ...

    def eval_batches(self, split: str) -> "Iterator[NodeBatch]": ...

    def close(self) -> None: ...
