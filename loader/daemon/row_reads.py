"""One request of rows read at random through a ``RowReader``, as the daemon's streams make it: errors turned into the
one line that names the file, its seconds charged to the publisher's "rows" stage and its bytes to the read metrics.

``DiskGraph.read_rows`` (features.bin) and ``AggregateRows.fill`` (the aggregation cache) both read this way.
"""

import time

import numpy as np

from loader.caches.row_reader import RowReader
from loader.daemon.metrics import DaemonMetrics
from proto.errors import UserError

__all__ = ["read_rows_counted"]


def read_rows_counted(rows: RowReader, offsets: np.ndarray, out: np.ndarray, positions: np.ndarray | None,
                      metrics: DaemonMetrics, file: str, purpose: str) -> None:
    """The rows at byte ``offsets`` of ``rows``'s file into ``out`` (row ``positions[i]`` for offset i; None: in
    order), counted under ``file`` and ``purpose``. A failed read is a ``UserError`` naming the file and what to run."""
    started = time.perf_counter()
    try:
        stats = rows.read_rows(offsets, out, positions)
    except OSError as err:  # RowReader's message names the byte; the stream's error should too, on one line
        raise UserError(f"{rows.path}: {err.strerror}; check the disk (dmesg) and run 'megabatch verify'") from err
    except ValueError as err:
        # the offsets come from the manifest's partitions: one past the end means the file shrank
        raise UserError(f"{err} (the file shrank after the daemon started?); run 'megabatch verify'") from err
    finally:
        # part of the publisher's (or an evaluation's) time: what the batch waits on the disk for
        metrics.stage_busy.labels("rows").inc(time.perf_counter() - started)
    if stats.rows:  # an empty request reads nothing and is not a request
        metrics.read_meter(file, purpose).record(stats.seconds, stats.bytes, stats.reads)
