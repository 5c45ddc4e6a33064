"""``megabatch status``: what a running daemon is doing, read from its Prometheus endpoint.

The metrics endpoint already holds every number an operator asks for (epoch, clients, neighbour
coverage and label skew, cache hit ratios, memory), so status is a scrape and a summary: no
control-socket session, which would take a client's slots from a trainer.
"""

import math
import urllib.error
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from proto.errors import UserError
from proto.sizes import counted, format_size

__all__ = ["scrape", "format_status"]

Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


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
    if info.get("mode") == "hierarchical":
        epoch_cov = _get(samples, "megabatch_epoch_neighbour_coverage_ratio")
        epoch_skew = _get(samples, "megabatch_epoch_label_skew")
        mb_cov = _get(samples, "megabatch_megabatch_neighbour_coverage_ratio")
        mb_skew = _get(samples, "megabatch_megabatch_label_skew")
        warned = [f"{kind} {int(value)}" for kind in ("coverage", "skew")
                  if (value := _get(samples, "megabatch_quality_warnings_total", kind=kind))]
        done = _get(samples, "megabatch_megabatches_loaded_total")
        last_epoch = "no epoch complete yet" if not epoch_cov and not epoch_skew else (
            f"last epoch: neighbour coverage {epoch_cov:.3f}, label skew {epoch_skew:.3f}")
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
    return "\n".join(lines)
