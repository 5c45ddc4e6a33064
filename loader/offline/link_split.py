"""The edge split of a link-prediction import (``megabatch import --task link``), out of core.

What it does to a raw dataset being written (docs/FORMAT.md, "Link prediction"), given ratios
(train, val, test) summing to 1, a seed and K:

1. **Pairs.** Self-loops are set aside: they stay in the graph as stored and are never positives (a
   node linked to itself says nothing about which other nodes it links to). The other edges are
   reduced to their pairs by an external sort of ``(min, 2 * max + direction)``, deduplicated, so
   the sorted output says, per unordered pair {u < v}, which of ``u -> v`` and ``v -> u`` are stored.
   The graph is *undirected* when ``--undirected`` was given or every pair is stored both ways; the
   unit of the split is then the pair {u, v}, stored as ``(u, v)``, u < v; else each stored direction
   is a unit of its own. Duplicated edges are one unit: a pair goes to one split with all its copies.
2. **Split.** With M units, val gets ``floor(0.5 + r_val * M)``, test ``floor(0.5 + r_test * M)``
   (at most what val leaves), train the rest. The units, in the sorted order above (by ``(min, max)``,
   ``min -> max`` before ``max -> min``), are dealt in blocks of ``SPLIT_BLOCK_PAIRS`` pairs with the
   generator ``numpy.random.default_rng([seed, 0])``: per block, the counts per split are one
   ``multivariate_hypergeometric(remaining per split, units in block)`` draw and the block's labels
   ``repeat([0, 1, 2], counts)[permutation(units in block)]``: a uniformly random split of exactly
   those sizes, the same for every ``--memory-budget``.
3. **Negatives.** For split ``val`` (stream 1) and ``test`` (stream 2), ``default_rng([seed, stream])``
   draws ``integers(0, N, (rows, K), int64)`` per block of ``max(1, NEGATIVE_BLOCK_VALUES // K)`` rows:
   K uniform tails per positive, not filtered (a tail may be a true neighbour, with probability about
   degree / N, as in OGB's and MariusGNN's uniform negatives), fixed so that runs compare.
4. **Removal.** Every stored edge whose pair is held out (val or test; both directions of an
   undirected pair) is removed from ``edge_src.npy`` / ``edge_dst.npy``; the held-out pairs' keys
   (8 bytes each) are held in memory for that pass.
"""

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loader.format.link import HELD_OUT, RAW_LINK_FILES, LinkSplit, unit_keys
from loader.format.npyio import NpyColumnWriter, NpyReader, NpyWriter, rows_per_chunk
from loader.format.raw import RawDatasetWriter
from loader.offline.extsort import DISTRIBUTE_BYTES_PER_EDGE, external_sort_edges
from proto.errors import UserError
from proto.progress import Progress
from proto.sizes import format_size

__all__ = ["SPLIT_BLOCK_PAIRS", "NEGATIVE_BLOCK_VALUES", "split_sizes", "split_link_edges", "GivenLinkSplit",
           "write_given_split"]

log = logging.getLogger("megabatch")

SPLIT_BLOCK_PAIRS = 1 << 16
"""Pairs dealt per draw of the split (part of the split's definition: it does not follow the budget)."""

NEGATIVE_BLOCK_VALUES = 1 << 20
"""Negative tails drawn per ``integers`` call, in whole rows (part of the negatives' definition)."""

_SPLIT_STREAM, _NEGATIVE_STREAMS = 0, {"val": 1, "test": 2}
_HELD_KEY_BYTES = 16  # a held-out key and its sorted copy


def split_sizes(units: int, ratios: tuple[float, float, float]) -> tuple[int, int, int]:
    """Units per split: val and test rounded to nearest (halves up), train the rest."""
    val = min(units, int(np.floor(0.5 + ratios[1] * units)))
    test = min(units - val, int(np.floor(0.5 + ratios[2] * units)))
    return units - val - test, val, test


