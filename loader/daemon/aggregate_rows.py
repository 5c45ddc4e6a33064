"""The aggregation cache's rows for a batch (``x_agg``): BatchGNN's first layer, served by every mode alike.

With ``[sampler] aggregation_cache`` a batch samples one hop fewer and carries, per node, its row of the
dataset's ``aggregates-KIND.bin`` (``megabatch aggregate``; docs/FORMAT.md, "Aggregation cache"). The file has
features.bin's layout, so a row sits at the byte offset the node's feature row has there.

The full-graph modes read these rows by checked preads of exactly the batch's rows (``AggregateRows``), after the
batch's ids are written: what they keep in RAM (a Belady cache, a staged superbatch) holds feature rows, and a
node's aggregate is needed only where it sits in hops 0 to L-1, which is where the cache's saving comes from
(BatchGNN, Appendix C). The hierarchical mode holds its mega-batch's and its static nodes' rows in its arena
(read with the partitions, and through ``AggregateRows`` once at startup), and its evaluation reads by id as the
others do. The reads are counted under their own file in the read metrics (``file="aggregates"``), so the bytes a
batch costs with the cache are measured, not inferred.
"""

import logging
from dataclasses import dataclass

import numpy as np

from loader.caches.row_reader import DEFAULT_MAX_SPAN, RowReader
from loader.daemon.config import IOConfig
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.row_reads import read_rows_counted
from loader.format.aggregates import AggregationCache, aggregation_bytes, dataset_cache
from loader.format.dataset import Dataset
from loader.format.partition_table import row_offsets_for
from loader.format.read_checks import block_table
from proto.errors import UserError
from proto.sizes import format_size

__all__ = ["AggregateRows", "AggregateFill", "AggregationEstimate", "READ_THREADS", "METRIC_FILE",
           "require_cache"]

log = logging.getLogger("megabatch.aggregates")

READ_THREADS = 32
"""Preads in flight for a batch's aggregate rows: they lie scattered over the file as the exact mode's misses do,
and the disk serves random reads fastest with many in flight (the exact mode's ``disk_graph.ROW_READ_THREADS``,
32: 8 MiB of bounce buffers; that module imports this one's users, so the number is repeated, not imported).
bench/compare's first run with --aggregation-cache read with 8."""
METRIC_FILE = "aggregates"
"""The ``file`` label of these reads in the read metrics."""


def require_cache(dataset: Dataset) -> AggregationCache:
    """The dataset's aggregation cache; a one-line error naming the command that builds one where it has none."""
    cache = dataset_cache(dataset)
    if cache is None:
        raise UserError(f"[sampler] aggregation_cache: {dataset.path} has no aggregation cache; build one with "
                        f"'megabatch aggregate {dataset.path} --kind mean' (gcn for a GCN trainer)")
    entry = dataset.manifest.files.get(cache.file)
    path = dataset.path / cache.file
    size = path.stat().st_size if path.is_file() else -1
    if entry is None or size != entry.bytes:
        raise UserError(f"{path}: missing or not the size the manifest records; run 'megabatch aggregate' again")
    return cache


