"""A held-out link split as positions into the nodes its scores need: what the daemon's evaluation batches
carry piece by piece (``pair_index``, ``pair_tails``: proto/PROTOCOL.md, "Batch arrays") and what the trainer
scores once a split's stream has ended. The loader builds it (``loader.sampling.link_sampling.held_out_pairs``)
and both trainer sources hold it, so it lives here, below both."""

from dataclasses import dataclass

import numpy as np

__all__ = ["HeldPairs"]


@dataclass(frozen=True)
class HeldPairs:
    """One held-out split as positions into ``nodes`` (the nodes its scores need: sorted dataset ids of every
    positive's endpoints and every negative tail).

    src, dst: int64 (E,) the positives' endpoints; tails: int64 (E, K) each positive's negative tails.
    """

    nodes: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    tails: np.ndarray

    @property
    def num_positives(self) -> int:
        return int(self.src.shape[0])
