"""What every client session needs from the daemon, whatever the training mode.

The hierarchical pipeline and the full-graph modes build their own stage contexts; a session
only publishes batches, samples evaluation batches and counts, so it sees just this.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from loader.daemon.aggregate_rows import AggregateFill, AggregateRows, AggregationEstimate
from loader.daemon.config import LoaderConfig
from loader.daemon.link_serving import LinkServing
from loader.daemon.metrics import DaemonMetrics
from loader.daemon.read_metrics import purpose_of
from loader.daemon.slot_source import RowSource, SlotSource, coded_rows
from loader.format.feature_codec import FeatureCodec

__all__ = ["ServingContext"]


@dataclass(frozen=True)
class ServingContext:
    """Resolved once at startup, read-only afterwards."""

    config: LoaderConfig
    metrics: DaemonMetrics
    cpu_pool: ThreadPoolExecutor
    """Runs publisher gathers and evaluation sampling (numba kernels drop the GIL)."""
    labels: np.ndarray
    """int64 (N,) label per dataset id, -1 = unlabeled."""
    split_ids: dict[str, np.ndarray]
    """"train", "val", "test" -> sorted int64 dataset ids."""
    feat_dim: int
    feat_dtype: np.dtype
    aggregates: AggregateRows | None = None
    """The aggregation cache's rows (``[sampler] aggregation_cache``), read into batches' ``x_agg``; None: off."""
    aggregation_estimate: AggregationEstimate | None = None
    """The cache's cost model from the startup pilot, where the dataset has a cache (on or off)."""
    link: LinkServing | None = None
    """A link-prediction dataset's splits (``loader.daemon.link_serving``); None: node classification."""
    codec: FeatureCodec | None = None
    """8-bit feature codes' column ranges (``feat_dtype`` uint8): rows are kept and read as codes (``feat_dtype``)
    and decoded as a slot is written; None: rows are shipped as stored."""

    @property
    def value_dtype(self) -> np.dtype:
        """What a batch's ``x`` holds: ``feat_dtype``, or float32 for codes."""
        return self.feat_dtype if self.codec is None else np.dtype(np.float32)

    def slot_source(self, rows: RowSource, label_of: np.ndarray, id_of: np.ndarray | None, **extra: Any
                    ) -> SlotSource:
        """A pass's ``SlotSource`` over ``rows`` (stored rows; decoded as written where the dataset holds codes)."""
        return SlotSource(coded_rows(rows, self.codec, self.feat_dim), label_of, id_of, self.feat_dim,
                          self.value_dtype, **extra)

    def close(self) -> None:
        """Close what the context opened (the aggregate reader); the pool is the caller's."""
        if self.aggregates is not None:
            self.aggregates.close()

    def aggregates_for(self, kind: str) -> AggregateFill | None:
        """What a batch of ``kind`` ("train", "val", "test") fills ``x_agg`` from, or None (no ``x_agg``)."""
        if self.aggregates is None or (kind != "train" and not self.config.sampler.eval_aggregation):
            return None
        return self.aggregates.for_purpose(purpose_of(kind))
