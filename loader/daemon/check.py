"""``megabatch serve --check``: what ``serve`` checks before it serves, and nothing that it starts.

The config is validated (``load_config``, by the CLI), the dataset opened and checked as start-up checks it
(``mode_setup.prepare_setup``: manifest, file sizes, the node arrays' read checks, ``indptr.npy`` whole, the
pilot sample that sizes the slots) and the mode's memory plan made and refused as start-up makes it
(``modes.plan_mode``: the plan alone, no buffer allocated). No socket is bound, no metrics port opened, no
shared memory made, so it runs beside a serving daemon, in CI, or by hand before a restart. What belongs to
the moment of start (the socket's directory, a free metrics port) is not checked.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path
from typing import Any

from loader.daemon.config import LoaderConfig
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.mode_setup import prepare_setup
from loader.daemon.modes import plan_mode
from proto.sizes import format_size

__all__ = ["check_serve", "format_config"]

SIZE_KEYS = {("memory", "budget"), ("io", "read_block"), ("publisher", "slot_bytes"), ("server", "max_frame_bytes"),
             ("fullgraph", "neighbor_cache"), ("fullgraph", "feature_cache")}
"""Keys holding byte counts: their line gets the size in words as a comment."""


def _toml(value: Any) -> str:
    if value is None:
        return '"auto"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def format_config(config: LoaderConfig) -> str:
    """``config`` as TOML, every key with its value after defaults and path resolution ("auto" where start-up
    resolves it; the resolved values follow in the check's report): it reads back as the same config."""
    lines: list[str] = []
    for table in fields(config):
        section = getattr(config, table.name)
        lines.append(f"[{table.name}]")
        for key in fields(section):
            value = getattr(section, key.name)
            if (table.name, key.name) == ("server", "socket_mode"):
                lines.append(f'{key.name} = "{value:04o}"')
            elif (table.name, key.name) == ("fullgraph", "superbatch") and value is None:
                lines.append(f"# {key.name}: the mode's default")  # no "auto" spelling: unset is the default
            elif (table.name, key.name) in SIZE_KEYS and isinstance(value, int):
                lines.append(f"{key.name} = {value}  # {format_size(value)}")
            else:
                lines.append(f"{key.name} = {_toml(value)}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def check_serve(config: LoaderConfig, source: Path | str) -> str:
    """The report of a config ``serve`` would start with: the resolved config, then, as TOML comments (the whole
    report reads as TOML), the dataset, the clients' slots and the memory plan; UserError (one line) for what
    start-up would refuse."""
    # a registry of its own, never served; a pool never given work (the plan runs nothing)
    with ThreadPoolExecutor(1, thread_name_prefix="megabatch-check") as pool:
        setup = prepare_setup(config, DaemonMetrics(), pool)
        try:
            plan = plan_mode(setup)
        finally:
            setup.serving.close()
    estimate = setup.serving.aggregation_estimate
    m = setup.dataset.manifest
    return "\n".join([
        f"# megabatch serve --check {source}: the configuration as serve resolves it",
        format_config(config),
        "",
        f"# dataset {setup.dataset.path}: format {m.version}, {m.num_nodes:,} nodes, {m.num_edges:,} edges, "
        f"{m.num_partitions} partitions",
        f"# clients and slots: {setup.sessions.describe()}",
        f"# {plan.describe()}",
        *([] if estimate is None else [f"# {estimate.describe(config.sampler.aggregation_cache, config.loader.mode)}"]),
        f"# ok: {source} is valid and its dataset opens; serve would start (nothing was started: no socket, no "
        f"metrics port, no shared memory)",
    ])
