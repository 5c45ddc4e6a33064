"""The daemon's configuration: TOML in, a tree of frozen, validated dataclasses out.

Every option is documented in docs/CONFIG.md; defaults are given there and in each field's
docstring. Errors name the table and key (``[sampler] fanouts: ...``) and the offending value.
Unknown tables or keys are errors too: a typo must not silently fall back to a default. A renamed table
(``RENAMED_TABLES``) is still read under its old name, with a warning.
"""

import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from loader.daemon.modes import DEFAULT_MODE, MODES, unknown_mode
from proto.errors import UserError
from proto.sizes import parse_size

__all__ = [
    "RENAMED_TABLES", "SCHEDULES", "FORMATIONS", "DatasetConfig", "ModeConfig", "FullGraphConfig",
    "MemoryConfig", "HierarchyConfig", "SamplerConfig", "LinkConfig", "IOConfig", "PublisherConfig",
    "ServerConfig", "MetricsConfig", "LogConfig", "LoaderConfig", "load_config", "config_from_mapping",
]


@dataclass(frozen=True)
class DatasetConfig:
    path: Path
    """Directory written by ``megabatch prepare`` (required)."""


log = logging.getLogger("megabatch.config")

RENAMED_TABLES = {"exact": "fullgraph"}
"""Old table name -> new: the old one is still read, with a warning; both in one file is an error."""

LINK_BUFFER_ORDERS = ("comet", "beta")
"""``[link] order``: MariusGNN's partition buffer orders (``loader.sampling.buffer_order``)."""
LINK_ASSIGNMENTS = ("edge", "bucket")
"""``[link] assignment``: how COMET gives its states their edges (``loader.sampling.buffer_order.ASSIGNMENTS``)."""

SCHEDULES = ("balanced", "random")
"""How the hierarchical mode groups partitions into mega-batches (``loader.daemon.hierarchical.schedule``)."""

FORMATIONS = ("groups", "comet")
"""How the hierarchical mode's mega-batches follow one another (``loader.daemon.hierarchical.swap_schedule``)."""


@dataclass(frozen=True)
class ModeConfig:
    mode: str = DEFAULT_MODE
    """How training batches are made (default "hierarchical"): "hierarchical" (HierBatching mega-batches),
    "exact" (Ginex: full-graph sampling, neighbour cache, Belady feature cache from changesets),
    "static" (Ali+PG: full-graph sampling, static neighbour and degree-ranked feature caches),
    "staged" (the exact mode's batches, each superbatch's rows staged by one sequential pass over the
    feature file into per-batch regions of a staging file under ``[fullgraph] staging_dir``),
    "hybrid" (the exact mode's batches, each superbatch's densest partitions loaded whole by one sequential
    pass, its other rows from a Belady cache and row reads),
    "mmap" (PyG+: full-graph sampling over memory maps, readahead off), "inmemory" (all in RAM). The values are the
    keys of ``loader.daemon.modes.MODES``."""


@dataclass(frozen=True)
class FullGraphConfig:
    """``[fullgraph]`` (read as ``[exact]`` too, its old name): the options of the full-graph modes."""

    superbatch: int | None = None
    """Mini-batches sampled ahead at once (Ginex's S) in the full-graph modes, or None for the mode's own default
    (``FullGraphMode.default_superbatch``: 64; 512 in mode "staged", whose pass over the feature file a longer
    superbatch shares between more batches)."""
    sample_group: int = 16
    """Batches whose frontiers share one neighbour-list fetch per hop (default 16)."""
    neighbor_cache: int | None = None
    """Bytes of the neighbour cache, or None ("auto": derived from the budget; default auto)."""
    feature_cache: int | None = None
    """Bytes of the feature cache, or None ("auto": the rest of the budget; default auto)."""
    staging_dir: Path = Path("/var/tmp")
    """Mode "staged": the directory its staging files go to (unnamed files, kept for later superbatches and gone
    when the daemon stops; default /var/tmp, on disk where /tmp may be RAM). Each superbatch in flight takes its
    batches' feature bytes there."""


