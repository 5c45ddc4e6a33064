"""``megabatch verify``'s checks of a link-prediction dataset (format 1.3, docs/FORMAT.md, "Link prediction").

Shapes and id ranges of the five link files; ``edge_buckets.npy`` against the partitions; the
training positives in edge-bucket order, each an edge of the graph, together every pair of the
graph once; the held-out positives absent from the graph and each pair in one split only. Edge
lists stream in chunks; membership is a binary search of the CSC (``link_kernels.has_edges``)
through a read-only map of ``indices.npy``, as verify's static-cache check reads it.
"""

import numpy as np

from loader.format.dataset import Dataset
from loader.format.link import HELD_OUT, LinkSplit, bucket_ids, bucket_keys, link_file_problems, unit_keys
from loader.format.npyio import NpyReader, rows_per_chunk
from loader.offline.link_kernels import has_edges

__all__ = ["check_link"]

_CHUNK_BYTES = 64 << 20


def check_link(dataset: Dataset) -> list[str]:
    """Problems of a link dataset's files, one line each (empty: they hold); [] for a node dataset."""
    link = dataset.manifest.link
    if link is None:
        return []
    problems = link_file_problems(dataset.file, dataset.manifest.num_nodes, link, _CHUNK_BYTES)
    if problems:
        return problems  # the checks below index by these shapes and ids
    graph = _Graph(dataset)
    return _check_train_edges(dataset, link, graph) + _check_held_out(dataset, link, graph)


class _Graph:
    """The CSC, for edge lookups: ``indptr`` in RAM, ``indices`` mapped."""

    def __init__(self, dataset: Dataset) -> None:
        self.n = dataset.manifest.num_nodes
        self.indptr = dataset.read("indptr", np.int64, 1)
        self.indices_path = dataset.file("indices")
        self.indices = np.load(self.indices_path, mmap_mode="r")
        self.new_to_orig = dataset.read("new_to_orig", np.int64, 1)

    def has(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        out = np.zeros(len(src), dtype=np.bool_)
        has_edges(self.indptr, self.indices, np.ascontiguousarray(src), np.ascontiguousarray(dst), out)
        return out

    def pair_has(self, src: np.ndarray, dst: np.ndarray, directed: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per pair: whether the graph has some / every direction of it (one direction when directed)."""
        forward = self.has(src, dst)
        if directed:
            return forward, forward
        backward = self.has(dst, src)
        return forward | backward, forward & backward

    def unique_pairs(self) -> int:
        """Distinct directed non-loop edges of the graph (the CSC's lists are sorted, so a repeat is adjacent)."""
        count, last_dst, last_src = 0, -1, -1
        with NpyReader(self.indices_path) as reader:
            for start, ids in reader.chunks(rows_per_chunk(32, _CHUNK_BYTES)):
                ids = ids.astype(np.int64)
                dst = np.searchsorted(self.indptr, np.arange(start, start + len(ids)), side="right") - 1
                prev_dst = np.concatenate(([last_dst], dst[:-1]))
                prev_src = np.concatenate(([last_src], ids[:-1]))
                repeat = (dst == prev_dst) & (ids == prev_src)
                count += int(np.count_nonzero(~repeat & (ids != dst)))
                last_dst, last_src = int(dst[-1]), int(ids[-1])
        return count


def _check_train_edges(dataset: Dataset, link: LinkSplit, graph: _Graph) -> list[str]:
    m = dataset.manifest
    parts = dataset.partitions()
    begin, end = parts.node_begin, parts.node_end
    num_buckets = m.num_partitions * m.num_partitions
    offsets = dataset.read("edge_buckets", np.int64, 1)
    if offsets.shape != (num_buckets + 1,):
        return [f"edge_buckets.npy has shape {offsets.shape}, expected ({num_buckets + 1},) for "
                f"{m.num_partitions} partitions"]
    if offsets[0] != 0 or offsets[-1] != link.train or (np.diff(offsets) < 0).any():
        return [f"edge_buckets.npy must rise from 0 to {link.train} (the training positives)"]
    problems: list[str] = []
    counts = np.zeros(num_buckets, dtype=np.int64)
    last_key = -1
    with NpyReader(dataset.file("train_edges"), expect_dtype=np.int64, expect_ndim=2) as reader:
        for start, (src, dst) in reader.column_chunks(rows_per_chunk(64, _CHUNK_BYTES)):
            keys = bucket_keys(src, dst, begin, end, m.num_nodes)
            if keys[0] <= last_key or (np.diff(keys) <= 0).any():
                problems.append(f"train_edges.npy is not in edge-bucket order (partition of source, of target, "
                                f"source, target; no repeats) from column {start} on")
                break
            last_key = int(keys[-1])
            counts += np.bincount(bucket_ids(src, dst, end), minlength=num_buckets)
            if not link.directed and (graph.new_to_orig[src] > graph.new_to_orig[dst]).any():
                problems.append(f"train_edges.npy: an undirected pair from column {start} on is not stored as "
                                "(lower, higher original id)")
                break
            if not graph.pair_has(src, dst, link.directed)[1].all():
                problems.append(f"train_edges.npy: a positive from column {start} on is not an edge of the graph"
                                f"{'' if link.directed else ' in both directions'}")
                break
    if not problems and (counts != np.diff(offsets)).any():
        bucket = int(np.flatnonzero(counts != np.diff(offsets))[0])
        problems.append(f"edge_buckets.npy: bucket ({bucket // m.num_partitions}, {bucket % m.num_partitions}) "
                        f"holds {int(counts[bucket])} edges of those partitions, its offsets say "
                        f"{int(np.diff(offsets)[bucket])}")
    if not problems:
        graph_pairs = graph.unique_pairs() // (1 if link.directed else 2)
        if graph_pairs != link.train:
            problems.append(f"the graph has {graph_pairs} pairs besides self-loops, train_edges.npy {link.train}: "
                            "every pair of the graph is a training positive, once")
    return problems


def _check_held_out(dataset: Dataset, link: LinkSplit, graph: _Graph) -> list[str]:
    problems: list[str] = []
    keys: list[np.ndarray] = []
    for name in HELD_OUT:
        src, dst = dataset.read(f"{name}_edges", np.int64, 2)
        present = graph.pair_has(src, dst, link.directed)[0]
        if present.any():
            at = int(np.flatnonzero(present)[0])
            problems.append(f"{name}_edges.npy: held-out positive {at} ({int(src[at])}, {int(dst[at])}) is an edge of "
                            "the graph (held-out edges must be removed from it)")
        if not link.directed and (graph.new_to_orig[src] > graph.new_to_orig[dst]).any():
            problems.append(f"{name}_edges.npy: an undirected pair is not stored as (lower, higher original id)")
        keys.append(unit_keys(src, dst, graph.n, link.directed))
    every = np.concatenate(keys)
    if len(np.unique(every)) != len(every):
        problems.append("val_edges.npy and test_edges.npy hold a pair twice (within a split or in both)")
    return problems
