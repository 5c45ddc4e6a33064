"""The training-mode family: what the daemon asks of every ``[loader] mode``, and what it hands each one.

A ``TrainingMode`` owns everything mode-specific: its share of ``[memory] budget`` (a
``BudgetPlan``), its caches, readers and buffers, the stages of a training stream
(``start_pipeline``) and how evaluation batches are sampled and filled (``eval_access``). The
daemon (``loader.daemon.server``) holds one and never asks which kind it is; ``loader.daemon.modes``
opens the one a config names. docs/ARCHITECTURE.md, "Adding a mode", is the checklist.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass

from loader.daemon.budget_plan import BudgetPlan
from loader.daemon.eval_stream import EvalAccess
from loader.daemon.resident import ResidentData
from loader.daemon.serving import ServingContext
from loader.daemon.slot_sizing import PilotSizes, SessionSizing
from loader.daemon.stages import TrainPipeline
from loader.format.dataset import Dataset
from loader.sampling.ranks import LocalRanks

__all__ = ["ModeSetup", "TrainingMode"]


@dataclass(frozen=True)
class ModeSetup:
    """What every mode is opened with: the dataset, what the daemon loaded of it, the slots it sized
    from the pilot sample, and the serving context its stages run in."""

    dataset: Dataset
    resident: ResidentData
    sessions: SessionSizing
    """Clients at once and their slots (charged to the budget by every mode)."""
    pilot: PilotSizes
    """A pilot sample's batch sizes, which bound the sampled passes a mode keeps in flight."""
    serving: ServingContext


class TrainingMode(ABC):
    """One ``[loader] mode``: its memory, its training stream's stages, its evaluation access."""

    name: str
    """The ``[loader] mode`` value."""
    budget_plan: BudgetPlan

    @abstractmethod
    def summary(self) -> str:
        """A few words for the "serving ..." line (e.g. partitions per mega-batch)."""

    @abstractmethod
    def start_pipeline(self, start_epoch: int, local: LocalRanks) -> TrainPipeline:
        """Start the stages of a training stream from ``start_epoch`` whose batches are ``local``'s pieces
        (``loader.sampling.ranks``; ``SINGLE_RANK``: one trainer's batches). At most one runs at a time,
        and a stopped one's stages are gone before the next starts, so a mode may reuse its buffers."""

    @abstractmethod
    def eval_access(self) -> EvalAccess:
        """A new evaluation stream's sampler and rows (it may run beside a training stream)."""

    @abstractmethod
    def close(self) -> None:
        """Release files, maps and buffers (after every stream has stopped)."""
