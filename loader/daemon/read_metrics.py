"""What the daemon's reads cost, per file and per purpose, and who its clients are: the metrics an operator needs to
see the read path of a running daemon (docs/DEPLOY.md, "Metrics reference"; ``megabatch status`` and ``top``).

Every read of the dataset after startup is counted where it is made, once per read request (a partition's pread,
a ``RowReader`` call, a round of neighbour lists, a sequential pass's chunk, a staging region's piece), never per
row: ``ReadMeter.record`` observes the request's latency in ``megabatch_disk_read_seconds`` and adds its bytes and
preads to the counters, all under the labels ``file`` and ``purpose``. The purpose tells apart the reads of the
training stream, of evaluation streams and of the caches filled at startup, which the exact modes' shared reader
and sampler would otherwise mix.

Served bytes (``megabatch_feature_bytes_served_total``) are counted per published batch: its rows times the row's
bytes. Read amplification is then read bytes over served bytes per purpose: a PromQL ratio over any window, and
``megabatch_read_amplification_ratio`` over the daemon's life, computed from the counters at scrape time (nothing
on the hot path). Client info is read at scrape time from the sessions connected then, so a client's series goes
when it disconnects and there are at most ``max_clients`` of them.
"""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from loader.daemon.peers import PeerCredentials

if TYPE_CHECKING:  # the metrics are imported by every daemon module; the staging layer only by the modes
    from loader.daemon.session import Session
    from loader.staging.sequential_reader import StagingStats

__all__ = ["PURPOSES", "SERVED_PURPOSES", "TRAIN", "EVAL", "STARTUP", "ReadMeter", "ClientInfo", "HasClientInfo",
           "CLIENT_LABELS", "CLIENT_NAME_CHARS", "ReadPathCollector", "client_info", "purpose_of"]

TRAIN, EVAL, STARTUP = "train", "eval", "startup"
PURPOSES = (TRAIN, EVAL, STARTUP)
"""Values of the ``purpose`` label: a training stream's reads, an evaluation stream's, and the caches a mode fills
once at startup (its degree-ranked feature cache, the neighbour cache), which serve no batch of their own and
would otherwise inflate the training stream's amplification."""
SERVED_PURPOSES = (TRAIN, EVAL)
"""The purposes batches are published for (and amplification is computed for)."""


def purpose_of(kind: str) -> str:
    """The read purpose of a published batch's kind (train, val, test)."""
    return TRAIN if kind == "train" else EVAL


class ReadMeter:
    """The read metrics of one (file, purpose), resolved once (a label lookup per read would cost a dict and a
    lock each). A ``loader.format.read_latency.ReadRecorder``."""

    def __init__(self, seconds: Histogram, nbytes: Counter, reads: Counter, file: str, purpose: str) -> None:
        self._seconds = seconds.labels(file, purpose)
        self._bytes = nbytes.labels(file, purpose)
        self._reads = reads.labels(file, purpose)

    def record(self, seconds: float, nbytes: int, reads: int) -> None:
        """One read request: its latency, bytes and preads."""
        self._seconds.observe(seconds)
        self.count(nbytes, reads)

    def count(self, nbytes: int, reads: int) -> None:
        """Bytes and preads whose requests' latencies are observed apart (``observe``) or not timed."""
        if nbytes:
            self._bytes.inc(nbytes)
        if reads:
            self._reads.inc(reads)

    def observe(self, seconds: Iterable[float]) -> None:
        """The latencies of several requests whose bytes are counted as a whole (``count``)."""
        for value in seconds:
            self._seconds.observe(value)

    def record_pass(self, stats: "StagingStats") -> None:
        """A sequential pass over ``features.bin``: each chunk one request."""
        self.observe(stats.chunk_seconds)
        self.count(stats.file_bytes_read, stats.chunks)


@dataclass(frozen=True)
class ClientInfo:
    """A connected client as ``megabatch_client_info`` labels it."""

    session: int
    client: str
    """The name the client gave in its Hello, made safe for a log line (``session.loggable``)."""
    pid: int
    uid: int
    """The peer's credentials (``SO_PEERCRED``); -1 where the kernel gave none."""
    job: str
    """The job's name ("" for a lone trainer, a job of one rank)."""
    rank: int

    def labels(self) -> list[str]:
        return [str(self.session), self.client, str(self.pid), str(self.uid), self.job, str(self.rank)]


CLIENT_LABELS = ["session", "client", "pid", "uid", "job", "rank"]
CLIENT_NAME_CHARS = 64
"""Characters of a client's name kept in its label (the name is the client's choice; a series is kept per client)."""


def _sums_by_purpose(counter: Counter) -> dict[str, float]:
    """A counter's ``_total`` samples summed over every label but ``purpose``."""
    sums: dict[str, float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                purpose = sample.labels.get("purpose", "")
                sums[purpose] = sums.get(purpose, 0.0) + sample.value
    return sums


def client_info(session: "Session", name: str, peer: PeerCredentials | None) -> ClientInfo:
    """Who ``session``'s client is, once it has joined its job: ``name`` (its Hello's, made safe by the caller), the
    kernel's credentials of the peer (None: the kernel gave none), its job and rank."""
    job = session.job
    return ClientInfo(session.id, name, peer.pid if peer else -1, peer.uid if peer else -1,
                      (job.job.name or "") if job is not None else "", job.rank if job is not None else 0)


class HasClientInfo(Protocol):
    client_info: ClientInfo | None


class ReadPathCollector(Collector):
    """Scrape-time metrics of the read path: the lifetime read amplification per purpose, and one info series per
    connected client (``sessions``, the server's live map of them, set by ``DaemonMetrics.watch_clients``)."""

    def __init__(self, read_bytes: Counter, served_bytes: Counter) -> None:
        self._read_bytes, self._served_bytes = read_bytes, served_bytes
        self.sessions: Mapping[int, HasClientInfo] = {}

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily("megabatch_read_amplification_ratio", "Bytes read from disk per byte of feature "
                                  "rows served, since the daemon started (no series before the first batch)",
                                  labels=["purpose"])
        read, served = _sums_by_purpose(self._read_bytes), _sums_by_purpose(self._served_bytes)
        for purpose in SERVED_PURPOSES:
            if served.get(purpose):
                ratio.add_metric([purpose], read.get(purpose, 0.0) / served[purpose])
        yield ratio
        info = InfoMetricFamily("megabatch_client", "A connected client: its session, name, peer pid and uid, job "
                                "and rank", labels=CLIENT_LABELS)
        # scrapes run on the HTTP server's thread: a copy of the map, which the event loop changes
        for session in list(self.sessions.values()):
            if session.client_info is not None:
                info.add_metric(session.client_info.labels(), {})
        yield info
