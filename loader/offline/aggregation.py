"""BatchGNN's input feature aggregation cache, built offline: ``megabatch aggregate DATASET --kind mean``.

Every node's input features aggregated once over *all* its in-neighbours (sum, mean, or GCN's
``D^-1/2 (A + I) D^-1/2`` row with the global degrees), stored beside the features in the same layout
(``aggregates-KIND.bin``: the partitions' rows at features.bin's offsets, in its dtype) with block read
checks (``aggregate-blocks-KIND.npy``, features.bin's check block). A first GNN layer can then read one
aggregated row per node of hop L-1 instead of sampling hop L and fetching its rows: on [10, 5] fanouts
hop 2 holds most of a batch's nodes, so for an out-of-core loader the cache is first of all a cut in
bytes per batch, when ``loader.format.aggregates.aggregation_bytes`` says it is one (BatchGNN, seed 003,
Appendix C: with the cache a batch fetches two rows, x and x_agg, for each node of hops 0..L-1, without it
one row for each node of hops 0..L; it pays when hop L holds more nodes than hops 0..L-1 together).

The build streams destination nodes in chunks sized to ``--memory-budget``, reading each chunk's
in-edges and its neighbours' rows through the page cache (an offline pass, like prepare's), writes the
file under a temporary name, fsyncs and renames it, then publishes it by rewriting manifest.json
atomically (section ``aggregation_cache``, and the new files' checksums in ``files``): a dataset holds
the previous cache, or the new one, never half of one. ``megabatch train --mode inmemory --aggregation-cache``
reads it; the daemon does not serve it yet (docs/FORMAT.md, "Aggregation cache").
"""

import logging
import os
from pathlib import Path

import numpy as np

from loader.format.aggregates import SECTION, AggregationCache, aggregation_files, node_row_starts
from loader.format.dataset import Dataset, FileEntry, manifest_text, open_dataset
from loader.format.fileio import file_xxh3, write_all
from loader.format.read_checks import PAGE_BYTES, file_block_checksums
from loader.offline.aggregation_kernels import KIND_CODES, aggregate_chunk, kernel_features
from proto.atomic import atomic_file, fsync_directory, io_error
from proto.errors import UserError
from proto.progress import Progress
from proto.sizes import format_size

__all__ = ["KINDS", "build_aggregation_cache"]

KINDS = tuple(KIND_CODES)
log = logging.getLogger("megabatch.aggregate")


def build_aggregation_cache(path: Path | str, kind: str, memory_budget: int, *, progress: bool = False
                            ) -> AggregationCache:
    """Aggregate ``path``'s features with ``kind`` ("sum", "mean" or "gcn") and publish the cache in its
    manifest (replacing a cache of another kind). Raises ``UserError`` in one line on bad input."""
    if kind not in KIND_CODES:
        raise UserError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    dataset = open_dataset(path)
    m = dataset.manifest
    if dataset.feature_codec() is not None:
        raise UserError(f"{dataset.path}: features stored as 8-bit codes (uint8) cannot be aggregated into the "
                        f"cache's rows of the same dtype; prepare with --feat-dtype float32 or float16 for it")
    dtype = np.dtype(m.feat_dtype.value)
    dim, n = m.feat_dim, m.num_nodes
    indptr = dataset.read("indptr", np.int64, 1)
    in_degree = np.diff(indptr)
    row_start = node_row_starts(dataset)
    held = indptr.nbytes + in_degree.nbytes + row_start.nbytes
    per_row = dim * (4 + dtype.itemsize)  # the float32 accumulator and its cast
    rows = (memory_budget - held) // per_row
    if rows < 1:
        raise UserError(f"--memory-budget {format_size(memory_budget)} is too small: aggregating {n:,} nodes needs "
                        f"{format_size(held + per_row)} at least")
    rows = int(min(rows, n))
    data_name, checks_name = aggregation_files(kind)
    features, half = kernel_features(np.memmap(dataset.file("features"), dtype=dtype, mode="r"))
    indices = np.load(dataset.file("indices"), mmap_mode="r")
    parts = dataset.partitions()
    target = dataset.path / data_name
    log.info("aggregate %s: %s of %d nodes x %d, chunks of %d rows", dataset.path, kind, n, dim, rows)
    try:
        with atomic_file(target) as out, Progress(f"aggregate ({kind})", n, "nodes", enabled=progress) as bar:
            fd = out.fileno()
            os.ftruncate(fd, dataset.file("features").stat().st_size)  # the same layout, padding included
            for begin in range(0, n, rows):
                end = min(n, begin + rows)
                acc = np.zeros((end - begin, dim), dtype=np.float32)
                aggregate_chunk(indptr, indices[indptr[begin]:indptr[end]], int(indptr[begin]), begin, end, features,
                                row_start, dim, in_degree, KIND_CODES[kind], acc, half)
                cast = acc.astype(dtype)
                if dtype != np.float32 and not np.isfinite(cast).all():
                    raise UserError(f"the {kind} aggregate of a node in {begin}..{end - 1} overflows {dtype.name}; "
                                    f"use --kind mean, or prepare float32 features")
                first = int(np.searchsorted(parts.node_end, begin, side="right"))
                last = int(np.searchsorted(parts.node_begin, end, side="left"))
                for p in range(first, last):  # the chunk's rows are contiguous within each partition
                    lo, hi = max(begin, int(parts.node_begin[p])), min(end, int(parts.node_end[p]))
                    offset = int(parts.feat_offset[p]) + (lo - int(parts.node_begin[p])) * dim * dtype.itemsize
                    write_all(fd, cast[lo - begin:hi - begin], offset)
                bar.update(end - begin)
        block = m.feature_check_block or PAGE_BYTES
        with Progress(f"block checksums {data_name}", target.stat().st_size, "B", enabled=progress) as bar:
            sums = file_block_checksums(target, block, bar)
        with atomic_file(dataset.path / checks_name) as out:
            np.save(out, sums)
        cache = AggregationCache(kind, data_name, checks_name, block)
        _publish(dataset, cache)
    except OSError as err:
        raise io_error(err, f"writing the aggregation cache of {dataset.path}") from err
    return cache


def _publish(dataset: Dataset, cache: AggregationCache) -> None:
    """Rewrite manifest.json with ``cache`` (the commit point), then remove another kind's files."""
    data = dataset.manifest.to_json()
    previous = data.get(SECTION)
    files = dict(dataset.manifest.files)
    stale: list[str] = []
    if isinstance(previous, dict):
        stale = [str(previous.get(key)) for key in ("file", "checks")
                 if previous.get(key) not in (cache.file, cache.checks)]
        for name in stale:
            files.pop(name, None)
    for name in (cache.file, cache.checks):
        path = dataset.path / name
        files[name] = FileEntry(path.stat().st_size, file_xxh3(path))
    data["files"] = {name: {"bytes": e.bytes, "xxh3_64": e.xxh3_64} for name, e in sorted(files.items())}
    data[SECTION] = cache.to_json()
    with atomic_file(dataset.path / "manifest.json", "w") as out:
        out.write(manifest_text(data))
    for name in stale:
        (dataset.path / name).unlink(missing_ok=True)
    fsync_directory(dataset.path)
