"""``megabatch status``: what a running daemon is doing, read from its Prometheus endpoint.

The metrics endpoint already holds every number an operator asks for (epoch, clients, neighbour
coverage and label skew, cache hit ratios, memory), so status is a scrape and a summary: no
control-socket session, which would take a client's slots from a trainer.
"""

import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from proto.errors import UserError
from proto.sizes import counted, format_size

__all__ = ["scrape", "format_status", "metrics_url", "status_fields", "Samples", "PURPOSES"]

Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]

PURPOSES = ("train", "eval", "startup")
"""The ``purpose`` label of the read metrics (``loader.daemon.read_metrics.PURPOSES``; not imported: ``status``
reads a daemon's endpoint and imports nothing of the daemon's)."""
SERVED = ("train", "eval")
KINDS = {"train": ("train",), "eval": ("val", "test")}
"""Which batch kinds (``megabatch_batches_published_total{kind}``) each purpose publishes."""


def metrics_url(config: str | None, url: str | None) -> str:
    """The URL ``--url`` gives, or the one of the daemon whose TOML configuration ``--config`` names."""
    if url is not None:
        return url
    from loader.daemon.config import load_config

    assert config is not None
    metrics = load_config(config).metrics
    if metrics.port <= 0:
        raise UserError(f"{config}: [metrics] port is 0, so the daemon serves no metrics to read")
    return f"http://{metrics.address}:{metrics.port}/metrics"


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """Every sample of the endpoint, keyed by (name, sorted labels)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise UserError(f"cannot read the daemon's metrics at {url}: {reason} (is it running, with [metrics] port "
                        f"set?)") from None
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    except ValueError as err:
        raise UserError(f"{url} is not a Prometheus endpoint: {err}") from None
    if not any(name.startswith("megabatch_") for name, _ in samples):
        raise UserError(f"{url} serves no megabatch metrics: is it the loader daemon's endpoint?")
    return samples


def _get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _ratio(hit: float | None, miss: float | None) -> str:
    if hit is None or miss is None or hit + miss == 0:
        return "-"
    return f"{hit / (hit + miss):.3f}"


def format_status(samples: Samples) -> str:
    """A few lines for a terminal: build, progress, clients, training quality, caches, memory."""
    info = next((dict(labels) for (name, labels) in samples if name == "megabatch_build_info"), {})
    lines = [f"megabatch {info.get('version', '?')}: dataset {info.get('dataset', '?')}, mode {info.get('mode', '?')}"]
    epoch = _get(samples, "megabatch_epoch")
    clients = _get(samples, "megabatch_clients")
    train = _get(samples, "megabatch_batches_published_total", kind="train")
    lines.append(f"epoch {int(epoch) if epoch is not None else '-'}, {counted(int(clients or 0), 'client')}, "
                 f"{int(train or 0):,} training batches published")
    places = sorted(((value, dict(labels).get("trainer", "?")) for (name, labels), value in samples.items()
                     if name == "megabatch_training_queue_position"))
    if places:
        holder = [who for place, who in places if place == 0]
        waiting = [f"{who} ({int(place)})" for place, who in places if place > 0]
        lines.append(f"training: {holder[0] if holder else 'nobody'}"
                     + (f"; waiting: {', '.join(waiting)}" if waiting else ""))
    if info.get("measures_quality") == "true":
        epoch_cov = _get(samples, "megabatch_epoch_neighbour_coverage_ratio")
        epoch_skew = _get(samples, "megabatch_epoch_label_skew")
        excess = _get(samples, "megabatch_epoch_label_skew_excess")
        mb_cov = _get(samples, "megabatch_megabatch_neighbour_coverage_ratio")
        mb_skew = _get(samples, "megabatch_megabatch_label_skew")
        warned = [f"{kind} {int(value)}" for kind in ("coverage", "skew")
                  if (value := _get(samples, "megabatch_quality_warnings_total", kind=kind))]
        done = _get(samples, "megabatch_megabatches_loaded_total")
        last_epoch = "no epoch complete yet" if not epoch_cov and not epoch_skew else (
            f"last epoch: neighbour coverage {epoch_cov:.3f}, label skew {epoch_skew:.3f} "
            f"(+{excess or 0:.3f} beyond chance)")
        lines.append(f"training quality: {last_epoch}; last mega-batch: coverage {mb_cov or 0:.3f}, "
                     f"skew {mb_skew or 0:.3f} ({counted(int(done or 0), 'mega-batch')} loaded)"
                     + (f"; warnings: {', '.join(warned)}" if warned else ""))
    feat = _ratio(_get(samples, "megabatch_feature_cache_lookups_total", result="hit"),
                  _get(samples, "megabatch_feature_cache_lookups_total", result="miss"))
    neigh = _ratio(_get(samples, "megabatch_neighbor_cache_lookups_total", result="hit"),
                   _get(samples, "megabatch_neighbor_cache_lookups_total", result="miss"))
    if feat != "-" or neigh != "-":
        lines.append(f"cache hit ratios: features {feat}, neighbour lists {neigh}")
    rss, budget = _get(samples, "process_resident_memory_bytes"), _get(samples, "megabatch_memory_budget_bytes")
    read = sum(v for (name, _), v in samples.items() if name == "megabatch_disk_read_bytes_total")
    if rss is not None and budget is not None and not math.isnan(rss):
        lines.append(f"memory: resident {format_size(int(rss))} of budget {format_size(int(budget))}; "
                     f"read from disk {format_size(int(read))}")
    amplification = [f"{purpose} {_sum(samples, 'megabatch_disk_read_bytes_total', purpose=purpose) / served:,.2f}x"
                     for purpose in SERVED
                     if (served := _sum(samples, "megabatch_feature_bytes_served_total", purpose=purpose)) > 0]
    if amplification:  # the whole story, rates and latencies included, is in --json and top
        lines.append(f"read amplification since start: {', '.join(amplification)}")
    aggregation = _aggregation(samples)
    if aggregation is not None:
        rows, nbytes, served = aggregation["estimate_rows"], aggregation["estimate_bytes"], aggregation[
            "served_bytes_per_batch"]
        lines.append(f"aggregation cache {'on' if aggregation['enabled'] else 'off'}: a training batch fetches about "
                     f"{rows['without']:,} rows ({format_size(nbytes['without'])}) without it, {rows['with']:,} "
                     f"({format_size(nbytes['with'])}) with it"
                     + (f"; served {format_size(int(served))} per training batch" if served else ""))
    return "\n".join(lines)


def _aggregation(samples: Samples) -> dict[str, Any] | None:
    """The aggregation cache's state, cost model and served bytes per training batch; None without a cache."""
    if _get(samples, "megabatch_aggregation_estimate_rows", cache="with") is None:
        return None  # the estimate's series exist only where the dataset has a cache
    enabled = _get(samples, "megabatch_aggregation_cache_enabled")
    batches = _get(samples, "megabatch_batches_published_total", kind="train") or 0
    served = _sum(samples, "megabatch_feature_bytes_served_total", purpose="train")
    return {"enabled": bool(enabled),
            "estimate_rows": {c: int(_get(samples, "megabatch_aggregation_estimate_rows", cache=c) or 0)
                              for c in ("without", "with")},
            "estimate_bytes": {c: int(_get(samples, "megabatch_aggregation_estimate_bytes", cache=c) or 0)
                               for c in ("without", "with")},
            "served_bytes_per_batch": served / batches if batches else None}