@dataclass(frozen=True)
class MemoryConfig:
    budget: int = 2 << 30
    """Bytes the daemon may hold for data: static cache, two mega-batch buffers, slots (default 2G)."""


@dataclass(frozen=True)
class HierarchyConfig:
    megabatch_fraction: float | None = None
    """N_d / N_p: the share of partitions loaded per mega-batch, or None ("auto", the default: the largest
    N_d the memory budget holds, all partitions included, since more partitions per mega-batch keep more
    neighbours and mix more labels at the same bytes read per epoch)."""
    schedule: str = "balanced"
    """How partitions are grouped into mega-batches (default "balanced"): "balanced" deals a seeded
    shuffle so each group's training labels mix like the epoch's; "random" cuts the shuffle in order
    (HierBatching's Algorithm 1)."""
    static_cache: bool | None = None
    """Keep the prepared static nodes (highest degree) in RAM for every mega-batch: all (true), none
    (false), or None ("auto", the default: as many of them, by degree, as gives the highest expected
    neighbour coverage together with the mega-batch size the rest of the budget holds)."""
    passes: int | None = 1
    """Passes over each mega-batch (p >= 1), or None for "auto" (from load vs train time; default 1)."""
    max_passes: int = 4
    """Cap for ``passes = "auto"`` (default 4)."""
    formation: str = "groups"
    """How mega-batches follow one another in a node task (default "groups"): "groups" replaces the whole
    mega-batch each time (HierBatching; the partitions grouped by ``schedule``); "comet" is MariusGNN's
    node-classification policy: the partitions are grouped into logical partitions (by ``schedule``), the buffer
    holds a few of them and swaps one at a time until every one has been resident, and each training node is
    trained in a state drawn at random among those that hold it (docs/CONFIG.md). A link dataset follows
    ``[link] order`` instead."""
    label_prior_loss: bool = False
    """Training batches carry ``class_weight``: per class, the epoch's share of training labels over the
    mega-batch's (capped at ``CLASS_WEIGHT_CAP``), which the trainer's loss weighs each seed by, so a skewed
    mega-batch's gradient follows the epoch's label mix in expectation (default false; docs/CONFIG.md)."""


@dataclass(frozen=True)
class SamplerConfig:
    batch_size: int = 1024
    """Seed nodes per mini-batch (default 1024)."""
    fanouts: tuple[int, ...] = (10, 5)
    """Neighbours sampled per node at hop 1, 2, ...; -1 = all (default [10, 5])."""
    eval_fanouts: tuple[int, ...] = (10, 5)
    """Fanouts for validation/test batches; same length as ``fanouts`` (default [10, 5])."""
    eval_batch_size: int = 1024
    """Seed nodes per evaluation batch (default 1024)."""
    seed: int = 0
    """Seeds the partition shuffle and the sampler; same seed, same batches (default 0)."""
    aggregation_cache: bool = False
    """Serve the dataset's aggregation cache (``megabatch aggregate``; BatchGNN): training batches sample one hop
    fewer (``fanouts`` but the last) and carry ``x_agg``, each node's features aggregated over all its
    in-neighbours, which the model's first layer reads instead of the last hop (default false). The startup log
    says whether it cuts the rows a batch fetches (docs/CONFIG.md, "Aggregation cache")."""
    eval_aggregation: bool = True
    """With ``aggregation_cache``: evaluation batches are built the same way (default true; false: they sample
    every hop of ``eval_fanouts`` and the model aggregates the sampled neighbours, as without the cache)."""

    @property
    def sampled_fanouts(self) -> tuple[int, ...]:
        """The hops training batches sample: ``fanouts``, but the last one with the aggregation cache."""
        return self.fanouts[:-1] if self.aggregation_cache else self.fanouts

    @property
    def eval_aggregated(self) -> bool:
        """Whether evaluation batches carry ``x_agg``."""
        return self.aggregation_cache and self.eval_aggregation

    @property
    def sampled_eval_fanouts(self) -> tuple[int, ...]:
        """The hops evaluation batches sample."""
        return self.eval_fanouts[:-1] if self.eval_aggregated else self.eval_fanouts


