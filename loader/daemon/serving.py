"""What every client session needs from the daemon, whatever the training mode.

The hierarchical pipeline and the full-graph modes build their own stage contexts; a session
only publishes batches, samples evaluation batches and counts, so it sees just this.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from loader.daemon.config import LoaderConfig
from loader.daemon.metrics import DaemonMetrics

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
