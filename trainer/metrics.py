"""Prometheus metrics of the trainer, on a registry of its own, served over HTTP when asked.

A registry of its own (not prometheus-client's global default) keeps the trainer's families
apart from anything else imported into the process and lets tests build several instances. So the
default registry's process and platform collectors are registered on it by hand: the dashboard's
trainer-memory panel reads ``process_resident_memory_bytes{job="megabatch-trainer"}``.

Per-epoch gauges (loss, samples/s, data-wait ratio) move once an epoch; the counters move with every
step, so ``rate()`` over them gives live samples/s and a live data-wait share (an alert on the gauge
fires an epoch late).
"""

import importlib.metadata
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

__all__ = ["TrainerMetrics", "LATENCY_BUCKETS", "package_version"]

LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Histogram buckets in seconds: 100 us (a batch already waiting in shared memory) to 10 s (a stall)."""


def package_version() -> str:
    """The installed megabatch version, or "unknown" when running from an uninstalled tree."""
    try:
        return importlib.metadata.version("megabatch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class TrainerMetrics:
    """The ``megabatch_trainer_*`` and ``process_*`` families; ``serve(port)`` exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.batch_wait = Histogram("megabatch_trainer_batch_wait_seconds",
                                    "Time the training loop blocked waiting for its next batch",
                                    buckets=LATENCY_BUCKETS, registry=reg)
        self.step = Histogram("megabatch_trainer_step_seconds", "Forward, backward and optimizer step of one batch",
                              buckets=LATENCY_BUCKETS, registry=reg)
        self.samples = Counter("megabatch_trainer_samples", "Seed nodes trained on", registry=reg)
        self.data_wait = Counter("megabatch_trainer_data_wait_seconds",
                                 "Time the training loop waited for its next batch (data and its device copy)",
                                 registry=reg)
        self.samples_per_second = Gauge("megabatch_trainer_samples_per_second",
                                        "Seed nodes trained per second in the last epoch", registry=reg)
        self.loss = Gauge("megabatch_trainer_loss", "Mean training loss of the last epoch", registry=reg)
        self.accuracy = Gauge("megabatch_trainer_accuracy", "Accuracy of the last evaluation", ["split"],
                              registry=reg)
        # accuracy stays as it was for dashboards; the score is what the run is judged by (--metric)
        self.score = Gauge("megabatch_trainer_score", "Score of the last evaluation by the run's metric "
                           "(accuracy, roc_auc or macro_f1; link prediction: every one of mrr, hits@1, hits@10, "
                           "hits@50 and roc_auc)", ["split", "metric"], registry=reg)
        self.epoch = Gauge("megabatch_trainer_epoch", "Last completed epoch", registry=reg)
        self.data_wait_ratio = Gauge("megabatch_trainer_data_wait_ratio",
                                     "Share of the last epoch's training time spent waiting for data "
                                     "(wait / (wait + step))", registry=reg)
        self.feature_bytes = Counter("megabatch_trainer_feature_bytes",
                                     "Bytes of feature rows (x) of training batches, by origin: shipped in the "
                                     "slot or taken from the trainer's feature cache", ["origin"], registry=reg)
        for origin in ("shipped", "cache"):
            self.feature_bytes.labels(origin)
        self.build_info = Info("megabatch_trainer_build", "Trainer version, model and device", registry=reg)
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, port: int | None, addr: str = "127.0.0.1") -> int | None:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread; the port it listens on (port 0: one the
        kernel picks, so several trainers on one machine need no port plan), or None when ``port`` is None
        (not served). OSError when it cannot listen."""
        if port is None:
            return None
        if self._server is None:
            self._server, self._thread = start_http_server(port, addr, registry=self.registry)
        return int(self._server.server_port)

    @property
    def port(self) -> int | None:
        """The port being served, None when not serving."""
        return None if self._server is None else int(self._server.server_port)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def set_build_info(self, model: str, device: str) -> None:
        self.build_info.info({"version": package_version(), "model": model, "device": device})

    def observe_batch(self, wait_s: float, step_s: float, samples: int) -> None:
        self.batch_wait.observe(wait_s)
        self.data_wait.inc(wait_s)
        self.step.observe(step_s)
        self.samples.inc(samples)

    def observe_features(self, shipped_bytes: int, cached_bytes: int) -> None:
        self.feature_bytes.labels("shipped").inc(shipped_bytes)
        self.feature_bytes.labels("cache").inc(cached_bytes)

    def observe_epoch(self, epoch: int, loss: float, train_acc: float, samples_per_second: float,
                      data_wait_ratio: float) -> None:
        self.epoch.set(epoch)
        self.loss.set(loss)
        self.accuracy.labels(split="train").set(train_acc)
        self.samples_per_second.set(samples_per_second)
        self.data_wait_ratio.set(data_wait_ratio)

    def observe_eval(self, split: str, accuracy: float, metric: str, score: float) -> None:
        """One split's evaluation: its accuracy, and its score by ``metric`` (NaN when undefined)."""
        self.accuracy.labels(split=split).set(accuracy)
        self.score.labels(split=split, metric=metric).set(score)

    def observe_link_epoch(self, epoch: int, loss: float, positives_per_second: float, data_wait_ratio: float,
                           scores: dict[str, dict[str, float]]) -> None:
        """A link-prediction epoch (``--task link``): no accuracy; the samples gauges count training positives,
        and ``scores`` (split -> every link metric's score, NaN when undefined) fills the score gauge."""
        self.epoch.set(epoch)
        self.loss.set(loss)
        self.samples_per_second.set(positives_per_second)
        self.data_wait_ratio.set(data_wait_ratio)
        for split, values in scores.items():
            for metric, score in values.items():
                self.score.labels(split=split, metric=metric).set(score)
