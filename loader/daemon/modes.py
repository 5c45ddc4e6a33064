"""The registry of training modes: every ``[loader] mode`` and where its ``TrainingMode`` lives.

The one place that knows every mode. An entry is a ``"module:Class"`` string, imported when the mode is
looked up, so opening one mode imports no other, and config.py can validate ``[loader] mode`` against
``MODES`` without importing any mode (this module imports nothing of the daemon at load). The daemon calls
``mode_class`` for what it must know before a mode opens (``loads_static_cache``) and ``open_mode`` to open
it (``serve --check`` calls ``plan_mode``: the plan alone), and from then on sees only a ``TrainingMode``.
docs/ARCHITECTURE.md, "Adding a mode", lists what a new one needs.
"""

import importlib
from typing import TYPE_CHECKING

from proto.errors import UserError

if TYPE_CHECKING:
    from loader.daemon.budget_plan import BudgetPlan
    from loader.daemon.mode import ModeSetup, TrainingMode

__all__ = ["MODES", "DEFAULT_MODE", "unknown_mode", "mode_class", "open_mode", "plan_mode"]

MODES: dict[str, str] = {
    "hierarchical": "loader.daemon.hierarchical.mode:HierarchicalMode",
    "exact": "loader.daemon.fullgraph.outofcore:ExactMode",
    "static": "loader.daemon.fullgraph.outofcore:StaticMode",
    "staged": "loader.daemon.fullgraph.staged:StagedMode",
    "hybrid": "loader.daemon.fullgraph.hybrid:HybridMode",
    "mmap": "loader.daemon.fullgraph.fullgraph_modes:MmapMode",
    "inmemory": "loader.daemon.fullgraph.fullgraph_modes:InMemoryMode",
}
"""``[loader] mode`` -> ``"module:Class"`` of its ``TrainingMode``, in the order error messages list them."""

DEFAULT_MODE = "hierarchical"
"""``[loader] mode`` where the config leaves it unset."""


def unknown_mode(name: object) -> UserError:
    """The one-line error for a ``[loader] mode`` nobody registered (it lists those that are)."""
    return UserError(f"[loader] mode: expected one of {', '.join(MODES)}, got {name!r}")


def mode_class(name: str) -> "type[TrainingMode]":
    """The ``TrainingMode`` registered as ``name``, its module imported now; UserError for an unknown name."""
    from loader.daemon.mode import TrainingMode  # here, not at load: config.py imports this module

    target = MODES.get(name)
    if target is None:
        raise unknown_mode(name)
    module, _, attribute = target.partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    # a registry bug, not the user's: the entry must name a mode that calls itself by its key
    if not (isinstance(cls, type) and issubclass(cls, TrainingMode)) or cls.name != name:
        raise TypeError(f"MODES[{name!r}] = {target!r} is not a TrainingMode named {name!r}")
    return cls


def _fitting_mode(setup: "ModeSetup") -> "type[TrainingMode]":
    """The configured mode's class, once the budget is known to hold the fixed part (node arrays and slots, refused
    here in one place for every mode)."""
    from loader.daemon.budget_plan import budget_too_small

    config = setup.serving.config
    cls = mode_class(config.loader.mode)
    fixed, budget = setup.fixed, config.memory.budget
    if fixed.total > budget:
        raise budget_too_small(budget, cls.name, fixed.parts(), "lower [publisher] slots / [server] max_clients")
    return cls


def open_mode(setup: "ModeSetup") -> "TrainingMode":
    """Open the ``[loader] mode`` backend (``TrainingMode.open``); UserError when the budget cannot hold its fixed
    part or the mode's own plan."""
    return _fitting_mode(setup).open(setup)


def plan_mode(setup: "ModeSetup") -> "BudgetPlan":
    """The memory plan ``open_mode`` would open the mode with, refused alike, opening nothing (``serve --check``)."""
    return _fitting_mode(setup).plan_budget(setup)