def split_link_edges(writer: RawDatasetWriter, num_nodes: int, *, ratios: tuple[float, float, float], seed: int,
                     eval_negatives: int, undirected: bool, budget: int, progress: bool) -> LinkSplit:
    """Split the pairs of the edges ``writer`` holds, write the link files into its directory, remove
    the held-out edges from its graph, and record the split (``writer.set_link``); returns it.

    ``undirected``: the import symmetrized the graph (``--undirected``); without it a graph is
    undirected when it stores every pair both ways.
    """
    writer.finish_edges()
    scratch = writer.scratch
    pair_paths = (scratch / "pair_lo.npy", scratch / "pair_hi.npy", scratch / "pair_dirs.npy")
    try:
        pairs, symmetric = _sorted_pairs(writer.edge_paths, num_nodes, pair_paths, budget, progress)
        directed = not (undirected or symmetric)
        with NpyReader(pair_paths[2]) as reader:
            units = pairs if not directed else sum(int(_popcount(dirs).sum()) for _s, dirs in reader.chunks(1 << 20))
        train, val, test = split_sizes(units, ratios)
        if _HELD_KEY_BYTES * (val + test) > budget:
            raise UserError(f"--memory-budget {format_size(budget)} cannot hold the keys of {val + test:,} held-out "
                            f"pairs ({format_size(_HELD_KEY_BYTES * (val + test))}); raise it or hold out fewer")
        held = _deal(pair_paths, writer.tmp, num_nodes, directed, (train, val, test), seed)
        for path in pair_paths:
            path.unlink()
        for name, count in (("val", val), ("test", test)):
            _write_negatives(writer.tmp / RAW_LINK_FILES[f"{name}_neg_tails"], count, num_nodes, eval_negatives,
                             seed, _NEGATIVE_STREAMS[name])
        removed = _remove_held_out(writer, held, num_nodes, directed, budget, progress)
    finally:
        for path in pair_paths:
            path.unlink(missing_ok=True)
    link = LinkSplit(directed, ratios, seed, eval_negatives, train, val, test)
    log.info("link split: %s graph, %d pairs: train %d, val %d, test %d; %d held-out edges removed from the graph",
             "directed" if directed else "undirected", units, train, val, test, removed)
    writer.set_link(link)
    return link


@dataclass(frozen=True)
class GivenLinkSplit:
    """An input's own edge split (OGB's ``split/<name>/{train,valid,test}.pt``), node ids of the input.

    train, val, test: int64 (2, E) positives, source row 0; val_tails, test_tails: int64 (E, K) each held-out
    positive's negative tails, or None where the input has none per positive (drawn then, as ``--task link``
    draws them); origin: what to name in messages and the raw header.
    """

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    val_tails: np.ndarray | None
    test_tails: np.ndarray | None
    origin: str

    def edges(self, split: str) -> np.ndarray:
        return {"train": self.train, "val": self.val, "test": self.test}[split]

    def tails(self, split: str) -> np.ndarray | None:
        return {"val": self.val_tails, "test": self.test_tails}[split]


