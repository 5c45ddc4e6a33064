"""What every mode's split of ``[memory] budget`` shares: the ``BudgetPlan`` interface, the fixed part and the refusal.

Each mode resolves its own plan at startup (``hierarchical.memplan.HierarchicalBudget``,
``fullgraph.outofcore.OutOfCoreBudget``, ``fullgraph.fullgraph_modes.HeldBudget``) and refuses to start
when it does not fit; the daemon only logs ``describe()`` and the metrics read ``total``. Every plan starts
from the same ``FixedPart`` (node arrays and the clients' slots, ``fixed_part``), and every "does not fit"
is the one line ``budget_too_small`` writes, so an operator reads the same shape whatever the mode.
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from loader.daemon.resident import NODE_ARRAY_BYTES
from loader.daemon.slot_sizing import SessionSizing
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["BudgetPlan", "FixedPart", "Part", "fixed_part", "budget_too_small"]

Part = tuple[str, int]
"""One part of a plan: what it is (as the plan line names it) and its bytes."""


class BudgetPlan(ABC):
    """A mode's resolved split of ``[memory] budget``, made (and checked) once at startup."""

    @property
    @abstractmethod
    def total(self) -> int:
        """Bytes the plan charges, node arrays and slots included (never above the budget)."""

    @abstractmethod
    def describe(self) -> str:
        """The "memory plan ..." line ``serve`` logs at startup: every part and its size."""


@dataclass(frozen=True)
class FixedPart:
    """What the daemon holds whatever the mode: the node arrays it loads at startup and the clients' slots."""

    node_arrays: int
    """``resident.NODE_ARRAY_BYTES`` per node."""
    sessions: SessionSizing
    """Clients at once and their slots."""
    aggregate_reader: int = 0
    """The aggregation cache's row reader (``AggregateRows.nbytes``), 0 where the cache is off."""
    link_pairs: int = 0
    """A link dataset's positives and negative tails (``LinkServing.nbytes``), 0 for a node dataset."""

    @property
    def total(self) -> int:
        return self.node_arrays + self.sessions.total + self.aggregate_reader + self.link_pairs

    def parts(self) -> list[Part]:
        parts = [("node arrays", self.node_arrays), (f"slots ({self.sessions.describe()})", self.sessions.total)]
        if self.aggregate_reader:
            parts.append(("aggregate reads", self.aggregate_reader))
        if self.link_pairs:
            parts.append(("link pairs", self.link_pairs))
        return parts


def fixed_part(num_nodes: int, sessions: SessionSizing, aggregate_reader: int = 0, link_pairs: int = 0) -> FixedPart:
    """The fixed part of every mode's plan for a graph of ``num_nodes`` nodes."""
    return FixedPart(num_nodes * NODE_ARRAY_BYTES, sessions, aggregate_reader, link_pairs)


def budget_too_small(budget: int, mode: str, parts: Sequence[Part], remedy: str) -> UserError:
    """The one-line refusal of a plan that does not fit ``budget``: every part with its size, their sum, and
    ``remedy`` (what to turn besides the budget, e.g. "lower [fullgraph] superbatch")."""
    listed = " + ".join(f"{what} {format_size(size)}" for what, size in parts)
    need = sum(size for _, size in parts)
    return UserError(f"memory budget {format_size(budget)} is too small for mode {mode}: {listed} = "
                     f"{format_size(need)}; raise [memory] budget or {remedy}")