# --- the fields of ``megabatch status --json`` (docs/DEPLOY.md, "megabatch status and top") ---------------------

def _matches(labels: tuple[tuple[str, str], ...], want: Mapping[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(key) == value for key, value in want.items())


def _sum(samples: Samples, name: str, **labels: str) -> float:
    """Every sample of ``name`` whose labels include ``labels``, summed (0 where there is none)."""
    return sum(value for (n, have), value in samples.items() if n == name and _matches(have, labels))


class _Window:
    """Counters over a window: since the daemon started (``basis`` "uptime"), or between two scrapes of one daemon
    process ("interval")."""

    def __init__(self, samples: Samples, previous: Samples | None, seconds: float | None, basis: str) -> None:
        self.samples, self.previous, self.seconds, self.basis = samples, previous, seconds, basis

    def delta(self, name: str, **labels: str) -> float:
        now = _sum(self.samples, name, **labels)
        return now - _sum(self.previous, name, **labels) if self.previous is not None else now

    def rate(self, name: str, **labels: str) -> float | None:
        return self.delta(name, **labels) / self.seconds if self.seconds else None

    def quantile(self, q: float, name: str, **labels: str) -> float | None:
        """``histogram_quantile`` over the window: linear within the bucket the rank falls in (Prometheus's way)."""
        counts: dict[float, float] = {}
        for (n, have), _ in self.samples.items():
            if n == f"{name}_bucket" and _matches(have, labels):
                le = float(dict(have)["le"])
                counts.setdefault(le, self.delta(f"{name}_bucket", le=dict(have)["le"], **labels))
        bounds = sorted(counts)
        if not bounds or counts[bounds[-1]] <= 0:
            return None
        rank = q * counts[bounds[-1]]
        lower, below = 0.0, 0.0
        for le in bounds:
            if counts[le] >= rank:
                if math.isinf(le):
                    return lower  # past the last finite bucket: its bound is all a histogram can say
                within = counts[le] - below
                return lower + (le - lower) * ((rank - below) / within if within > 0 else 1.0)
            lower, below = le, counts[le]
        return lower


def _window(samples: Samples, now: float, previous: tuple[Samples, float] | None) -> _Window:
    started = _get(samples, "process_start_time_seconds")
    if previous is not None:
        before, then = previous
        # the same daemon process (a restart resets its counters): the rates between the two scrapes
        if started is not None and _get(before, "process_start_time_seconds") == started and now > then:
            return _Window(samples, before, now - then, "interval")
    uptime = now - started if started is not None else None
    return _Window(samples, None, uptime if uptime is not None and uptime > 0 else None, "uptime")


def _ratio_of(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def _int_or_none(value: float | None) -> int | None:
    return None if value is None or math.isnan(value) else int(value)


def _clients(samples: Samples) -> list[dict[str, Any]]:
    """``megabatch_client_info``'s series, by session (a series missing a number is another program's: skipped)."""
    found: list[tuple[int, dict[str, Any]]] = []
    for name, labels in samples:
        have = dict(labels)
        if name != "megabatch_client_info":
            continue
        try:
            session = int(have["session"])
            found.append((session, {"session": session, "client": have.get("client", ""), "pid": int(have["pid"]),
                                    "uid": int(have["uid"]), "job": have.get("job", ""), "rank": int(have["rank"])}))
        except (KeyError, ValueError):
            continue
    return [client for _, client in sorted(found, key=lambda item: item[0])]


def status_fields(samples: Samples, *, now: float, previous: tuple[Samples, float] | None = None) -> dict[str, Any]:
    """What ``megabatch status --json`` prints (docs/DEPLOY.md lists every field): from one scrape, taken at Unix
    time ``now``. Rates, amplification, latencies and hit ratios are over the daemon's uptime, or, given the
    ``previous`` scrape and its time, between the two (``megabatch top``'s live view)."""
    info = next((dict(labels) for (name, labels) in samples if name == "megabatch_build_info"), {})
    window = _window(samples, now, previous)
    started = _get(samples, "process_start_time_seconds")
    rss, budget = _get(samples, "process_resident_memory_bytes"), _get(samples, "megabatch_memory_budget_bytes")
    clients = _clients(samples)
    places = sorted((int(value), dict(labels).get("trainer", "?")) for (name, labels), value in samples.items()
                    if name == "megabatch_training_queue_position")
    queues = {dict(labels).get("queue", "?"): {"depth": int(value), "capacity": int(
        _get(samples, "megabatch_queue_capacity", queue=dict(labels).get("queue", "?")) or 0)}
        for (name, labels), value in samples.items() if name == "megabatch_queue_depth"}
    batches = {p: sum(window.delta("megabatch_batches_published_total", kind=k) for k in KINDS[p]) for p in SERVED}
    seeds = {p: sum(window.delta("megabatch_seeds_published_total", kind=k) for k in KINDS[p]) for p in SERVED}
    read = {p: window.delta("megabatch_disk_read_bytes_total", purpose=p) for p in PURPOSES}
    served = {p: window.delta("megabatch_feature_bytes_served_total", purpose=p) for p in SERVED}
    requests = {p: window.delta("megabatch_disk_read_seconds_count", purpose=p) for p in PURPOSES}

    def per_second(value: float) -> float | None:
        return value / window.seconds if window.seconds else None

    def hits(name: str, hit: tuple[str, ...], other: tuple[str, ...]) -> float | None:
        found = sum(window.delta(name, result=r) for r in hit)
        return _ratio_of(found, found + sum(window.delta(name, result=r) for r in other))

    quality = None
    if info.get("measures_quality") == "true":
        quality = {key: _get(samples, f"megabatch_{key}") for key in (
            "epoch_neighbour_coverage_ratio", "epoch_label_skew", "epoch_label_skew_excess",
            "megabatch_neighbour_coverage_ratio", "megabatch_label_skew")}
    return {
        "version": info.get("version"), "dataset": info.get("dataset"), "mode": info.get("mode"),
        "uptime_seconds": now - started if started is not None else None,
        "epoch": _int_or_none(_get(samples, "megabatch_epoch")),
        "memory": {"budget_bytes": _int_or_none(budget),
                   "plan_bytes": _int_or_none(_get(samples, "megabatch_memory_plan_bytes")),
                   "resident_bytes": _int_or_none(rss),
                   "resident_over_budget_bytes": _int_or_none(rss - budget) if rss is not None and budget is not None
                   else None,
                   "static_cache_bytes": _int_or_none(_get(samples, "megabatch_static_cache_bytes")),
                   "feature_cache_bytes": _int_or_none(_get(samples, "megabatch_feature_cache_bytes")),
                   "neighbor_cache_bytes": _int_or_none(_get(samples, "megabatch_neighbor_cache_bytes"))},
        "clients": clients,
        "training": {"holder": next((who for place, who in places if place == 0), None),
                     "waiting": [{"trainer": who, "place": place} for place, who in places if place > 0]},
        "slots": {"in_use": _int_or_none(_get(samples, "megabatch_slots_in_use")),
                  "capacity": _int_or_none(_get(samples, "megabatch_slots_capacity"))},
        "queues": queues,
        "window": {"basis": window.basis, "seconds": window.seconds},
        "rates": {"batches_per_second": {p: per_second(batches[p]) for p in SERVED},
                  "samples_per_second": {p: per_second(seeds[p]) for p in SERVED},
                  "disk_read_bytes_per_second": {**{p: per_second(read[p]) for p in PURPOSES},
                                                 "total": per_second(sum(read.values()))}},
        "read_amplification": {p: _ratio_of(read[p], served[p]) for p in SERVED},
        "read_latency_seconds": {p: {"requests": int(requests[p]),
                                     "mean": _ratio_of(window.delta("megabatch_disk_read_seconds_sum", purpose=p),
                                                       requests[p]),
                                     "p50": window.quantile(0.5, "megabatch_disk_read_seconds", purpose=p),
                                     "p99": window.quantile(0.99, "megabatch_disk_read_seconds", purpose=p)}
                                 for p in PURPOSES},
        "cache_hit_ratios": {
            "features": hits("megabatch_feature_cache_lookups_total", ("hit", "resident"), ("miss",)),
            "neighbour_lists": hits("megabatch_neighbor_cache_lookups_total", ("hit",), ("miss",)),
            "client_caches": hits("megabatch_trainer_cache_rows_total", ("hit",), ("shipped",))},
        "totals": {"batches": {k: int(_sum(samples, "megabatch_batches_published_total", kind=k))
                               for k in ("train", "val", "test")},
                   "samples": {k: int(_sum(samples, "megabatch_seeds_published_total", kind=k))
                               for k in ("train", "val", "test")},
                   "disk_read_bytes": {p: int(_sum(samples, "megabatch_disk_read_bytes_total", purpose=p))
                                       for p in PURPOSES},
                   "feature_bytes_served": {p: int(_sum(samples, "megabatch_feature_bytes_served_total", purpose=p))
                                            for p in SERVED}},
        "quality": quality,
        "aggregation": _aggregation(samples),
    }