def write_given_split(writer: RawDatasetWriter, num_nodes: int, given: GivenLinkSplit, *, seed: int,
                      eval_negatives: int, undirected: bool, budget: int, progress: bool) -> LinkSplit:
    """An input's own split as the link files (``split_link_edges``' outputs): its positives as given, its tails
    where it has them (else ``eval_negatives`` drawn with ``seed``, step 3), the held-out pairs removed from the
    graph (step 4; a graph of the training edges only, as OGB's, loses none). ``undirected`` (``--undirected``):
    a held-out pair is removed in both directions. UserError for ids outside the graph or tails of another shape.
    """
    writer.finish_edges()
    directed = not undirected
    counts = {}
    for name in ("train", *HELD_OUT):
        edges = given.edges(name)
        if edges.ndim != 2 or edges.shape[0] != 2:
            raise UserError(f"{given.origin}: {name} edges of shape {edges.shape}, expected (2, E)")
        if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
            raise UserError(f"{given.origin}: {name} edges hold a node id outside [0, {num_nodes})")
        with NpyColumnWriter(writer.tmp / RAW_LINK_FILES[f"{name}_edges"], np.int64, 2, edges.shape[1]) as out:
            out.append(edges.astype(np.int64, copy=False))
        counts[name] = int(edges.shape[1])
    widths = set()
    for name in HELD_OUT:
        tails = given.tails(name)
        path = writer.tmp / RAW_LINK_FILES[f"{name}_neg_tails"]
        if tails is None:
            _write_negatives(path, counts[name], num_nodes, eval_negatives, seed, _NEGATIVE_STREAMS[name])
            widths.add(eval_negatives)
            continue
        if tails.ndim != 2 or tails.shape[0] != counts[name] or tails.shape[1] < 1:
            raise UserError(f"{given.origin}: {name} tails of shape {tails.shape}, expected ({counts[name]}, K)")
        if tails.min() < 0 or tails.max() >= num_nodes:
            raise UserError(f"{given.origin}: {name} tails hold a node id outside [0, {num_nodes})")
        with NpyWriter(path, np.int64, (tails.shape[1],), nrows=counts[name]) as out:
            out.append(tails.astype(np.int64, copy=False))
        widths.add(int(tails.shape[1]))
    if len(widths) != 1:
        raise UserError(f"{given.origin}: val and test have {sorted(widths)} negative tails per positive; one K for "
                        f"both is expected")
    k = widths.pop()
    held = np.sort(np.concatenate([unit_keys(given.edges(name)[0], given.edges(name)[1], num_nodes, directed)
                                   for name in HELD_OUT]))
    removed = _remove_held_out(writer, held, num_nodes, directed, budget, progress)
    total = max(1, sum(counts.values()))
    shares = (counts["train"] / total, counts["val"] / total, counts["test"] / total)
    link = LinkSplit(directed, shares, seed, k, counts["train"], counts["val"], counts["test"])
    log.info("link split from %s: %s, train %d, val %d, test %d, %d negative tails each; %d held-out edges removed "
             "from the graph", given.origin, "directed" if directed else "undirected", counts["train"],
             counts["val"], counts["test"], k, removed)
    writer.set_link(link)
    return link


def _popcount(dirs: np.ndarray) -> np.ndarray:
    return (dirs & 1) + (dirs >> 1)


