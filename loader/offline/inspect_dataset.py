"""``megabatch inspect``: a summary of a prepared dataset (sizes, degrees, edge-cut, balance)."""

from pathlib import Path
from typing import Any

import numpy as np

from loader.format.aggregates import dataset_cache
from loader.format.dataset import open_dataset
from loader.format.npyio import NpyReader, rows_per_chunk
from loader.format.partition_count import auto_partitions
from proto.sizes import format_size

__all__ = ["partition_advice", "dataset_summary", "format_summary"]


def _stats(values: np.ndarray) -> dict[str, float]:
    if not values.size:
        return {"min": 0, "mean": 0.0, "median": 0.0, "p99": 0.0, "max": 0}
    return {"min": int(values.min()), "mean": float(values.mean()), "median": float(np.median(values)),
            "p99": float(np.percentile(values, 99)), "max": int(values.max())}


def dataset_summary(path: Path | str) -> dict[str, Any]:
    """Everything ``inspect`` prints, as a JSON-ready dict."""
    dataset = open_dataset(path)
    m = dataset.manifest
    in_degree = np.diff(dataset.read("indptr"))
    out_degree = np.zeros(m.num_nodes, dtype=np.int64)
    with NpyReader(dataset.file("indices")) as reader:
        for _start, ids in reader.chunks(rows_per_chunk(16, 64 << 20)):
            out_degree += np.bincount(ids, minlength=m.num_nodes)
    parts = dataset.partitions()
    sizes = parts.num_nodes
    split_sizes = {name: m.splits.of(name) for name in ("train", "val", "test")}
    # a node dataset's summary keeps exactly its keys; a link dataset's adds its task and edge split
    link: dict[str, Any] = {} if m.link is None else {"task": "link", "link": m.link.to_json()}
    cache = dataset_cache(dataset)
    aggregation: dict[str, Any] = {} if cache is None else {"aggregation_cache": cache.to_json()}
    return {
        "path": str(dataset.path), "format_version": m.version, "num_nodes": m.num_nodes,
        "num_edges": m.num_edges, "num_classes": m.num_classes,
        "features": {"dim": m.feat_dim, "dtype": m.feat_dtype.value, "row_bytes": m.row_bytes},
        "index_dtype": m.index_dtype.value,
        "bytes": {"total": sum(e.bytes for e in m.files.values()),
                  **{name: e.bytes for name, e in sorted(m.files.items())}},
        "in_degree": _stats(in_degree), "out_degree": _stats(out_degree),
        "partitioner": m.partitioner.to_json(), "edge_cut": m.edge_cut.to_json(),
        "partitions": {"count": m.num_partitions, "nodes": _stats(sizes),
                       "imbalance": float(sizes.max() / sizes.mean()) if sizes.size else 1.0,
                       "empty": int((sizes == 0).sum())},
        "static_cache": m.static_cache.to_json(), "splits": split_sizes, "source": m.source, **link, **aggregation,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """Human-readable rendering of ``dataset_summary``."""
    s = summary
    deg_in, deg_out, parts = s["in_degree"], s["out_degree"], s["partitions"]
    lines = [
        f"dataset      {s['path']} (format {s['format_version']})",
        f"graph        {s['num_nodes']:,} nodes, {s['num_edges']:,} edges, {s['num_classes']} classes",
        f"features     {s['features']['dim']} x {s['features']['dtype']} ({s['features']['row_bytes']} B/row)",
        f"size         {format_size(s['bytes']['total'])} on disk "
        f"(features {format_size(s['bytes'].get('features.bin', 0))}, "
        f"indices {format_size(s['bytes'].get('indices.npy', 0))} as {s['index_dtype']})",
        f"in-degree    min {deg_in['min']}, mean {deg_in['mean']:.2f}, median {deg_in['median']:.0f}, "
        f"p99 {deg_in['p99']:.0f}, max {deg_in['max']}",
        f"out-degree   min {deg_out['min']}, mean {deg_out['mean']:.2f}, median {deg_out['median']:.0f}, "
        f"p99 {deg_out['p99']:.0f}, max {deg_out['max']}",
        f"partitioner  {s['partitioner']['name']} {s['partitioner'].get('params', {})}",
        f"edge-cut     {s['edge_cut']['edges']:,} edges ({100 * s['edge_cut']['fraction']:.1f}%)",
        f"partitions   {parts['count']}: nodes min {parts['nodes']['min']}, mean {parts['nodes']['mean']:.1f}, "
        f"max {parts['nodes']['max']} (imbalance {parts['imbalance']:.3f}, {parts['empty']} empty)",
        f"static cache {s['static_cache']['num_nodes']:,} nodes (ratio {s['static_cache']['ratio']})",
        f"splits       train {s['splits']['train']:,}, val {s['splits']['val']:,}, test {s['splits']['test']:,}",
    ]
    if "link" in s:
        link = s["link"]
        ratios = "/".join(f"{r:g}" for r in link["edge_split"])
        lines.append(f"link split   {'directed' if link['directed'] else 'undirected'} pairs: train {link['train']:,}, "
                     f"val {link['val']:,}, test {link['test']:,} (ratios {ratios}, seed {link['seed']}); "
                     f"{link['eval_negatives']} negative tails per held-out pair")
    if "aggregation_cache" in s:
        cache = s["aggregation_cache"]
        lines.append(f"aggregation  {cache['kind']} over all in-neighbours ({cache['file']}, "
                     f"{format_size(s['bytes'].get(cache['file'], 0))}; megabatch aggregate)")
    advice = partition_advice(parts["count"], s["num_nodes"], s["bytes"].get("features.bin", 0))
    if advice is not None:
        lines.append(f"advice       {advice}")
    return "\n".join(lines)


def partition_advice(num_partitions: int, num_nodes: int, feature_bytes: int) -> str | None:
    """A hint to prepare again with ``--partitions auto`` where it would make more partitions; None otherwise.

    More, smaller partitions give more random mega-batches at the same fraction (lower label skew,
    faster convergence, ``loader.format.partition_count``), while each partition stays one read.
    """
    advised = auto_partitions(num_nodes, feature_bytes)
    if advised <= num_partitions:
        return None
    return (f"{num_partitions} partitions: a mega-batch of a quarter of them is {max(1, num_partitions // 4)}; "
            f"prepare with --partitions auto ({advised}) for better-mixed mega-batches (lower label skew, faster "
            f"convergence at the same bytes read; each partition a read of "
            f"{format_size(feature_bytes // advised)})")
