"""Open the ``TrainingMode`` a config names, after checking that the budget holds its fixed part.

The one place that knows every mode: the daemon calls ``open_mode`` and from then on sees only a
``TrainingMode``. docs/ARCHITECTURE.md, "Adding a mode", lists what a new one needs.
"""

from loader.daemon.config import LoaderConfig
from loader.daemon.fullgraph.fullgraph_modes import InMemoryMode, MmapMode
from loader.daemon.fullgraph.hybrid import HybridMode
from loader.daemon.fullgraph.outofcore import ExactMode, StaticMode, plan_outofcore
from loader.daemon.fullgraph.staged import StagedMode
from loader.daemon.hierarchical.mode import HierarchicalMode
from loader.daemon.mode import ModeSetup, TrainingMode
from loader.daemon.resident import NODE_ARRAY_BYTES
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["open_mode", "loads_static_cache"]


def loads_static_cache(config: LoaderConfig) -> bool:
    """Whether the daemon loads the prepared static cache at startup (only the hierarchical mode reads it)."""
    return config.loader.mode == "hierarchical" and config.hierarchy.static_cache is not False


def open_mode(setup: ModeSetup) -> TrainingMode:
    """The ``[loader] mode`` backend; UserError when the budget cannot hold it."""
    config = setup.serving.config
    mode = config.loader.mode
    if mode == "hierarchical":
        return HierarchicalMode(setup)
    m = setup.dataset.manifest
    fixed = m.num_nodes * NODE_ARRAY_BYTES + setup.sessions.total
    budget = config.memory.budget
    if fixed > budget:
        raise UserError(f"memory budget {format_size(budget)} is too small: node arrays and "
                        f"{setup.sessions.describe()} need {format_size(fixed)}; raise [memory] budget or lower "
                        f"[publisher] slots / [server] max_clients")
    if mode == "inmemory":
        return InMemoryMode(setup.serving, setup.dataset, fixed)
    if mode == "mmap":
        return MmapMode(setup.serving, setup.dataset, setup.resident.partitions, fixed, setup.pilot.eval)
    batch = setup.pilot.train_or_zero
    plan = plan_outofcore(config, setup.dataset, fixed, batch.nodes, batch.edges)
    if mode == "exact":
        return ExactMode(setup.serving, setup.dataset, plan)
    if mode == "static":
        return StaticMode(setup.serving, setup.dataset, plan)
    if mode == "staged":
        return StagedMode(setup.serving, setup.dataset, plan)
    if mode == "hybrid":
        return HybridMode(setup.serving, setup.dataset, plan)
    raise AssertionError(f"config validation let mode {mode!r} through")
