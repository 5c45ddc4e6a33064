"""External distribution sort of edge lists by (primary, secondary) node id, in bounded memory.

Two passes over the input: one counts edges per primary id, which fixes bucket boundaries
(ranges of primary ids holding at most a budgeted number of edges); the second appends each
edge's packed key ``primary * N + secondary`` to its bucket's file. Buckets are then loaded,
sorted and emitted in order, so output is globally sorted and a bucket never exceeds memory
(except a single primary id with more edges than a bucket holds, which is sorted alone).
"""

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loader.format.fileio import write_all
from proto.errors import UserError
from proto.progress import Progress

__all__ = ["EdgeChunkSource", "SortedBucket", "external_sort_edges", "SORT_BYTES_PER_EDGE",
           "DISTRIBUTE_BYTES_PER_EDGE"]

EdgeChunkSource = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
"""Returns a fresh iterable of ``(primary, secondary)`` int64 chunks each time it is called."""

SORT_BYTES_PER_EDGE = 64
"""Peak bytes per edge while a bucket is sorted and consumed: the keys (8), the two id arrays
(16), and the consumer's per-edge temporaries (``prepare`` uses up to ~40: partition ids of both
ends, a narrowed copy of the ids, masks). Measured with the step's peak-RSS log lines."""

DISTRIBUTE_BYTES_PER_EDGE = 96
"""Peak bytes per edge while an input chunk is distributed: the raw pair (16), the mapped pair
(16), key (8), bucket id (8), order (8), reordered keys (8), plus the reader's next chunk."""


@dataclass(frozen=True)
class SortedBucket:
    """One run of the sorted output.

    primary_begin/primary_end: the primary-id range this bucket covers; primary, secondary:
    int64 arrays of equal length, sorted by (primary, secondary).
    """

    primary_begin: int
    primary_end: int
    primary: np.ndarray
    secondary: np.ndarray


def _bucket_bounds(counts: np.ndarray, max_edges: int) -> np.ndarray:
    """Primary-id boundaries ``b`` so bucket i covers ``[b[i], b[i+1])`` with <= max_edges edges."""
    n = len(counts)
    cum = np.cumsum(counts)
    total = int(cum[-1]) if n else 0
    targets = np.arange(max_edges, total, max_edges, dtype=np.int64)
    # a boundary after the last id whose cumulative count stays within each target
    cuts = np.searchsorted(cum, targets, side="right")
    bounds = np.unique(np.concatenate(([0], cuts, [n])))
    return bounds.astype(np.int64)


def external_sort_edges(source: EdgeChunkSource, num_nodes: int, scratch: Path, budget_bytes: int, *,
                        dedup: bool = False, progress: bool = True, step: str = "sort edges"
                        ) -> Iterator[SortedBucket]:
    """Yield the edges of ``source`` sorted by (primary, secondary), bucket by bucket.

    ``dedup`` drops repeated (primary, secondary) pairs. Intermediate files live in
    ``scratch`` and are deleted as each bucket is emitted (and on error).
    """
    n = int(num_nodes)
    if n >= 3_037_000_499:
        raise UserError(f"{n} nodes: packed 64-bit edge keys need N < 3.04e9")
    counts = np.zeros(n, dtype=np.int64)
    total = 0
    for primary, _secondary in source():
        counts += np.bincount(primary, minlength=n)
        total += len(primary)
        del primary, _secondary
    max_edges = max(1, budget_bytes // SORT_BYTES_PER_EDGE)
    bounds = _bucket_bounds(counts, max_edges)
    del counts
    nbuckets = len(bounds) - 1
    paths = [scratch / f"bucket-{i:06d}.keys" for i in range(nbuckets)]
    try:
        with Progress(f"{step}: distribute", total, "edges", enabled=progress) as bar:
            for primary, secondary in source():
                keys = primary * n + secondary
                which = np.searchsorted(bounds, primary, side="right") - 1
                order = np.argsort(which, kind="stable")
                keys = keys[order]
                sizes = np.bincount(which, minlength=nbuckets)
                del order, which
                offsets = np.concatenate(([0], np.cumsum(sizes)))
                for bucket in np.flatnonzero(sizes).tolist():
                    fd = os.open(paths[bucket], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    try:
                        write_all(fd, keys[offsets[bucket]:offsets[bucket + 1]])
                    finally:
                        os.close(fd)
                bar.update(len(keys))
                del primary, secondary, keys, offsets  # free before the source reads the next chunk
        with Progress(f"{step}: sort buckets", nbuckets, "buckets", enabled=progress) as bar:
            for bucket in range(nbuckets):
                path = paths[bucket]
                keys = np.fromfile(path, dtype=np.int64) if path.exists() else np.empty(0, np.int64)
                if path.exists():
                    path.unlink()
                keys.sort()
                if dedup and len(keys) > 1:
                    keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
                yield SortedBucket(int(bounds[bucket]), int(bounds[bucket + 1]), keys // n, keys % n)
                bar.update()
    finally:
        for path in paths:
            if path.exists():
                path.unlink()
