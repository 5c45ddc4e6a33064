"""How a reader reports the read requests it makes to whoever counts them, without importing the counters.

The daemon owns its metrics (prometheus_client lives in ``loader.daemon`` only), but some reads happen deep inside
the layers below it, interleaved with other work: the exact sampler's neighbour-list reads happen between the
hops of a sample pass, and only the sampler knows where one read request starts and ends. Such code takes a
``ReadRecorder`` from its caller and calls it once per read request (never per row or per list: one request is a
whole coalesced set of preads issued together), and the daemon passes one bound to the file and the purpose
(training or evaluation) of the reads (``loader.daemon.read_metrics.ReadMeter``).

Readers whose requests are one call of their own (``RowReader.read_rows``, a sequential pass's chunks, a staging
region's pieces) return what they did instead (seconds, bytes, preads), and their callers in the daemon record it.
"""

from typing import Protocol

__all__ = ["ReadRecorder"]


class ReadRecorder(Protocol):
    """Receives one read request at a time."""

    def record(self, seconds: float, nbytes: int, reads: int) -> None:
        """One request took ``seconds`` (issue to last byte, its checks included), returned ``nbytes`` bytes from
        the file and took ``reads`` pread calls."""
        ...
