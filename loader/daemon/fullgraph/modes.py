"""Build the full-graph mode a config asks for, after checking it fits the memory budget."""

from loader.daemon.config import LoaderConfig
from loader.daemon.fullgraph.fullgraph import FullGraphMode
from loader.daemon.fullgraph.fullgraph_modes import InMemoryMode, MmapMode
from loader.daemon.fullgraph.outofcore import ExactMode, StaticMode, plan_outofcore
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.resident import NODE_ARRAY_BYTES, ResidentData
from loader.daemon.slot_sizing import PilotSizes, SessionSizing
from loader.format.dataset import Dataset
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["open_mode"]


def open_mode(config: LoaderConfig, dataset: Dataset, resident: ResidentData, sessions: SessionSizing,
              pilot: PilotSizes, metrics: DaemonMetrics) -> FullGraphMode:
    """The ``[loader] mode`` backend; UserError when the budget cannot hold its fixed part."""
    m = dataset.manifest
    fixed = m.num_nodes * NODE_ARRAY_BYTES + sessions.total
    budget = config.memory.budget
    if fixed > budget:
        raise UserError(f"memory budget {format_size(budget)} is too small: node arrays and "
                        f"{sessions.describe()} need {format_size(fixed)}; raise [memory] budget or lower "
                        f"[publisher] slots / [server] max_clients")
    mode = config.loader.mode
    if mode == "inmemory":
        return InMemoryMode(dataset, resident.labels, config.exact.superbatch, budget - fixed)
    if mode == "mmap":
        return MmapMode(dataset, resident.partitions, resident.labels)
    batch = pilot.train_or_zero
    plan = plan_outofcore(config, dataset, fixed, batch.nodes, batch.edges)
    if mode == "exact":
        return ExactMode(dataset, resident.labels, config, plan, metrics)
    if mode == "static":
        return StaticMode(dataset, resident.labels, config, plan, metrics)
    raise AssertionError(f"config validation let mode {mode!r} through")
