"""What an evaluation stream samples and reads through (``EvalAccess``), whatever the mode.

Validation and test batches must see every neighbour a node has, not just a mega-batch's, so
they are sampled on the whole graph. Each daemon mode says how (``TrainingMode.eval_access``): the
in-memory mode from RAM; every other mode through checked preads (``loader.daemon.disk_graph``:
the out-of-core modes through their own sampler, neighbour cache and row reads, so an evaluation
stays inside their budget; the hierarchical and mmap modes through a reader of their own with no
cache). None maps the dataset's files for evaluation: a file that shrinks under the daemon fails
the stream, it does not kill the daemon.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from loader.daemon.slot_source import SlotSource
from loader.sampling.sampling import SampledPass

__all__ = ["EvalAccess", "ModeEval"]


class EvalAccess(Protocol):
    """How one evaluation stream samples its batches and fills their rows (dataset ids as local ids)."""

    source: SlotSource

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        ...

    def close(self) -> None:
        ...


@dataclass
class ModeEval:
    """An ``EvalAccess`` made of a mode's sampler and a row source that need no closing."""

    source: SlotSource
    sampler: Callable[[np.ndarray, int, tuple[int, ...], np.ndarray], SampledPass]

    def sample(self, seeds: np.ndarray, batch_size: int, fanouts: tuple[int, ...], keys: np.ndarray) -> SampledPass:
        return self.sampler(seeds, batch_size, fanouts, keys)

    def close(self) -> None:
        pass