def _edge_chunks(paths: tuple[Path, Path], rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    with NpyReader(paths[0], expect_dtype=np.int64, expect_ndim=1) as srcs, \
            NpyReader(paths[1], expect_dtype=np.int64, expect_ndim=1) as dsts:
        for start in range(0, srcs.nrows, max(1, rows)):
            yield srcs.read(start, start + rows), dsts.read(start, start + rows)


def _sorted_pairs(edge_paths: tuple[Path, Path], n: int, out: tuple[Path, Path, Path], budget: int,
                  progress: bool) -> tuple[int, bool]:
    """Write the sorted pairs {lo < hi} with a bit mask of their stored directions (1: lo -> hi,
    2: hi -> lo); return how many, and whether every pair is stored both ways."""
    rows = rows_per_chunk(DISTRIBUTE_BYTES_PER_EDGE, budget, minimum=1024)

    def by_pair() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for src, dst in _edge_chunks(edge_paths, rows):
            keep = src != dst
            src, dst = src[keep], dst[keep]
            # the direction rides in the low bit of the secondary id, so the sort keeps it apart
            yield np.minimum(src, dst), 2 * np.maximum(src, dst) + (src > dst)
            del src, dst, keep

    pairs, symmetric = 0, True
    with NpyWriter(out[0], np.int64) as lo_out, NpyWriter(out[1], np.int64) as hi_out, \
            NpyWriter(out[2], np.uint8) as dirs_out:
        for bucket in external_sort_edges(by_pair, 2 * n, out[0].parent, budget, dedup=True, progress=progress,
                                          step="link split: pairs"):
            if not len(bucket.primary):
                continue
            hi = bucket.secondary >> 1
            first = np.flatnonzero(np.concatenate(([True], (bucket.primary[1:] != bucket.primary[:-1])
                                                   | (hi[1:] != hi[:-1]))))
            dirs = np.bitwise_or.reduceat((1 << (bucket.secondary & 1)).astype(np.uint8), first)
            lo_out.append(bucket.primary[first])
            hi_out.append(hi[first])
            dirs_out.append(dirs)
            pairs += len(first)
            symmetric = symmetric and bool((dirs == 3).all())
    return pairs, symmetric


def _units(lo: np.ndarray, hi: np.ndarray, dirs: np.ndarray, directed: bool) -> tuple[np.ndarray, np.ndarray]:
    """The units of a block of pairs, in order: ``(lo, hi)`` per pair, or each stored direction
    (``lo -> hi`` before ``hi -> lo``)."""
    if not directed:
        return lo, hi
    count = _popcount(dirs).astype(np.int64)
    pair = np.repeat(np.arange(len(lo)), count)
    second = np.arange(len(pair)) - np.repeat(np.cumsum(count) - count, count)
    backward = np.where(dirs[pair] == 3, second == 1, dirs[pair] == 2)
    return np.where(backward, hi[pair], lo[pair]), np.where(backward, lo[pair], hi[pair])


def _deal(pair_paths: tuple[Path, Path, Path], out: Path, n: int, directed: bool, sizes: tuple[int, int, int],
          seed: int) -> np.ndarray:
    """Deal the units into train/val/test files (module docstring, step 2); return the held-out keys, sorted."""
    rng = np.random.default_rng([seed, _SPLIT_STREAM])
    remaining = np.array(sizes, dtype=np.int64)
    held: list[np.ndarray] = []
    names = ("train", *HELD_OUT)
    writers = [NpyColumnWriter(out / RAW_LINK_FILES[f"{name}_edges"], np.int64, 2, size)
               for name, size in zip(names, sizes)]
    try:
        with NpyReader(pair_paths[0]) as los, NpyReader(pair_paths[1]) as his, NpyReader(pair_paths[2]) as dirs:
            for start in range(0, los.nrows, SPLIT_BLOCK_PAIRS):
                stop = start + SPLIT_BLOCK_PAIRS
                src, dst = _units(los.read(start, stop), his.read(start, stop), dirs.read(start, stop), directed)
                counts = rng.multivariate_hypergeometric(remaining, len(src))
                remaining -= counts
                label = np.repeat(np.arange(3), counts)[rng.permutation(len(src))]
                for k, pair_writer in enumerate(writers):
                    mine = label == k
                    pair_writer.append(np.stack((src[mine], dst[mine])))
                    if k:
                        held.append(unit_keys(src[mine], dst[mine], n, directed))
        for pair_writer in writers:
            pair_writer.close()
    finally:
        for pair_writer in writers:
            pair_writer.abort()
    keys = np.concatenate(held) if held else np.empty(0, np.int64)
    keys.sort()
    return keys


def _write_negatives(path: Path, count: int, n: int, k: int, seed: int, stream: int) -> None:
    rng = np.random.default_rng([seed, stream])
    block_rows = max(1, NEGATIVE_BLOCK_VALUES // k)
    with NpyWriter(path, np.int64, (k,), nrows=count) as out:
        for start in range(0, count, block_rows):
            out.append(rng.integers(0, n, size=(min(block_rows, count - start), k), dtype=np.int64))


def _remove_held_out(writer: RawDatasetWriter, held: np.ndarray, n: int, directed: bool, budget: int,
                     progress: bool) -> int:
    """Rewrite the graph without the edges of held-out pairs (input order kept); return how many went."""
    if not len(held):
        return 0
    rows = rows_per_chunk(64, max(1, budget - _HELD_KEY_BYTES * len(held)), minimum=1024)
    kept_src, kept_dst = writer.scratch / "kept_src.npy", writer.scratch / "kept_dst.npy"
    removed = 0
    with NpyReader(writer.edge_paths[0]) as reader:
        total = reader.nrows
    with NpyWriter(kept_src, np.int64) as src_out, NpyWriter(kept_dst, np.int64) as dst_out, \
            Progress("link split: remove held-out edges", total, "edges", enabled=progress) as bar:
        for src, dst in _edge_chunks(writer.edge_paths, rows):
            keys = unit_keys(src, dst, n, directed)
            at = np.minimum(np.searchsorted(held, keys), len(held) - 1)
            keep = held[at] != keys
            src_out.append(src[keep])
            dst_out.append(dst[keep])
            removed += int(len(keep) - np.count_nonzero(keep))
            bar.update(len(src))
    writer.replace_edges(kept_src, kept_dst)
    return removed
