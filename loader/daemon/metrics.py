"""The daemon's Prometheus metrics (names in docs/DEPLOY.md; base units; counters end in _total).

Metrics live on a registry of their own (tests create many daemons in one process). Queue
depths and slot occupancy are read at scrape time by a collector, so the hot path never
updates a gauge it would only overwrite.
"""

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loader import __version__
from loader.daemon.http_endpoint import NO_PROBES, HttpEndpoint, Probes, serve_http
from loader.daemon.read_metrics import SERVED_PURPOSES, HasClientInfo, ReadMeter, ReadPathCollector, purpose_of

__all__ = ["DaemonMetrics", "QueueProbe", "READ_LATENCY_BUCKETS", "STAGES", "REFUSAL_REASONS", "EVICTION_REASONS"]

READ_LATENCY_BUCKETS = (50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
                        500e-3, 1.0, 2.5, 5.0)
"""Disk reads here take 0.1-10 ms; the client's default buckets start at 5 ms."""

LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

STAGES = ("scheduler", "reader", "assembler", "sampler", "planner", "publisher", "eval", "rows", "staging")
"""Stage labels of ``megabatch_stage_busy_seconds``. "rows" is the feature-row reads from disk of the full-graph
modes and of evaluation in the hierarchical and mmap modes (checks included; in mode staged, the read-back of a
batch's staged region), a part of "publisher" (and of "eval") time: the breakdown of a batch's time. "staging"
is mode staged's pass over the feature file and its staging writes, a part of "planner" time."""

REFUSAL_REASONS = ("forbidden", "pending", "busy", "job", "aggregation")
"""Why a connection was closed before it became a session: a peer outside ``[server] allow_uids`` /
``allow_gids``, too many connections waiting for their Hello (``max_pending``), ``max_clients`` reached,
or a job rank that does not fit its job (wrong sizes, a rank twice, a job this daemon cannot serve)."""

EVICTION_REASONS = ("stall", "unread")
"""Why a session was evicted: its stream waited ``[server] stall_timeout`` for a release or credit, or it
left the replies unread for ``stall_timeout``. (A holder of the training pipeline idle past
``idle_timeout`` is not evicted: it loses the pipeline, ``pipeline_revoked``, and stays connected.)"""


@dataclass
class QueueProbe:
    """A named bounded queue whose depth is reported at scrape time."""

    name: str
    queue: "asyncio.Queue[object]"


@dataclass
class _Probes:
    queues: dict[str, QueueProbe] = field(default_factory=dict)
    slots: Callable[[], tuple[int, int]] | None = None


class _ScrapeCollector(Collector):
    def __init__(self, probes: _Probes) -> None:
        self._probes = probes

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("megabatch_queue_depth", "Items waiting in a stage queue", labels=["queue"])
        capacity = GaugeMetricFamily("megabatch_queue_capacity", "Bound of a stage queue", labels=["queue"])
        for name, probe in sorted(self._probes.queues.items()):
            depth.add_metric([name], probe.queue.qsize())
            capacity.add_metric([name], probe.queue.maxsize)
        yield depth
        yield capacity
        in_use, total = self._probes.slots() if self._probes.slots else (0, 0)
        yield GaugeMetricFamily("megabatch_slots_in_use", "Shared-memory slots holding unreleased batches",
                                value=in_use)
        yield GaugeMetricFamily("megabatch_slots_capacity", "Shared-memory slots of all connected clients",
                                value=total)


