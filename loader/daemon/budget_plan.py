"""``BudgetPlan``: the interface of every mode's split of ``[memory] budget``.

Each mode resolves its own plan at startup (``hierarchical.memplan.HierarchicalBudget``,
``fullgraph.outofcore.OutOfCoreBudget``, ``fullgraph.fullgraph_modes.HeldBudget``) and refuses to start
when it does not fit; the daemon only logs ``describe()`` and the metrics read ``total``.
"""

from abc import ABC, abstractmethod

__all__ = ["BudgetPlan"]


class BudgetPlan(ABC):
    """A mode's resolved split of ``[memory] budget``, made (and checked) once at startup."""

    @property
    @abstractmethod
    def total(self) -> int:
        """Bytes the plan charges, node arrays and slots included (never above the budget)."""

    @abstractmethod
    def describe(self) -> str:
        """The "memory plan ..." line ``serve`` logs at startup: every part and its size."""