class AggregateRows:
    """Reads the aggregation cache's rows of dataset ids into a slot's ``x_agg``; one per daemon, shared by its
    sessions (``RowReader`` serializes calls and overlaps each call's reads)."""

    def __init__(self, dataset: Dataset, cache: AggregationCache, io: IOConfig, metrics: DaemonMetrics) -> None:
        m = dataset.manifest
        self.kind = cache.kind
        self.row_bytes = m.row_bytes
        parts = dataset.partitions()
        self._node_begin, self._feat_offset = parts.node_begin, parts.feat_offset
        self._metrics = metrics
        sums = None
        if io.check_reads:
            sums = block_table(dataset, cache.checks, cache.file, cache.check_block)
        self.path = dataset.path / cache.file
        self.block_sums = sums
        """The file's block checksums (``cache.check_block`` bytes each), None where reads go unchecked: a mode
        that reads whole ranges of the file (the hierarchical mode's partitions) checks them against these."""
        self.check_block = cache.check_block
        self._rows = RowReader(dataset.path / cache.file, row_bytes=m.row_bytes, direct=io.direct_io,
                               threads=READ_THREADS, block_sums=sums, check_block=cache.check_block)
        self.nbytes = READ_THREADS * DEFAULT_MAX_SPAN + (0 if sums is None else sums.nbytes)
        """RAM the reader holds (its bounce buffers and block checksums): what the memory plans charge."""

    def fill(self, ids: np.ndarray, out: np.ndarray, purpose: str, positions: np.ndarray | None = None) -> None:
        """The rows of dataset ids ``ids`` into ``out`` ((n, D) in the feature dtype; row ``positions[i]`` for id
        i, default rows 0..len(ids)-1), counted under ``purpose`` (``read_metrics.PURPOSES``). A failed read is a
        ``UserError`` naming the file."""
        offsets = row_offsets_for(ids, self._node_begin, self._feat_offset, self.row_bytes)
        read_rows_counted(self._rows, offsets, out.reshape(len(out), -1).view(np.uint8), positions, self._metrics,
                          METRIC_FILE, purpose)

    def for_purpose(self, purpose: str) -> "AggregateFill":
        return AggregateFill(self, purpose)

    def close(self) -> None:
        self._rows.close()


@dataclass(frozen=True)
class AggregateFill:
    """What a publisher fills a slot's ``x_agg`` with: the reader, and whose reads they are in the metrics."""

    rows: AggregateRows
    purpose: str

    def fill(self, ids: np.ndarray, out: np.ndarray, positions: np.ndarray | None = None) -> None:
        self.rows.fill(ids, out, self.purpose, positions)


HELD_WHERE = ("held with their mega-batch's features (read with each partition; a mega-batch takes twice the bytes, "
              "so fewer partitions fit)")
"""Where the hierarchical mode takes x_agg's rows from, as the startup line says it."""


@dataclass(frozen=True)
class AggregationEstimate:
    """The cache's cost model for one configuration (BatchGNN, Appendix C, in rows a batch fetches): a pilot's
    mean batch with every hop sampled, and the same batch with the cache (hops 0..L-1, two rows each)."""

    kind: str
    nodes_per_hop: tuple[float, ...]
    """Mean sampled nodes per hop of the pilot's training batches (seeds first), every hop sampled."""
    row_bytes: int

    @property
    def bytes_without(self) -> int:
        return aggregation_bytes([round(h) for h in self.nodes_per_hop], self.row_bytes)[0]

    @property
    def bytes_with(self) -> int:
        return aggregation_bytes([round(h) for h in self.nodes_per_hop], self.row_bytes)[1]

    @property
    def rows_without(self) -> int:
        return round(sum(self.nodes_per_hop))

    @property
    def rows_with(self) -> int:
        return 2 * round(sum(self.nodes_per_hop[:-1]))

    @property
    def pays(self) -> bool:
        return self.bytes_with < self.bytes_without

    def describe(self, enabled: bool, mode: str) -> str:
        """The startup line: rows and bytes per training batch with and without the cache, the verdict, and where
        mode ``mode`` takes x_agg's rows from."""
        verdict = ("fetches fewer rows" if self.pays else
                   "fetches MORE rows: turn [sampler] aggregation_cache off" if enabled else "would fetch more rows")
        state = "on" if enabled else "off ([sampler] aggregation_cache = true turns it on)"
        return (f"aggregation cache ({self.kind}) {state}: a training batch fetches about "
                f"{self.rows_without:,} rows ({format_size(self.bytes_without)}) without it, "
                f"{self.rows_with:,} ({format_size(self.bytes_with)}) with it: the cache {verdict}; half of those are "
                f"x_agg rows, " + (HELD_WHERE if mode == "hierarchical" else "read from disk per batch (a cache holds "
                                   "x rows only)"))