class DaemonMetrics:
    """Every metric the daemon exports; one instance per daemon."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._probes = _Probes()
        self.build_info = Info("megabatch_build", "Version, dataset and mode of this daemon", registry=r)
        self.memory_budget = Gauge("megabatch_memory_budget_bytes", "Configured memory budget", registry=r)
        # present only where the dataset has an aggregation cache (megabatch aggregate)
        self.aggregation_enabled = Gauge("megabatch_aggregation_cache_enabled", "Whether batches carry the "
                                         "dataset's aggregation cache (x_agg; [sampler] aggregation_cache)", registry=r)
        self.aggregation_rows = Gauge("megabatch_aggregation_estimate_rows", "Rows a training batch fetches "
                                      "without and with the aggregation cache, from the startup pilot (the cost model)",
                                      ["cache"], registry=r)
        self.aggregation_bytes = Gauge("megabatch_aggregation_estimate_bytes", "Feature bytes a training batch "
                                       "fetches without and with the aggregation cache, from the startup pilot",
                                       ["cache"], registry=r)
        # by purpose (read_metrics.PURPOSES): the exact modes' training and evaluation share one reader
        self.disk_bytes = Counter("megabatch_disk_read_bytes", "Bytes read from the dataset (and staging files)",
                                  ["file", "purpose"], registry=r)
        self.disk_reads = Counter("megabatch_disk_reads", "preadv calls on the dataset (and staging files)",
                                  ["file", "purpose"], registry=r)
        self.read_check_failures = Counter(
            "megabatch_read_check_failures", "Reads whose bytes failed their checksum (format 1.1+ read checks); "
            "each failed the batch that needed them", ["file"], registry=r)
        self.disk_seconds = Histogram("megabatch_disk_read_seconds", "Latency of one read request (a pread, or the "
                                      "preads issued together for a batch's rows or a hop's lists)",
                                      ["file", "purpose"], buckets=READ_LATENCY_BUCKETS, registry=r)
        self.staging_written_bytes = Counter("megabatch_staging_written_bytes", "Bytes mode staged wrote to its "
                                             "staging files (kind: rows, or the sampled edges it spills)", ["kind"],
                                             registry=r)
        self.staging_file_bytes = Gauge("megabatch_staging_file_bytes", "Bytes of disk mode staged's scratch files "
                                        "take, in use and kept for later superbatches (kind: rows, or the spilled "
                                        "ids and edges)", ["kind"], registry=r)
        self.stage_busy = Counter("megabatch_stage_busy_seconds", "Seconds a stage spent working (not waiting)",
                                  ["stage"], registry=r)
        self.static_nodes = Gauge("megabatch_static_cache_nodes", "Nodes in the static cache", registry=r)
        self.static_bytes = Gauge("megabatch_static_cache_bytes", "Bytes of the static cache", registry=r)
        self.mb_nodes = Gauge("megabatch_megabatch_nodes", "Nodes of the current mega-batch (static included)",
                              registry=r)
        self.mb_edges = Gauge("megabatch_megabatch_edges", "Edges of the current mega-batch subgraph", registry=r)
        self.mb_bytes = Gauge("megabatch_megabatch_bytes", "Bytes read for the current mega-batch", registry=r)
        self.mb_loaded = Counter("megabatch_megabatches_loaded", "Mega-batches read and assembled", registry=r)
        self.partitions_loaded = Counter("megabatch_partitions_loaded",
                                         "Partitions a mega-batch took: read from the disk, or copied from the "
                                         "previous mega-batch's buffer where it held them", ["source"], registry=r)
        self.mb_load_seconds = Histogram("megabatch_megabatch_load_seconds", "Read + assemble time per mega-batch",
                                         buckets=LOAD_BUCKETS, registry=r)
        self.feature_cache_lookups = Counter("megabatch_feature_cache_lookups",
                                             "Feature rows of published batches by where they came from "
                                             "(full-graph modes)", ["result"], registry=r)
        self.neighbor_cache_lookups = Counter("megabatch_neighbor_cache_lookups",
                                              "Neighbour lists the sampler needed, by where they came from "
                                              "(exact and static modes)", ["result"], registry=r)
        self.trainer_cache_rows = Counter("megabatch_trainer_cache_rows",
                                          "Feature rows of training batches for clients with a feature cache: "
                                          "taken from the client's cache (hit) or shipped in the slot",
                                          ["result"], registry=r)
        self.feature_cache_bytes = Gauge("megabatch_feature_cache_bytes", "Bytes of the feature cache", registry=r)
        self.neighbor_cache_bytes = Gauge("megabatch_neighbor_cache_bytes", "Bytes of the neighbour cache",
                                          registry=r)
        self.mb_coverage = Gauge("megabatch_megabatch_neighbour_coverage_ratio",
                                 "Share of the neighbour slots full-graph sampling fills that the last mega-batch's "
                                 "first pass filled", registry=r)
        self.mb_label_skew = Gauge("megabatch_megabatch_label_skew",
                                   "Total variation distance between the last mega-batch's training labels and the "
                                   "epoch's", registry=r)
        self.epoch_coverage = Gauge("megabatch_epoch_neighbour_coverage_ratio",
                                    "Neighbour coverage of the last complete epoch (warned below the documented "
                                    "threshold)", registry=r)
        self.epoch_label_skew = Gauge("megabatch_epoch_label_skew",
                                      "Seed-weighted label skew of the last complete epoch's mega-batches", registry=r)
        self.epoch_label_skew_excess = Gauge("megabatch_epoch_label_skew_excess",
                                             "Label skew of the last complete epoch beyond what random groups of "
                                             "as many seeds have (what predicts an accuracy loss)", registry=r)
        self.neighbour_slots = Counter("megabatch_neighbour_slots",
                                       "Neighbour slots of sampled targets: filled inside the mega-batch and static "
                                       "cache, or lost to the cut", ["result"], registry=r)
        self.quality_warnings = Counter("megabatch_quality_warnings",
                                        "Epochs whose coverage or label skew crossed its threshold", ["kind"],
                                        registry=r)
        self.passes = Gauge("megabatch_passes_per_megabatch", "Passes run over the last mega-batch", registry=r)
        self.published = Counter("megabatch_batches_published", "Batches written to slots", ["kind"], registry=r)
        self.published_bytes = Counter("megabatch_published_bytes", "Payload bytes written to slots", registry=r)
        self.seeds_published = Counter("megabatch_seeds_published", "Seed nodes (samples) of published batches",
                                       ["kind"], registry=r)
        self.feature_bytes_served = Counter("megabatch_feature_bytes_served", "Feature bytes of published batches "
                                            "(rows x row bytes): what read amplification divides by", ["purpose"],
                                            registry=r)
        self.memory_plan = Gauge("megabatch_memory_plan_bytes", "Bytes of [memory] budget the mode's memory plan "
                                 "charges", registry=r)
        self.epoch = Gauge("megabatch_epoch", "Epoch being produced", registry=r)
        self.pass_index = Gauge("megabatch_pass", "Pass over the current mega-batch", registry=r)
        self.clients = Gauge("megabatch_clients", "Connected clients", registry=r)
        self.training_queue_position = Gauge(
            "megabatch_training_queue_position", "Per trainer (a session or a job of several ranks): 0 while it "
            "holds the training pipeline, 1, 2, ... while it waits in the training queue", ["trainer"], registry=r)
        self.protocol_errors = Counter("megabatch_protocol_errors", "Clients disconnected for protocol errors",
                                       ["code"], registry=r)
        self.refused_connections = Counter("megabatch_refused_connections",
                                           "Connections closed before they became sessions, by reason",
                                           ["reason"], registry=r)
        self.evictions = Counter("megabatch_evictions", "Sessions the daemon closed because their client stalled "
                                 "or left its messages unread, by reason", ["reason"], registry=r)
        self.pipeline_revoked = Counter("megabatch_training_pipeline_revoked",
                                        "Times the training pipeline's holder lost it to a waiting trainer after "
                                        "running no training stream for [server] idle_timeout", registry=r)
        self.accept_errors = Counter("megabatch_accept_errors", "Failed accept calls on the control socket "
                                     "(EMFILE, ENFILE, ...)", registry=r)
        for stage in STAGES:
            self.stage_busy.labels(stage)
        for kind in ("train", "val", "test"):
            self.published.labels(kind)
            self.seeds_published.labels(kind)
        for purpose in SERVED_PURPOSES:
            self.feature_bytes_served.labels(purpose)
        for result in ("hit", "miss"):
            self.feature_cache_lookups.labels(result)
            self.neighbor_cache_lookups.labels(result)
        self.feature_cache_lookups.labels("fill")
        self.feature_cache_lookups.labels("resident")
        for result in ("filled", "lost"):
            self.neighbour_slots.labels(result)
        for kind in ("coverage", "skew"):
            self.quality_warnings.labels(kind)
        for result in ("hit", "shipped"):
            self.trainer_cache_rows.labels(result)
        for reason in REFUSAL_REASONS:
            self.refused_connections.labels(reason)
        for reason in EVICTION_REASONS:
            self.evictions.labels(reason)
        r.register(_ScrapeCollector(self._probes))
        self._read_path = ReadPathCollector(self.disk_bytes, self.feature_bytes_served)
        self._read_meters: dict[tuple[str, str], ReadMeter] = {}
        r.register(self._read_path)
        ProcessCollector(registry=r)  # process_resident_memory_bytes etc. (not on a private registry by default)

    def watch_queue(self, name: str, queue: "asyncio.Queue[object]") -> None:
        self._probes.queues[name] = QueueProbe(name, queue)

    def unwatch_queue(self, name: str) -> None:
        self._probes.queues.pop(name, None)

    def watch_slots(self, probe: Callable[[], tuple[int, int]]) -> None:
        self._probes.slots = probe

    def watch_clients(self, sessions: Mapping[int, HasClientInfo]) -> None:
        """``megabatch_client_info``: one series per session of ``sessions`` (the server's live map) at each scrape."""
        self._read_path.sessions = sessions

    def read_meter(self, file: str, purpose: str) -> ReadMeter:
        """The read metrics of ``file``'s reads for ``purpose`` (one of ``read_metrics.PURPOSES``)."""
        meter = self._read_meters.get((file, purpose))
        if meter is None:  # a race here makes two meters over the same children: harmless
            meter = self._read_meters[(file, purpose)] = ReadMeter(self.disk_seconds, self.disk_bytes,
                                                                   self.disk_reads, file, purpose)
        return meter

    def count_published(self, kind: str, seeds: int, feature_bytes: int, payload_bytes: int) -> None:
        """One batch of ``kind`` (train, val, test) published: its seeds, its rows' feature bytes, its slot bytes."""
        self.published.labels(kind).inc()
        self.seeds_published.labels(kind).inc(seeds)
        self.feature_bytes_served.labels(purpose_of(kind)).inc(feature_bytes)
        self.published_bytes.inc(payload_bytes)

    def set_aggregation(self, enabled: bool, rows: tuple[int, int], nbytes: tuple[int, int]) -> None:
        """The aggregation cache's state and its cost model's (without, with) rows and bytes per training batch."""
        self.aggregation_enabled.set(1 if enabled else 0)
        for cache, row_count, size in zip(("without", "with"), rows, nbytes):
            self.aggregation_rows.labels(cache).set(row_count)
            self.aggregation_bytes.labels(cache).set(size)

    def set_build(self, dataset: str, mode: str, *, measures_quality: bool = False) -> None:
        # the mode's capability travels with its name, so that `megabatch status` need not know which modes measure
        self.build_info.info({"version": __version__, "dataset": dataset, "mode": mode,
                              "measures_quality": "true" if measures_quality else "false"})

    def serve(self, address: str, port: int, probes: Probes = NO_PROBES) -> HttpEndpoint | None:
        """Start the HTTP endpoint (``http_endpoint``: /metrics, and /healthz and /readyz answered by ``probes``);
        port 0 disables it. A port that cannot be bound is a ``UserError`` naming the address, port and key."""
        return serve_http(self.registry, address, port, probes) if port else None