@dataclass(frozen=True)
class LinkConfig:
    """``[link]``: how a link-prediction dataset's training batches are made (ignored for a node dataset)."""

    negatives: int = 1
    """Training negatives per positive, random tails uniform over the nodes (default 1; PyG's
    ``neg_sampling_ratio``)."""
    disjoint: bool = False
    """Drop each training batch's positive edges from its own message passing, so the model cannot read the
    answer off the graph (default false; ``loader.sampling.link_sampling``)."""
    order: str = "comet"
    """Mode "hierarchical": the partition buffer order (MariusGNN) its mega-batches follow, "comet" (default) or
    "beta"; the buffer holds as many partitions as a mega-batch (``[memory] budget``, ``[hierarchy]
    megabatch_fraction``)."""
    logical_partitions: int | None = None
    """Mode "hierarchical", order "comet": logical partitions the physical ones are grouped into each epoch, or
    None ("auto", the default: MariusGNN's 2P/C, rounded so that two fit the buffer)."""
    negative_weights: bool = True
    """Mode "hierarchical" with a buffer of fewer than every partition: weigh each negative in the loss so that
    the pair's own partitions, always resident with it, weigh what they would among uniform draws (batches carry
    ``edge_weight``; ``loader.sampling.negative_weights``; default true)."""
    assignment: str = "edge"
    """Mode "hierarchical", order "comet": "edge" (default) splits each edge bucket's edges at random among every
    state holding both its partitions; "bucket" trains each bucket whole in one of them, MariusGNN's form
    (``loader.sampling.buffer_order``)."""


@dataclass(frozen=True)
class IOConfig:
    direct_io: bool = False
    """Read partitions with O_DIRECT, bypassing the page cache (default false; falls back with a
    warning where the filesystem refuses it)."""
    read_threads: int = 2
    """Threads issuing preadv calls (default 2)."""
    read_block: int = 4 << 20
    """Largest single read in bytes; bigger ranges are split so several are in flight (default 4M)."""
    check_reads: bool = True
    """Verify every byte read against the dataset's read checks (format 1.1+: per partition, per block);
    a mismatch fails the batch with ``data_corrupt`` instead of serving it (default true)."""
    sequential_rate: int = 690_000_000
    """The disk's sequential read rate in bytes/s (default 690M, this project's test machine): mode
    staged's cost model weighs staging a chunk of the feature file against reading its rows at random."""
    random_reads: int = 30_000
    """Random 4 KiB reads per second the disk serves with many in flight (default 30000), for the same model."""


@dataclass(frozen=True)
class PublisherConfig:
    slots: int | None = None
    """Shared-memory slots per client: batches in flight between daemon and trainer, or None ("auto", the
    default: 4, fewer (not under 2) where 4 slots of one client would take over half the budget)."""
    slot_bytes: int | None = None
    """Bytes per slot, or None ("auto") to size from the largest batch of the first pass (default auto)."""


@dataclass(frozen=True)
class ServerConfig:
    socket: Path = Path("/run/megabatch/loader.sock")
    """Control socket path (default /run/megabatch/loader.sock)."""
    socket_mode: int = 0o660
    """Permissions of the socket file, octal string in TOML (default "0660")."""
    max_clients: int | None = None
    """Connections served at once; more are refused with an error message. None ("auto", the default): as
    many as half the budget holds slots for, at least 1, at most 8."""
    max_frame_bytes: int = 64 << 10
    """Largest control message accepted; bigger frames disconnect the client (default 64K)."""
    drain_timeout: float = 10.0
    """Seconds a shutdown waits for stages to finish before cancelling them (default 10)."""
    allow_uids: tuple[int, ...] = ()
    """Peer uids (``SO_PEERCRED``) admitted on the socket; empty (the default) = the daemon's own uid."""
    allow_gids: tuple[int, ...] = ()
    """Peer gids admitted (the peer's primary or a supplementary group); empty (the default) = the group of
    the socket file."""
    stall_timeout: float = 30.0
    """Seconds a stream may wait for its client to release a slot or grant a credit before the daemon evicts
    the session; also how long a client may leave the daemon's replies unread (default 30)."""
    idle_timeout: float = 60.0
    """Seconds the owner of the training pipeline may sit after a stream ended without starting the next
    epoch (or an evaluation) before the daemon evicts it, freeing the pipeline (default 60)."""
    max_pending: int = 16
    """Connections accepted but not yet past their Hello; more are closed at once (default 16)."""
    job_timeout: float = 300.0
    """Seconds the ranks of a training job (``Hello.job``) have, from the first rank's StartEpoch, until
    every local rank has connected; then the job fails with an error naming the missing ranks (default 300)."""


