"""The training-mode family: what the daemon asks of every ``[loader] mode``, and what it hands each one.

A ``TrainingMode`` owns everything mode-specific: its share of ``[memory] budget`` (a
``BudgetPlan``), its caches, readers and buffers, the stages of a training stream
(``start_pipeline``) and how evaluation batches are sampled and filled (``eval_access``). What the
daemon must know of a mode beyond that is a capability it asks the class or the instance
(``loads_static_cache``, ``measures_quality``, ``cross_machine_problem``, ``link_order``), never its name. The daemon
(``loader.daemon.server``) holds one; ``loader.daemon.modes`` registers every mode and opens the one a
config names through ``TrainingMode.open``. docs/ARCHITECTURE.md, "Adding a mode", is the checklist.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from loader.daemon.budget_plan import BudgetPlan, FixedPart, fixed_part
from loader.daemon.config import LoaderConfig
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

    @property
    def fixed(self) -> FixedPart:
        """Node arrays, slots (and a link dataset's pairs): the part of the budget every mode's plan starts from."""
        aggregates, link = self.serving.aggregates, self.serving.link
        return fixed_part(self.dataset.manifest.num_nodes, self.sessions,
                          0 if aggregates is None else aggregates.nbytes, 0 if link is None else link.nbytes)


class TrainingMode(ABC):
    """One ``[loader] mode``: its memory, its training stream's stages, its evaluation access."""

    name: ClassVar[str]
    """The ``[loader] mode`` value (its key in ``loader.daemon.modes.MODES``)."""
    measures_quality: ClassVar[bool] = False
    """Whether the mode measures its training quality (neighbour coverage, label skew) per epoch, so that
    ``megabatch status`` reports it (default false: a full-graph mode's batches are the reference's)."""
    budget_plan: BudgetPlan

    @classmethod
    @abstractmethod
    def open(cls, setup: ModeSetup) -> "TrainingMode":
        """The one constructor the registry calls: plan the mode's share of the budget from ``setup`` (refused by
        ``budget_plan.budget_too_small`` where it does not fit) and open the mode's files and buffers."""

    @classmethod
    def plan_budget(cls, setup: ModeSetup) -> BudgetPlan:
        """The plan ``open`` would make from ``setup``, refused the same way, opening nothing (``serve --check``).

        The default opens the mode and closes it again: right for any mode, but it allocates what the mode holds;
        a mode whose ``open`` allocates or reads much overrides this with its planning step alone (every built-in
        mode does, and its ``open`` calls it, so the two cannot disagree)."""
        mode = cls.open(setup)
        try:
            return mode.budget_plan
        finally:
            mode.close()

    @classmethod
    def loads_static_cache(cls, config: LoaderConfig) -> bool:
        """Whether the daemon loads the prepared static cache at startup, before the mode opens (default: no)."""
        return False

    def link_order(self) -> str:
        """The order a link dataset's training edges follow in this mode (``DatasetInfo.link_order``); the default,
        every full-graph mode's: shuffled over the whole graph."""
        return "shuffled"

    def cross_machine_problem(self) -> str | None:
        """Why this mode, as configured, cannot serve a training job whose ranks span machines (the daemons must
        deal the same steps), or None (the default)."""
        return None

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