@dataclass(frozen=True)
class MetricsConfig:
    address: str = "127.0.0.1"
    """Prometheus HTTP listen address (default 127.0.0.1)."""
    port: int = 9450
    """Prometheus HTTP port; 0 disables the endpoint (default 9450)."""


@dataclass(frozen=True)
class LogConfig:
    level: str = "info"
    """debug, info, warning or error (default info)."""


@dataclass(frozen=True)
class LoaderConfig:
    dataset: DatasetConfig
    loader: ModeConfig = ModeConfig()
    fullgraph: FullGraphConfig = FullGraphConfig()
    memory: MemoryConfig = MemoryConfig()
    hierarchy: HierarchyConfig = HierarchyConfig()
    sampler: SamplerConfig = SamplerConfig()
    link: LinkConfig = LinkConfig()
    io: IOConfig = IOConfig()
    publisher: PublisherConfig = PublisherConfig()
    server: ServerConfig = ServerConfig()
    metrics: MetricsConfig = MetricsConfig()
    log: LogConfig = LogConfig()


def _fail(table: str, key: str, message: str) -> UserError:
    return UserError(f"[{table}] {key}: {message}")


def _int(table: str, key: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(table, key, f"expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise _fail(table, key, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise _fail(table, key, f"must be <= {maximum}, got {value}")
    return value


def _bool(table: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(table, key, f"expected true or false, got {value!r}")
    return value


def _str(table: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(table, key, f"expected a non-empty string, got {value!r}")
    return value


def _size(table: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _fail(table, key, f"expected a size such as \"512M\" or a byte count, got {value!r}")
    try:
        return parse_size(value, name=f"[{table}] {key}")
    except UserError as err:
        raise UserError(str(err)) from None


def _choice(table: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(table, key, f"expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _fanouts(table: str, key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise _fail(table, key, f"expected a non-empty list of integers, got {value!r}")
    out = tuple(_int(table, key, v) for v in value)
    if any(v == 0 or v < -1 for v in out):
        raise _fail(table, key, f"each fanout must be positive or -1 (all neighbours), got {list(out)}")
    return out


def _path(base: Path, text: str) -> Path:
    # normpath, not resolve(): keep the user's symlinks, drop the "dir/../" a relative path leaves
    return Path(os.path.normpath(base / text))


def _check_keys(table: str, data: Mapping[str, Any], cls: type) -> None:
    allowed = {f.name for f in fields(cls)}
    for key in data:
        if key not in allowed:
            raise _fail(table, key, f"unknown option (known: {', '.join(sorted(allowed))})")


def _int_or_auto(table: str, key: str, value: Any, *, minimum: int, maximum: int | None = None) -> int | None:
    """None for "auto", else ``_int``'s checked integer."""
    return None if value == "auto" else _int(table, key, value, minimum=minimum, maximum=maximum)


def _table(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise UserError(f"[{name}]: expected a table, got {value!r}")
    return value


def _hierarchy(t: Mapping[str, Any]) -> HierarchyConfig:
    _check_keys("hierarchy", t, HierarchyConfig)
    d = HierarchyConfig()
    fraction = t.get("megabatch_fraction", "auto")
    if fraction == "auto":
        fraction = None
    elif isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise _fail("hierarchy", "megabatch_fraction", f"expected a number in (0, 1] or \"auto\", got {fraction!r}")
    passes_value = t.get("passes", d.passes)
    passes: int | None
    if passes_value == "auto":
        passes = None
    else:
        if isinstance(passes_value, str):
            raise _fail("hierarchy", "passes", f"expected an integer >= 1 or \"auto\", got {passes_value!r}")
        passes = _int("hierarchy", "passes", passes_value, minimum=1)
    max_passes = _int("hierarchy", "max_passes", t.get("max_passes", d.max_passes), minimum=1)
    if passes is not None and passes > max_passes:
        raise _fail("hierarchy", "passes", f"{passes} exceeds max_passes = {max_passes}")
    schedule = t.get("schedule", d.schedule)
    if schedule not in SCHEDULES:
        raise _fail("hierarchy", "schedule", f"expected one of {', '.join(SCHEDULES)}, got {schedule!r}")
    formation = t.get("formation", d.formation)
    if formation not in FORMATIONS:
        raise _fail("hierarchy", "formation", f"expected one of {', '.join(FORMATIONS)}, got {formation!r}")
    return HierarchyConfig(megabatch_fraction=None if fraction is None else float(fraction), schedule=schedule,
                           formation=formation,
                           static_cache=_static_cache(t.get("static_cache", "auto")),
                           passes=passes, max_passes=max_passes,
                           label_prior_loss=_bool("hierarchy", "label_prior_loss",
                                                  t.get("label_prior_loss", d.label_prior_loss)))


def _static_cache(value: Any) -> bool | None:
    if value == "auto":
        return None
    if not isinstance(value, bool):
        raise _fail("hierarchy", "static_cache", f"expected true, false or \"auto\", got {value!r}")
    return value


def _mode(t: Mapping[str, Any]) -> ModeConfig:
    _check_keys("loader", t, ModeConfig)
    mode = t.get("mode", ModeConfig().mode)
    if mode not in MODES:
        raise unknown_mode(mode)
    return ModeConfig(mode=mode)


def _fullgraph(t: Mapping[str, Any], base: Path, table: str) -> FullGraphConfig:
    """``table``: the name the file gave it (errors name what the user wrote, old name included)."""
    _check_keys(table, t, FullGraphConfig)
    d = FullGraphConfig()

    def cache(key: str) -> int | None:
        value = t.get(key, "auto")
        if value == "auto":
            return None
        # zero is a valid cache size (everything misses); parse_size insists on positive
        return 0 if value in (0, "0") else _size(table, key, value)

    superbatch = t.get("superbatch")
    return FullGraphConfig(
        superbatch=None if superbatch is None else _int(table, "superbatch", superbatch, minimum=1, maximum=1 << 20),
        sample_group=_int(table, "sample_group", t.get("sample_group", d.sample_group), minimum=1, maximum=1 << 16),
        neighbor_cache=cache("neighbor_cache"), feature_cache=cache("feature_cache"),
        staging_dir=_path(base, _str(table, "staging_dir", t.get("staging_dir", str(d.staging_dir)))))


def _renamed(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with each old table name (``RENAMED_TABLES``) read as its new one, and what the file called each
    renamed table; one warning per old name used, a UserError where both names are given."""
    tables, spelled = dict(data), {}
    for old, new in RENAMED_TABLES.items():
        if old not in tables:
            continue
        if new in tables:
            raise UserError(f"[{old}] and [{new}]: [{old}] is renamed [{new}]; keep only [{new}]")
        log.warning("[%s] is renamed [%s]: rename the table (the old name is read for now)", old, new)
        tables[new], spelled[new] = tables.pop(old), old
    return tables, spelled


def _sampler(t: Mapping[str, Any]) -> SamplerConfig:
    _check_keys("sampler", t, SamplerConfig)
    d = SamplerConfig()
    fanouts = _fanouts("sampler", "fanouts", t.get("fanouts", list(d.fanouts)))
    eval_fanouts = _fanouts("sampler", "eval_fanouts", t.get("eval_fanouts", list(fanouts)))
    if len(eval_fanouts) != len(fanouts):
        raise _fail("sampler", "eval_fanouts", f"needs one entry per hop ({len(fanouts)}), got {list(eval_fanouts)}")
    aggregation = _bool("sampler", "aggregation_cache", t.get("aggregation_cache", d.aggregation_cache))
    if aggregation and len(fanouts) < 2:
        raise _fail("sampler", "aggregation_cache", f"needs at least 2 hops (the cache replaces the last one), "
                                                    f"fanouts are {list(fanouts)}")
    return SamplerConfig(
        batch_size=_int("sampler", "batch_size", t.get("batch_size", d.batch_size), minimum=1),
        fanouts=fanouts, eval_fanouts=eval_fanouts,
        eval_batch_size=_int("sampler", "eval_batch_size", t.get("eval_batch_size", d.eval_batch_size), minimum=1),
        seed=_int("sampler", "seed", t.get("seed", d.seed), minimum=0, maximum=2**63 - 1),
        aggregation_cache=aggregation,
        eval_aggregation=_bool("sampler", "eval_aggregation", t.get("eval_aggregation", d.eval_aggregation)))


def _server(t: Mapping[str, Any], base: Path) -> ServerConfig:
    _check_keys("server", t, ServerConfig)
    d = ServerConfig()
    mode_text = t.get("socket_mode", "0660")
    try:
        mode = int(_str("server", "socket_mode", mode_text), 8)
    except ValueError:
        raise _fail("server", "socket_mode", f"expected an octal string such as \"0660\", got {mode_text!r}") from None
    if not 0 <= mode <= 0o777:
        raise _fail("server", "socket_mode", f"not a permission mode: {mode_text!r}")
    return ServerConfig(
        socket=_path(base, _str("server", "socket", t.get("socket", str(d.socket)))), socket_mode=mode,
        max_clients=_int_or_auto("server", "max_clients", t.get("max_clients", "auto"), minimum=1),
        max_frame_bytes=_size("server", "max_frame_bytes", t.get("max_frame_bytes", d.max_frame_bytes)),
        drain_timeout=_seconds("server", "drain_timeout", t.get("drain_timeout", d.drain_timeout)),
        allow_uids=_ids("server", "allow_uids", t.get("allow_uids", list(d.allow_uids))),
        allow_gids=_ids("server", "allow_gids", t.get("allow_gids", list(d.allow_gids))),
        stall_timeout=_seconds("server", "stall_timeout", t.get("stall_timeout", d.stall_timeout)),
        idle_timeout=_seconds("server", "idle_timeout", t.get("idle_timeout", d.idle_timeout)),
        max_pending=_int("server", "max_pending", t.get("max_pending", d.max_pending), minimum=1, maximum=65536),
        job_timeout=_seconds("server", "job_timeout", t.get("job_timeout", d.job_timeout)))


def _seconds(table: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise _fail(table, key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _ids(table: str, key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _fail(table, key, f"expected a list of numeric ids such as [1000], got {value!r}")
    # (uid_t)-1 is the kernel's "no id" (setresuid's "unchanged"), never a peer's
    return tuple(sorted({_int(table, key, v, minimum=0, maximum=2**32 - 2) for v in value}))


def config_from_mapping(data: Mapping[str, Any], *, base: Path = Path(".")) -> LoaderConfig:
    """Validate a parsed TOML document; relative paths resolve against ``base`` (the file's directory)."""
    data, spelled = _renamed(data)
    known = {f.name for f in fields(LoaderConfig)}
    for name in data:
        if name not in known:
            raise UserError(f"[{name}]: unknown table (known: {', '.join(sorted(known))})")
    ds = _table(data, "dataset")
    _check_keys("dataset", ds, DatasetConfig)
    if "path" not in ds:
        raise UserError("[dataset] path: required (the directory written by 'megabatch prepare')")
    dataset = DatasetConfig(path=_path(base, _str("dataset", "path", ds["path"])))

    mem = _table(data, "memory")
    _check_keys("memory", mem, MemoryConfig)
    memory = MemoryConfig(budget=_size("memory", "budget", mem.get("budget", MemoryConfig().budget)))

    io_t = _table(data, "io")
    _check_keys("io", io_t, IOConfig)
    dio = IOConfig()
    io = IOConfig(direct_io=_bool("io", "direct_io", io_t.get("direct_io", dio.direct_io)),
                  read_threads=_int("io", "read_threads", io_t.get("read_threads", dio.read_threads),
                                    minimum=1, maximum=64),
                  read_block=_size("io", "read_block", io_t.get("read_block", dio.read_block)),
                  check_reads=_bool("io", "check_reads", io_t.get("check_reads", dio.check_reads)),
                  sequential_rate=_size("io", "sequential_rate", io_t.get("sequential_rate", dio.sequential_rate)),
                  random_reads=_int("io", "random_reads", io_t.get("random_reads", dio.random_reads), minimum=1))
    if io.read_block % 4096:
        raise _fail("io", "read_block", f"must be a multiple of 4096, got {io.read_block}")

    pub = _table(data, "publisher")
    _check_keys("publisher", pub, PublisherConfig)
    slot_bytes_value = pub.get("slot_bytes", "auto")
    publisher = PublisherConfig(
        slots=_int_or_auto("publisher", "slots", pub.get("slots", "auto"), minimum=1, maximum=256),
        slot_bytes=None if slot_bytes_value == "auto" else _size("publisher", "slot_bytes", slot_bytes_value))

    met = _table(data, "metrics")
    _check_keys("metrics", met, MetricsConfig)
    metrics = MetricsConfig(address=_str("metrics", "address", met.get("address", MetricsConfig().address)),
                            port=_int("metrics", "port", met.get("port", MetricsConfig().port),
                                      minimum=0, maximum=65535))
    log_t = _table(data, "log")
    _check_keys("log", log_t, LogConfig)
    level = _str("log", "level", log_t.get("level", "info")).lower()
    if level not in ("debug", "info", "warning", "error"):
        raise _fail("log", "level", f"expected debug, info, warning or error, got {level!r}")

    link_t = _table(data, "link")
    _check_keys("link", link_t, LinkConfig)
    link = LinkConfig(negatives=_int("link", "negatives", link_t.get("negatives", LinkConfig().negatives), minimum=1,
                                     maximum=1 << 16),
                      disjoint=_bool("link", "disjoint", link_t.get("disjoint", LinkConfig().disjoint)),
                      order=_choice("link", "order", link_t.get("order", LinkConfig().order), LINK_BUFFER_ORDERS),
                      logical_partitions=_int_or_auto("link", "logical_partitions",
                                                      link_t.get("logical_partitions", "auto"), minimum=1),
                      negative_weights=_bool("link", "negative_weights",
                                             link_t.get("negative_weights", LinkConfig().negative_weights)),
                      assignment=_choice("link", "assignment", link_t.get("assignment", LinkConfig().assignment),
                                         LINK_ASSIGNMENTS))
    if link.order == "beta" and link.logical_partitions is not None:
        raise _fail("link", "logical_partitions", "BETA swaps physical partitions (order = \"comet\" takes it)")
    if link.order == "beta" and "assignment" in link_t:
        raise _fail("link", "assignment", "BETA trains each bucket in its first co-resident state (order = "
                                          "\"comet\" takes it)")

    mode = _mode(_table(data, "loader"))
    return LoaderConfig(dataset=dataset, loader=mode,
                        fullgraph=_fullgraph(_table(data, "fullgraph"), base, spelled.get("fullgraph", "fullgraph")),
                        memory=memory,
                        hierarchy=_hierarchy(_table(data, "hierarchy")),
                        sampler=_sampler(_table(data, "sampler")), link=link, io=io, publisher=publisher,
                        server=_server(_table(data, "server"), base), metrics=metrics, log=LogConfig(level))


def load_config(path: Path | str) -> LoaderConfig:
    """Read and validate a TOML config file."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise UserError(f"{file}: config file not found") from None
    except OSError as err:
        raise UserError(f"{file}: cannot read config ({err.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{file}: invalid TOML ({err})") from None
    try:
        return config_from_mapping(data, base=file.parent.resolve())
    except UserError as err:
        raise UserError(f"{file}: {err}") from None
